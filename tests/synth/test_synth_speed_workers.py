"""`workers` > 1 runs NCCL's reference beside synthesis: every number and file stays the same."""

from __future__ import annotations

import mmap
import multiprocessing
import os
from pathlib import Path

import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model.sim.routing import Router
from ccltune.synth import engine, grid, side
from ccltune.synth.engine import SynthesisResult, synthesize

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 26, 1 << 28]


def _numbers(res: SynthesisResult) -> tuple[object, ...]:
    sizes = [(s.size_bytes, s.chosen, s.protocol, s.estimate, s.default, s.synthesized, s.bound_us,
              s.reason) for s in res.sizes]  # fmt: skip
    ranges = [(r.min_bytes, r.max_bytes, r.kind, r.label, r.protocol, r.threadblocks,
               r.xml_file and Path(r.xml_file).name) for r in res.ranges]  # fmt: skip
    return sizes, ranges, res.notes, res.work, res.budget_exhausted


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.ALLREDUCE])
def test_reference_process_changes_no_number_or_file(tmp_path: Path, coll: Collective) -> None:
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    one = synthesize(topo, coll, SIZES, out_dir=tmp_path / "one", max_threadblocks=4)
    two = synthesize(topo, coll, SIZES, out_dir=tmp_path / "two", max_threadblocks=4, workers=2)
    assert _numbers(one) == _numbers(two)
    assert any(r.kind == "msccl" for r in one.ranges)  # files were written and compared
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_reference_process_with_budget_cut_short(tmp_path: Path) -> None:
    """Sizes the budget skips are never asked for; the process stops without them."""
    topo = make_cluster(4, 2, "nvswitch")
    one = synthesize(topo, Collective.ALLGATHER, SIZES, work_budget=1)
    two = synthesize(topo, Collective.ALLGATHER, SIZES, work_budget=1, workers=2)
    assert one.budget_exhausted and len(one.sizes) < len(SIZES)
    assert _numbers(one) == _numbers(two)


def test_references_come_from_another_process_in_evaluation_order() -> None:
    topo = make_cluster(4, 2, "nvswitch")
    sizes = SIZES
    in_order = [sizes[i] for i in grid.evaluation_order(len(sizes))[1]]
    refs = side.References(Collective.ALLGATHER, topo, Router(topo), in_order, workers=2)
    try:
        assert list(refs._pending) == in_order
        pids = {refs._pool.submit(os.getpid).result()} if refs._pool else set()
        assert pids and os.getpid() not in pids
        for s in reversed(sizes):  # any order of asking gives the in-process numbers
            assert refs.at(s) == side.reference(Collective.ALLGATHER, s, topo, Router(topo))
    finally:
        refs.close()
    inline = side.References(Collective.ALLGATHER, topo, Router(topo), in_order, workers=1)
    assert inline._pool is None and not inline._pending


def test_deadline_stops_the_side_processes() -> None:
    topo = make_cluster(4, 2, "nvswitch")
    with pytest.raises(engine.SynthesisDeadline):
        synthesize(topo, Collective.ALLGATHER, SIZES, time_budget_s=1e-9, workers=2)
    assert not multiprocessing.active_children()


def test_files_are_timed_here_when_this_process_is_already_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Above FILES_APART_MAX_RSS no second process times files (its read-backs would double the
    memory); every number and file is the same as with the process."""
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    coll = Collective.ALLGATHER
    started: list[object] = []
    real = side.side_process
    monkeypatch.setattr(side, "side_process", lambda *a: started.append(a[0]) or real(*a))
    monkeypatch.setattr(side, "FILES_APART_MAX_RSS", 1 << 62)  # a long test run is large itself
    two = synthesize(topo, coll, SIZES, out_dir=tmp_path / "two", max_threadblocks=4, workers=2)
    assert side._adopt_files in started  # the comparison below has a second process to lose
    started.clear()
    monkeypatch.setattr(side, "FILES_APART_MAX_RSS", 0)
    here = synthesize(topo, coll, SIZES, out_dir=tmp_path / "here", max_threadblocks=4, workers=2)
    assert side._adopt_files not in started and side._adopt in started  # references still apart
    assert _numbers(two) == _numbers(here)
    assert _files(tmp_path / "two") == _files(tmp_path / "here")


def test_resident_bytes_is_this_process_memory() -> None:
    # fresh anonymous pages: a heap allocation may reuse memory a long process already holds
    with mmap.mmap(-1, 64 << 20) as block:
        before = side.resident_bytes()
        block[:: mmap.PAGESIZE] = b"x" * len(block[:: mmap.PAGESIZE])  # touch every page
        assert side.resident_bytes() >= before + (48 << 20)
