"""Files whose threadblocks run their steps in the engine schedule's time order (writer order
"timed", synth/timed.py; issue 18, docs/synthesis.md "Steps in the schedule's time order")."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan, make_cluster

from ccltune.api.cluster import ClusterTopology
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.evaluate import published_estimate
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import (
    PAIRINGS,
    MscclFormatError,
    MscclLowering,
    lower_msccl,
)
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth import timed
from ccltune.synth.engine import synthesize

MiB = 1 << 20
VARIANTS_READ = 3  # reading a 16-rank file back costs ~1 s


def _variants(topo: ClusterTopology, coll: str) -> tuple[dict[str, ScheduleArrays], int]:
    res = synthesize(topo, coll, [64 * MiB], evaluate=False)
    return res.schedules, res.max_threadblocks


def _file_us(coll: str, arr: ScheduleArrays, low: MscclLowering, topo: ClusterTopology,
             size: int) -> float:  # fmt: skip
    text = render_lowering(low, name="x", proto="Simple", nchannels=arr.channels)
    return published_estimate(coll, size, topo, text).time_us


def test_times_go_with_the_timed_order_only() -> None:
    arrs, _ = _variants(make_cluster(4, 4), "allgather")
    sch = next(iter(arrs.values())).to_schedule()
    zeros = ([0.0] * len(sch.transfers), [1.0] * len(sch.transfers))
    with pytest.raises(ValueError, match="times"):
        lower_msccl(sch, order="timed")
    with pytest.raises(ValueError, match="times"):
        lower_msccl(sch, order="early", times=zeros)


def test_times_that_are_no_dependency_order_give_the_early_file() -> None:
    """A transfer keyed before a dependency finished, or a connection whose receives would not
    meet its sends in order, is no file the executor can keep: the writer lowers "early"."""
    topo = make_cluster(4, 4)
    arrs, budget = _variants(topo, "allgather")
    arr = next(iter(arrs.values()))
    sch = arr.to_schedule()
    start, finish = timed.key_times(arr, topo, Router(topo), 64 * MiB)
    ok = lower_msccl(sch, max_threadblocks=budget, order="timed", times=(start, finish))
    assert ok.order == "timed"
    backwards = ([-x for x in finish], [-x for x in start])  # every dependency reversed
    low = lower_msccl(sch, max_threadblocks=budget, order="timed", times=backwards)
    assert low.order != "timed"
    early = lower_msccl(sch, max_threadblocks=budget, order="early")
    same = render_lowering(early, name="x", proto="Simple")
    assert render_lowering(low, name="x", proto="Simple") == same
    # two transfers of one connection that finish in the other order than they start
    by_conn: dict[tuple[int, int, int], list[int]] = {}
    for t, tr in enumerate(sch.transfers):
        by_conn.setdefault((tr.src, tr.dst, tr.channel), []).append(t)
    a, b = next(ts for ts in by_conn.values() if len(ts) > 1)[:2]
    if start[a] > start[b]:
        a, b = b, a
    crossed = list(finish)
    crossed[a] = finish[b] + 1.0  # a finishes after b, though it started first
    assert lower_msccl(sch, max_threadblocks=budget, order="timed",
                       times=(start, crossed)).order != "timed"  # fmt: skip


@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "allreduce"])
def test_timed_files_deliver_the_collective(coll: str) -> None:
    """The first variants' time-ordered files, with either pairing, run under msccl-executor's
    FIFO semantics and deliver what the collective must (the reader proves both)."""
    topo = make_cluster(8, 2)
    arrs, budget = _variants(topo, coll)
    router = Router(topo)
    made = 0
    for label, arr in list(arrs.items())[:VARIANTS_READ]:
        keys = timed.key_times(arr, topo, router, 64 * MiB)
        for pairing in PAIRINGS:
            low = timed.timed_lowering(arr, budget, pairing, keys)
            if low is None:
                continue
            read_msccl(render_lowering(low, name=label, proto="Simple", nchannels=arr.channels))
            made += 1
    assert made


def test_a_timed_file_runs_at_its_schedules_time_where_early_does_not() -> None:
    """Where the "early" file waits on receives its sends do not need, the time-ordered file of
    the same schedule runs at the schedule's own time: on 4 servers of 8 GPUs (AllGather,
    64 MiB) some variant's early file is >= 10% over its schedule and its timed file within
    1% of it. Neither order wins everywhere, which is why the engine times both."""
    topo = make_cluster(8, 4)
    router = Router(topo)
    size = 64 * MiB
    arrs, budget = _variants(topo, "allgather")
    g = nccl_graph(topo)
    cost = protocol_cost("Simple", link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
    closed = 0
    for arr in arrs.values():
        schedule_us = simulate(arr, topo, size, cost, router, engine="symmetric").time_us
        keys = timed.key_times(arr, topo, router, size)
        for pairing in PAIRINGS:
            try:
                early = lower_msccl(arr.to_schedule(), max_threadblocks=budget, pairing=pairing,
                                    order="early")  # fmt: skip
                early.require(max_threadblocks=budget)
            except MscclFormatError:
                continue
            low = timed.timed_lowering(arr, budget, pairing, keys)
            if low is None:
                continue
            was = _file_us("allgather", arr, early, topo, size)
            now = _file_us("allgather", arr, low, topo, size)
            closed += was >= 1.1 * schedule_us and now <= 1.01 * schedule_us
    assert closed


def test_timed_file_passes_the_executors_own_parser(tmp_path: Path) -> None:
    """msccl-executor-nccl's parser and selection (the conformance kit) on time-ordered files
    of each collective the engine writes them for."""
    files = tmp_path / "msccl"
    files.mkdir()
    n = 0
    topo = make_cluster(8, 2)
    router = Router(topo)
    for coll in ("allgather", "reducescatter", "allreduce"):
        arrs, budget = _variants(topo, coll)
        for label, arr in arrs.items():
            low = timed.timed_lowering(arr, budget, "balanced",
                                       timed.key_times(arr, topo, router, 64 * MiB))  # fmt: skip
            if low is None:
                continue
            text = render_lowering(low, name=label, proto="Simple", nchannels=arr.channels,
                                   min_bytes=64 * MiB, max_bytes=1 << 30)  # fmt: skip
            (files / f"{coll}.xml").write_text(text)
            n += 1
            break
    assert n == 3
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert out.count("PASS msccl/") == 2 * n, out  # loaded, and selected over its sizes


def test_file_labels_name_the_schedule_pairing_and_order() -> None:
    base = "spread:rail > spread:nvswitch/p1x4"
    for pairing in PAIRINGS:
        for by_time in (False, True):
            name = timed.file_label(base, pairing, by_time)
            assert timed.schedule_label(name) == base
            assert timed.pairing_of(name) == pairing
            assert timed.is_timed(name) == by_time
    assert timed.file_label(base, "forwarding", False) == base
