"""AlltoAll on the DGX-1 cube-mesh quad (v100-cubemesh-4): part of each 1-lane pair's data
relayed through 2-lane neighbours, routed by what the pairs' threadblocks can move
(mesh.connection_caps), on the threadblocks the copy leaves. docs/synthesis.md "Session 10: the
cube-mesh". Every time here is simulated (the read-back, charged): limits by work, not seconds."""

from __future__ import annotations

import itertools
from pathlib import Path

from test_synth_conformance import NO_TIME_LIMIT, assert_loaded_and_selected

from ccltune.api.common import Collective
from ccltune.model.evaluate import published_estimate
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.synth import mesh
from ccltune.synth.engine import synthesize
from ccltune.synth.fill import MAX_CHUNKS
from ccltune.synth.group import GroupTopo
from ccltune.topology.load import load_cluster

MiB = 1 << 20
ROUTED = f"mesh-a2a/r{MAX_CHUNKS}t6/copy"
DIRECT = "mesh-a2a/k1t6/copy"


def _busiest(routes: dict[tuple[int, int], list[list[int]]], caps: dict[tuple[int, int], float],
             ) -> float:  # fmt: skip
    load: dict[tuple[int, int], int] = {}
    for rs in routes.values():
        for r in rs:
            for hop in itertools.pairwise(r):
                load[hop] = load.get(hop, 0) + 1
    return max(c / caps[hop] for hop, c in load.items())


def test_routes_by_what_the_threadblocks_move() -> None:
    """2 channels per pair: a 2-lane pair's connections move 25 GB/s (2 threadblocks), not its
    40 GB/s of lanes, so the LP relays a 1-lane pair's data only as far as that room allows:
    2 or 4 of 32 pieces, never over a 1-lane hop that is full, and the busiest connection
    group is less loaded than with direct sends (32 / 20 GB/s) or the lane-routed split."""
    topo = load_cluster("v100-cubemesh-4")
    group = GroupTopo.gpu_mesh(topo)
    chans = dict.fromkeys(group.links(), 2)
    caps = mesh.connection_caps(topo, group, chans)
    assert {group.capacity(*lk): c for lk, c in caps.items()} == {1: 20.0, 2: 25.0}
    routed = mesh.alltoall_routes(group, MAX_CHUNKS, caps)
    relayed = {p: sum(len(r) > 2 for r in rs) for p, rs in routed.items()}
    one_lane = {p for p in routed if group.capacity(*p) == 1}
    assert {p for p, k in relayed.items() if k} == one_lane
    assert all(relayed[p] in (2, 4) for p in one_lane), relayed
    direct = mesh.alltoall_routes(group, 1)
    by_lanes = mesh.alltoall_routes(group, MAX_CHUNKS)
    got = _busiest(routed, caps)
    assert got < _busiest(direct, caps) * MAX_CHUNKS
    assert got < _busiest(by_lanes, caps)


def test_routed_file_beats_direct_sends() -> None:
    """The routed variant keeps 2 threadblocks for the copy, as the direct one does, and its
    file at 64 MiB is at least 4% faster (simulated: 812.1 against 853.5 us)."""
    topo = load_cluster("v100-cubemesh-4")
    found = mesh.variants(topo, Collective.ALLTOALL, 8, 0)
    assert ROUTED in found.schedules and found.copy_tbs[ROUTED] == 2
    best = {}
    for label in (ROUTED, DIRECT):
        assert found.fits(label)
        times = []
        for lb in (label, found.early(label)):
            if lb is None:
                continue
            low = found.lowered[lb]
            assert low.threadblocks == 8
            assert sum(p < 0 and q < 0 for p, q, _ in low.tb_meta[0]) == 2
            text = render_lowering(low, name=lb, proto="Simple",
                                   nchannels=found.schedules[label].channels)  # fmt: skip
            times.append(published_estimate(Collective.ALLTOALL, 64 * MiB, topo, text).time_us)
        best[label] = min(times)
    assert best[ROUTED] < 0.96 * best[DIRECT], best


def test_no_routed_variant_on_a_uniform_mesh() -> None:
    """MI300X: every link alike, nothing to relay, no routed twin of the direct variant."""
    found = mesh.variants(load_cluster("mi300x-8"), Collective.ALLTOALL, 32, 0)
    assert not any(lb.startswith("mesh-a2a/r") for lb in found.schedules)


def test_routed_files_are_chosen_and_load(tmp_path: Path) -> None:
    """Chosen at 64 MiB and 1 GiB; the files load in msccl-executor-nccl's parser on every rank
    and are selected at their sizes (the conformance kit)."""
    topo = load_cluster("v100-cubemesh-4")
    res = synthesize(topo, Collective.ALLTOALL, [64 * MiB, 1 << 30], time_budget_s=NO_TIME_LIMIT,
                     out_dir=tmp_path / "msccl")  # fmt: skip
    assert all(sr.chosen.startswith(ROUTED) for sr in res.sizes), [sr.chosen for sr in res.sizes]
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert files and all(r.threadblocks <= 8 for r in files)
    assert_loaded_and_selected(tmp_path, files)
