"""Steps ordered "early" within a threadblock (writer `_sends_early`, docs/synthesis.md "Both
pairings timed"): on syccl-a800-16 every GPU pairs each peer's send and receive stream in one
of its 8 threadblocks, and in key order each send waited for the receive before it."""

from __future__ import annotations

import pytest

from ccltune.api.common import Collective
from ccltune.model.cost.sm_bound import budget_bound_us
from ccltune.model.formats.msccl import writer
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import ORDERS, MscclFormatError, lower_msccl
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.synth.engine import synthesize
from ccltune.synth.grid import file_time
from ccltune.topology.presets import load_preset

MIB = 1 << 20
BUDGET = 8  # NCCL's channel count on syccl-a800-16


def variants(coll: str) -> dict[str, ScheduleArrays]:
    res = synthesize(load_preset("syccl-a800-16"), coll, [64 * MIB], evaluate=False)
    assert res.max_threadblocks == BUDGET
    return res.schedules


MIX = "mix(2 columns: spread:leaf > spread:nvswitch | spread:nvswitch > spread:leaf)/p1x1"


def test_early_order_takes_the_mix_file_to_its_schedule() -> None:
    topo = load_preset("syccl-a800-16")
    arr = variants("allgather")[MIX]
    router = Router(topo)
    times = {}
    for order in (o for o in ORDERS if o != "timed"):  # timed: test_synth_rail_timed.py
        low = lower_msccl(arr.to_schedule(), max_threadblocks=BUDGET, order=order)
        low.require(max_threadblocks=BUDGET)
        assert low.order == order  # sends were moved, and the result does not deadlock
        text = render_lowering(low, name=order, proto="Simple", nchannels=arr.channels)
        got = file_time(Collective.ALLGATHER, 64 * MIB, topo, router, text)
        assert isinstance(got, float), got
        times[order] = got
    # depth order: 720.5 us; early: 664.7 (the engine's schedule: 647.3; simulated)
    assert times["early"] < 0.95 * times["depth"]


def test_allgather_at_64m_is_within_90_percent_of_the_budget_bound() -> None:
    topo = load_preset("syccl-a800-16")
    res = synthesize(topo, "allgather", [64 * MIB], workers=1)
    (sr,) = res.sizes
    assert not sr.chosen.startswith("nccl:"), sr.reason
    bound = budget_bound_us(Collective.ALLGATHER, 64 * MIB, topo, res.max_threadblocks,
                            sr.bound_us)  # fmt: skip
    assert bound / sr.estimate.time_us >= 0.90


def test_an_early_order_that_would_deadlock_is_lowered_in_depth_order() -> None:
    # The ReduceScatter mix, forwarding pairing: moving its sends ahead deadlocks in the
    # executor's FIFO model (gpu 0 tb 6 waits for a FIFO slot while tb 0 waits for it).
    arr = variants("reducescatter")[MIX]
    sched = arr.to_schedule()
    early = writer._split_lowering(sched, BUDGET, writer.MAX_STEPS, "forwarding", "early")
    assert early.order == "early"
    assert writer._deadlocks(early)
    text = render_lowering(early, name="early", proto="Simple", nchannels=arr.channels)
    with pytest.raises(MscclFormatError, match="deadlock"):
        read_msccl(text)
    low = lower_msccl(sched, max_threadblocks=BUDGET, order="early")
    assert low.order == "depth"
    read_msccl(render_lowering(low, name="depth", proto="Simple", nchannels=arr.channels))


@pytest.mark.parametrize("coll", ["allgather", "reducescatter"])
def test_every_early_lowering_reads_back_proven(coll: str) -> None:
    # read_msccl runs the file under the executor's blocking rules and replays every chunk:
    # moved sends still meet their receives and move the right data.
    for label, arr in variants(coll).items():
        for pairing in writer.PAIRINGS:
            try:
                low = lower_msccl(arr.to_schedule(), max_threadblocks=BUDGET, pairing=pairing,
                                  order="early")  # fmt: skip
                low.require(max_threadblocks=BUDGET)
            except MscclFormatError:
                continue  # over the step limit: never written
            read_msccl(render_lowering(low, name=label, proto="Simple", nchannels=arr.channels))
