"""Acceptance: files synthesized on one server's GPU mesh (synth/mesh.py) load in
msccl-executor-nccl's own parser on every rank and are selected by its own rule at every
power-of-two size they cover (the conformance kit, as test_synth_conformance.py runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_synth_conformance import NO_TIME_LIMIT, SIZES, assert_loaded_and_selected

from ccltune.api.common import Collective
from ccltune.synth.engine import synthesize
from ccltune.topology.load import load_cluster

CUBE_8 = str(Path(__file__).resolve().parents[2] / "examples/clusters/dgx1-v100-cubemesh.yaml")


@pytest.mark.parametrize(
    ("ref", "coll"),
    [
        ("v100-cubemesh-4", "allgather"),  # asymmetric: the mesh alone
        ("v100-cubemesh-4", "alltoall"),  # relayed over 2-link neighbours
        ("v100-cubemesh-4", "allreduce"),
        (CUBE_8, "alltoall"),
        ("mi300x-8", "alltoall"),  # symmetric: mesh files beside the sketch engine's
        ("mi300x-8", "allgather"),  # all 32 threadblocks: relayed chunks (mesh.fill_plan)
    ],
)
def test_mesh_files_load_and_are_selected(ref: str, coll: str, tmp_path: Path) -> None:
    topo = load_cluster(ref)
    res = synthesize(topo, coll, SIZES, time_budget_s=NO_TIME_LIMIT, out_dir=tmp_path / "msccl")
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert any(r.label.startswith("mesh") for r in files), res.notes
    if ref == "mi300x-8":  # AllGather's fill; AlltoAll's copy-only threadblocks (mesh.py)
        tag = "/copy" if coll == "alltoall" else "/fill"
        assert any(tag in r.label for r in files), [r.label for r in files]
    assert all(0 < r.threadblocks <= res.max_threadblocks for r in files)
    assert all(s.estimate.time_us <= s.default.time_us for s in res.sizes)
    assert_loaded_and_selected(tmp_path, files)
    assert Collective(coll) == res.collective
