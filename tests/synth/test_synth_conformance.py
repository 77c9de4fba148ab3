"""Acceptance: synthesized MSCCL files load in msccl-executor-nccl's own parser on every rank and
are selected by its own rule at every power-of-two size they cover (the conformance kit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.limits import MAX_STEPS
from ccltune.synth.engine import RangeResult, default_threadblocks, synthesize
from ccltune.topology.presets import load_preset

REPO = Path(__file__).resolve().parents[2]
SIZES = [1 << k for k in range(10, 31)]  # 1K..1G
# A budget that never binds: the work is limited by the candidates, not by wall time.
NO_TIME_LIMIT = 3600


def assert_loaded_and_selected(plan: Path, files: list[RangeResult]) -> str:
    """Every file loads on every rank and is selected at its sizes, for 2- and 4-byte types;
    the kit's last output."""
    out = ""
    for dtype_bytes in (2, 4):
        out = check_plan(plan, "--dtype-bytes", str(dtype_bytes))
        for r in files:
            name = Path(r.xml_file or "").name
            assert f"PASS msccl/{name} load" in out
            assert f"PASS msccl/{name} selection: selected by the executor at all" in out
    return out


@pytest.mark.parametrize(
    ("preset", "coll", "budget"),
    [
        ("dgx-h100-2", "allreduce", None),  # NCCL's own channel count: 16
        ("dgx-h100-2", "allgather", None),
        ("dgx-h100-2", "reducescatter", None),
        ("syccl-a800-16", "allgather", 8),  # one threadblock per peer, one channel
        ("h800-rail-64", "allgather", 16),
    ],
)
def test_files_load_and_are_selected(preset: str, coll: str, budget: int | None,
                                     tmp_path: Path) -> None:  # fmt: skip
    topo = load_preset(preset)
    res = synthesize(topo, coll, SIZES, time_budget_s=NO_TIME_LIMIT, out_dir=tmp_path / "msccl",
                     max_threadblocks=budget)  # fmt: skip
    assert not res.budget_exhausted
    cap = budget or default_threadblocks(Collective(coll), topo, SIZES)
    assert res.max_threadblocks == cap
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert files, res.notes  # the check below must have something to check
    assert all(0 < r.threadblocks <= cap for r in files)
    out = assert_loaded_and_selected(tmp_path, files)
    steps = [int(line.split(" steps per block")[0].rsplit(" ", 1)[1])
             for line in out.splitlines() if "steps per block" in line]  # fmt: skip
    assert steps and max(steps) <= MAX_STEPS


def test_default_budget_is_nccls_and_a_fabric_that_needs_more_says_so(tmp_path: Path) -> None:
    topo = load_preset("syccl-a800-16")
    # NCCL's search: 4 channels of 24 GB/s; ncclTopoPostset doubles them for the kernels.
    sizes = [1 << 20, 1 << 28]
    assert default_threadblocks(Collective.ALLGATHER, topo, sizes) == 8
    # A budget below what every schedule needs (8 peers unsplit; 4 with the NVSwitch split
    # 2 x 2 x 2, synth/sketch.py) is refused with the number to set.
    res = synthesize(topo, "allgather", sizes, time_budget_s=NO_TIME_LIMIT, out_dir=tmp_path,
                     max_threadblocks=2)  # fmt: skip
    assert res.max_threadblocks == 2
    assert all(r.kind == "nccl" for r in res.ranges) and not list(tmp_path.iterdir())
    assert any("set synthesis.maxThreadblocks to at least 8" in n for n in res.notes), res.notes
    assert "SM budget" in res.sizes[0].reason
