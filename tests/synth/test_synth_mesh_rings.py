"""ReduceScatter and AllReduce on the cube-mesh quad as four rings at once (synth/mesh_rings.py; docs/synthesis.md
"Session 10: the cube-mesh"). Every time here is simulated (the read-back, charged): limits
by work, not seconds."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from test_synth_conformance import NO_TIME_LIMIT, assert_loaded_and_selected

from ccltune.api.common import Collective
from ccltune.model.evaluate import published_estimate
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.nccl.default import default_estimate
from ccltune.synth import mesh, mesh_rings
from ccltune.synth.engine import synthesize
from ccltune.synth.group import GroupTopo
from ccltune.topology.load import load_cluster

MiB = 1 << 20
LABEL = "mesh/rings4x2d4"
# the budget bound at 64 MiB (benchmarks/synthesis.py) and the target's share of it
TARGET_64M = {Collective.ALLREDUCE: (1121.9, 0.85), Collective.REDUCESCATTER: (632.5, 0.9)}


def test_four_rings_share_the_quads_links_evenly() -> None:
    """Each 1-lane link carries one ring, a 2-lane link at most two: 20 GB/s per ring, 80 into
    every GPU (GPUs 0 and 1 have no more)."""
    group = GroupTopo.gpu_mesh(load_cluster("v100-cubemesh-4"))
    found = mesh_rings.rings(group, 8, 20.0, 12.5)
    assert found is not None and len(found) == 4
    users: dict[tuple[int, int], int] = {}
    for ring in found:
        assert sorted(ring) == [0, 1, 2, 3]
        for hop in itertools.pairwise([*ring, ring[0]]):
            users[hop] = users.get(hop, 0) + 1
    assert all(users.get(lk, 0) <= group.capacity(*lk) for lk in group.links()), users
    assert all(users[lk] == 1 for lk in group.links() if group.capacity(*lk) == 1)
    # fewer threadblocks: the rings' channels bind first, so fewer rings win
    assert len(mesh_rings.rings(group, 2, 20.0, 12.5) or []) == 2


def test_not_on_a_mesh_of_equal_links() -> None:
    topo = load_cluster("mi300x-8")
    group = GroupTopo.gpu_mesh(topo)
    for coll in (Collective.ALLREDUCE, Collective.REDUCESCATTER):
        assert mesh._ring_variants(topo, group, coll, 32) == []


@pytest.mark.parametrize("coll", [Collective.ALLREDUCE, Collective.REDUCESCATTER])
def test_ring_file_beats_nccl_and_meets_the_target(coll: Collective) -> None:
    """At 64 MiB the file (the better of the writer's two orders) is under NCCL's ring
    (AllReduce 1,339.7 us, ReduceScatter 693.1) and meets issue 18's share of the budget bound
    (85%: 1,319.9 us; 90%: 702.8); simulated 1,290.1 and 667.1."""
    topo = load_cluster("v100-cubemesh-4")
    found = mesh.variants(topo, coll, 8, 0)
    assert LABEL in found.schedules and found.fits(LABEL)
    times = []
    for lb in (LABEL, found.early(LABEL)):
        if lb is None:
            continue
        low = found.lowered[lb]
        assert low.threadblocks == 8
        text = render_lowering(low, name=lb, proto="Simple",
                               nchannels=found.schedules[LABEL].channels)  # fmt: skip
        times.append(published_estimate(coll, 64 * MiB, topo, text).time_us)
    nccl = default_estimate(coll, 64 * MiB, topo).time_us
    assert min(times) < nccl, (times, nccl)
    bound, share = TARGET_64M[coll]
    assert bound / min(times) >= share, times


@pytest.mark.parametrize("coll", [Collective.ALLREDUCE, Collective.REDUCESCATTER])
def test_ring_files_are_chosen_and_load(coll: Collective, tmp_path: Path) -> None:
    """Chosen at 64 MiB and 1 GiB; the files load in msccl-executor-nccl's parser on every rank
    and are selected at their sizes (the conformance kit)."""
    topo = load_cluster("v100-cubemesh-4")
    res = synthesize(topo, coll, [64 * MiB, 1 << 30],
                     time_budget_s=NO_TIME_LIMIT, out_dir=tmp_path / "msccl")  # fmt: skip
    assert all(sr.chosen.startswith(LABEL) for sr in res.sizes), [sr.chosen for sr in res.sizes]
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert files and all(r.threadblocks <= 8 for r in files)
    assert_loaded_and_selected(tmp_path, files)
