"""Which streams share a threadblock over the SM budget: the writer's two pairings, and the
engine timing both files (issue 18; docs/synthesis.md, "h800-rail-64 against the bound")."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan, make_cluster

from ccltune.api.cluster import ClusterTopology
from ccltune.model.evaluate import published_estimate
from ccltune.model.formats.msccl.limits import MAX_STEPS
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import (
    MscclFormatError,
    MscclLowering,
    lower_msccl,
)
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.synth import timed
from ccltune.synth.engine import synthesize
from ccltune.synth.grid import evaluation_order

MiB = 1 << 20


def _variants(topo: ClusterTopology, coll: str) -> tuple[dict[str, ScheduleArrays], int]:
    res = synthesize(topo, coll, [64 * MiB], evaluate=False)
    return res.schedules, res.max_threadblocks


def _lowered(arr: ScheduleArrays, budget: int, pairing: str,
             order: str = "depth") -> MscclLowering | None:  # fmt: skip
    try:
        low = lower_msccl(arr.to_schedule(), max_threadblocks=budget, pairing=pairing,
                          order=order)  # fmt: skip
        low.require(max_threadblocks=budget)
    except MscclFormatError:
        return None
    return low


def test_unknown_pairing_is_refused() -> None:
    arrs, _ = _variants(make_cluster(4, 4), "allgather")
    with pytest.raises(ValueError, match="pairing"):
        lower_msccl(next(iter(arrs.values())).to_schedule(), pairing="greedy")


@pytest.mark.parametrize(("gpus", "servers", "coll"), [
    (8, 4, "allgather"), (8, 2, "allgather"), (8, 4, "reducescatter"), (4, 4, "allreduce"),
])  # fmt: skip
def test_balanced_files_run_and_keep_the_busiest_threadblock_short(gpus: int, servers: int,
                                                                   coll: str) -> None:  # fmt: skip
    """Every variant the balanced pairing lowers within the budget runs under msccl-executor's
    FIFO semantics (no deadlock at the largest size, where a Simple FIFO holds 2 chunks) and
    delivers what the collective must (the reader proves both, on each file that differs from
    the forwarding pairing's); it pairs the streams differently somewhere, and its busiest
    threadblock is shorter on at least one variant."""
    arrs, budget = _variants(make_cluster(gpus, servers), coll)
    differ = shorter = 0
    for label, arr in arrs.items():
        fwd = _lowered(arr, budget, "forwarding")
        bal = _lowered(arr, budget, "balanced")
        if bal is None:
            continue
        assert bal.threadblocks <= budget
        if fwd is not None and fwd.tb_meta == bal.tb_meta:
            continue  # the same file
        read_msccl(render_lowering(bal, name=label, proto="Simple", nchannels=arr.channels))
        differ += 1
        shorter += fwd is None or bal.max_steps < fwd.max_steps
    assert differ and shorter, (differ, shorter)


def test_balanced_pairing_fits_a_schedule_forwarding_cannot() -> None:
    """2 servers of 8 GPUs at 8 threadblocks: the deepest relay pipeline needs 80 steps in a
    threadblock paired by forwarding (the executor holds 64); paired heavy with light it fits."""
    arrs, budget = _variants(make_cluster(8, 2), "allgather")
    rescued = [lb for lb, arr in arrs.items() if _lowered(arr, budget, "forwarding") is None
               and (low := _lowered(arr, budget, "balanced")) is not None
               and low.max_steps <= MAX_STEPS]  # fmt: skip
    assert rescued


def test_engine_times_both_pairings_and_publishes_the_faster(tmp_path: Path) -> None:
    """At each grid size the engine's file finalists are timed with both pairings, each in the
    schedule's time order (keys from the largest size) where that gives a file, else "early";
    the size's estimate is the fastest file's, which is the file written (read back: the
    same time)."""
    topo = make_cluster(8, 4)
    sizes = [64 * MiB, 1 << 30]
    res = synthesize(topo, "allgather", sizes, out_dir=tmp_path)
    budget = res.max_threadblocks
    for sr in res.sizes:
        assert not sr.chosen.startswith("nccl:"), sr.reason
        base = timed.schedule_label(sr.chosen)
        arr = res.schedules[base]
        keys = timed.key_times(arr, topo, Router(topo), sizes[-1])
        times, early = {}, {}
        for pairing in ("forwarding", "balanced"):
            low = _lowered(arr, budget, pairing, "early")
            assert low is not None
            xml = render_lowering(low, name=base, proto=sr.protocol, nchannels=arr.channels)
            early[pairing] = published_estimate("allgather", sr.size_bytes, topo, xml).time_us
            by_time = timed.timed_lowering(arr, budget, pairing, keys)  # as the engine does
            if by_time is not None:
                xml = render_lowering(by_time, name=base, proto=sr.protocol,
                                      nchannels=arr.channels)  # fmt: skip
            times[timed.file_label(base, pairing, by_time is not None)] = published_estimate(
                "allgather", sr.size_bytes, topo, xml).time_us
        assert early["forwarding"] != early["balanced"]  # the twin was worth timing here
        assert sr.estimate.time_us == pytest.approx(min(times.values()))
        assert times[sr.chosen] == min(times.values())
    for rr in res.ranges:
        assert rr.xml_file is not None
        text = Path(rr.xml_file).read_text()
        for sr in rr.sizes:
            got = published_estimate("allgather", sr.size_bytes, topo, text).time_us
            assert got == pytest.approx(sr.estimate.time_us)


def test_balanced_files_pass_the_executors_own_parser(tmp_path: Path) -> None:
    """msccl-executor-nccl's parser and selection (the conformance kit) on balanced files: the
    one forwarding cannot fit and the shortened 4-server pipeline."""
    files = tmp_path / "msccl"
    files.mkdir()
    n = 0
    for gpus, servers in ((8, 2), (8, 4)):
        arrs, budget = _variants(make_cluster(gpus, servers), "allgather")
        label, low = max(((lb, low) for lb, arr in arrs.items()
                          if (low := _lowered(arr, budget, "balanced")) is not None),
                         key=lambda x: x[1].max_steps)  # fmt: skip
        lo = 64 * MiB
        text = render_lowering(low, name=label, proto="Simple", nchannels=arrs[label].channels,
                               min_bytes=lo, max_bytes=lo * 16)  # fmt: skip
        (files / f"ag-{gpus}x{servers}.xml").write_text(text)
        n += 1
    out = check_plan(tmp_path)
    assert out.count("PASS msccl/") == 2 * n, out


def test_a_size_between_two_different_files_is_timed_as_the_file_published() -> None:
    """Between two grid sizes whose winning files differ, the engine's schedule times would
    rank the two by schedule, not by file (a file can be 10% off its schedule): both files
    are timed there, and the estimate is the read-back time of the file that size gets."""
    topo = make_cluster(4, 4)
    sizes = [1 << k for k in range(10, 31)]
    res = synthesize(topo, "allgather", sizes)
    grid = evaluation_order(len(sizes))[0]
    texts: dict[tuple[str, str], str] = {}
    between = 0
    for i, sr in enumerate(res.sizes):
        if i in grid:
            continue
        lo, hi = (res.sizes[max(j for j in grid if j < i)], res.sizes[min(j for j in grid if j > i)])
        ends = {(lo.chosen, lo.protocol), (hi.chosen, hi.protocol)}
        if len(ends) < 2 or any(c.startswith("nccl:") for c, _ in ends):
            continue
        between += 1
        assert (sr.chosen, sr.protocol) in ends or sr.chosen.startswith("nccl:")
        if sr.chosen.startswith("nccl:"):
            continue
        key = (sr.chosen, sr.protocol)
        if key not in texts:
            arr = res.schedules[timed.schedule_label(sr.chosen)]
            pairing = timed.pairing_of(sr.chosen)
            if timed.is_timed(sr.chosen):
                keys = timed.key_times(arr, topo, Router(topo), sizes[-1])
                low = timed.timed_lowering(arr, res.max_threadblocks, pairing, keys)
                assert low is not None
            else:
                low = lower_msccl(arr.to_schedule(), max_threadblocks=res.max_threadblocks,
                                  pairing=pairing, order="early")  # fmt: skip
            texts[key] = render_lowering(low, name="x", proto=sr.protocol,
                                         nchannels=arr.channels)  # fmt: skip
        got = published_estimate("allgather", sr.size_bytes, topo, texts[key]).time_us
        assert got == pytest.approx(sr.estimate.time_us)
    assert between, "no size lay between two different files: the test proves nothing"
