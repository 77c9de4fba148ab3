"""AlltoAll synthesis searches only where a file could beat NCCL's p2p (synth/alltoall.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan

from ccltune.api.common import Collective
from ccltune.model.cost.sm_bound import launched_bound_us
from ccltune.synth import alltoall as a2a
from ccltune.synth.engine import synthesize
from ccltune.topology.presets import load_preset

SIZES = [1 << k for k in range(10, 31, 2)]


def test_pruning_changes_no_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes at the bound are skipped and files whose schedule already loses are not timed; with
    both cuts switched off every size is searched and every finalist's file timed, and every
    choice and time is the same."""
    topo = load_preset("syccl-a800-16")
    pruned = synthesize(topo, Collective.ALLTOALL, SIZES, workers=1)
    closed = [s for s in pruned.sizes if "at the lower bound" in s.reason]
    assert closed and len(closed) < len(SIZES)  # some sizes are searched, some not
    monkeypatch.setattr(a2a, "at_bound", lambda *_a, **_k: {})
    monkeypatch.setattr(a2a, "worth_timing", lambda *_a: True)
    full = synthesize(topo, Collective.ALLTOALL, SIZES, workers=1)
    assert pruned.work < full.work
    for p, f in zip(pruned.sizes, full.sizes, strict=True):
        assert (p.chosen, p.protocol) == (f.chosen, f.protocol), p.size_bytes
        assert p.estimate.time_us == pytest.approx(f.estimate.time_us, rel=1e-12)


def test_closed_sizes_are_at_the_launch_bound() -> None:
    topo = load_preset("syccl-a800-16")
    res = synthesize(topo, Collective.ALLTOALL, SIZES, workers=1)
    for s in res.sizes:
        floor = launched_bound_us(Collective.ALLTOALL, s.size_bytes, topo, res.max_threadblocks)
        assert s.estimate.time_us >= floor * (1 - 1e-9)
        if "at the lower bound" in s.reason:
            assert s.chosen.startswith("nccl:")
            assert s.default.time_us <= floor * (1 + a2a.TIE)


def test_nothing_searched_where_nccl_is_at_the_bound_everywhere(tmp_path) -> None:
    """h800-rail-64 from 128 KiB to 256 KiB and 2-16 MiB: NCCL's p2p is at the bound, so no sketch
    is searched, no schedule assembled and no file written."""
    topo = load_preset("h800-rail-64")
    sizes = [128 << 10, 256 << 10, 2 << 20, 4 << 20, 16 << 20]
    res = synthesize(topo, Collective.ALLTOALL, sizes, workers=1, out_dir=tmp_path)
    assert res.stats is None and res.work == 0 and not res.schedules
    assert all(s.chosen == "nccl:p2p/" + s.protocol for s in res.sizes)
    assert all("at the lower bound" in s.reason for s in res.sizes)
    assert [r.kind for r in res.ranges] == ["nccl"] * len(res.ranges)
    assert not list(tmp_path.iterdir())
    assert any("nothing to synthesize" in n for n in res.notes)


def test_small_rail_alltoall_file_is_accepted_and_faster(tmp_path: Path) -> None:
    """h800-rail-64 at 1-16 KiB: the relayed file (rail, then NVLink) beats NCCL's p2p, within
    2% of the launch-inclusive bound, and msccl-executor-nccl's own parser loads and selects it
    (the conformance kit)."""
    topo = load_preset("h800-rail-64")
    sizes = [1 << 10, 4 << 10, 16 << 10]
    res = synthesize(topo, Collective.ALLTOALL, sizes, workers=1, out_dir=tmp_path / "msccl")
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert files, res.notes
    for s in res.sizes[:2]:
        assert s.estimate.time_us < s.default.time_us
        floor = launched_bound_us(Collective.ALLTOALL, s.size_bytes, topo, res.max_threadblocks)
        assert s.estimate.time_us <= 1.02 * floor
    out = check_plan(tmp_path)
    for r in files:
        assert f"PASS msccl/{Path(r.xml_file or '').name} load" in out


def test_with_a_reference_process_the_same_sizes_close(tmp_path: Path) -> None:
    """With workers > 1 NCCL's references run beside the search, so the sizes close after
    assembly: the same choices and reasons, nothing evaluated or written."""
    topo = load_preset("h800-rail-64")
    sizes = [128 << 10, 256 << 10, 2 << 20]
    one = synthesize(topo, Collective.ALLTOALL, sizes, workers=1)
    two = synthesize(topo, Collective.ALLTOALL, sizes, workers=2, out_dir=tmp_path)
    assert [(s.chosen, s.reason, s.estimate.time_us) for s in two.sizes] == \
        [(s.chosen, s.reason, s.estimate.time_us) for s in one.sizes]  # fmt: skip
    assert not list(tmp_path.iterdir())
