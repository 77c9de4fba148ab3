"""Synthesis on one server's GPU mesh (synth/mesh.py): the cube-mesh and MI300X's xGMI mesh."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from ccltune.api.common import Collective
from ccltune.model.cost.sm_bound import budget_bound_us
from ccltune.model.schedule.check import check_schedule
from ccltune.synth import fill, mesh
from ccltune.synth.engine import synthesize
from ccltune.synth.group import GroupTopo
from ccltune.synth.milp import SubDemand, solve
from ccltune.topology.load import load_cluster, load_text

REPO = Path(__file__).resolve().parents[2]
CUBE_8 = str(REPO / "examples/clusters/dgx1-v100-cubemesh.yaml")
SIZES = [1 << k for k in (10, 16, 20, 24, 26, 30)]


def test_applies_to_one_server_with_gpu_links_only() -> None:
    assert mesh.applies(load_cluster("v100-cubemesh-4"))
    assert mesh.applies(load_cluster(CUBE_8))
    assert mesh.applies(load_cluster("mi300x-8"))
    two = (REPO / "operator/ccltune/topology/presets/v100-cubemesh-4.yaml").read_text()
    assert not mesh.applies(load_text(two.replace("servers: 1", "servers: 2"), "two.yaml"))
    assert not mesh.applies(load_cluster("dgx-h100-2"))
    assert not mesh.applies(load_cluster("dgx-h100-1"))  # NVSwitch: no GPU-to-GPU link
    assert not mesh.applies(load_cluster("a40-pcie-8"))  # NVLink bridges join pairs only


@pytest.mark.parametrize(("ref", "budget"), [("v100-cubemesh-4", 8), (CUBE_8, 12), ("mi300x-8", 32)])
def test_channels_per_pair_fit_the_budget(ref: str, budget: int) -> None:
    g = GroupTopo.gpu_mesh(load_cluster(ref))
    load = {lk: 1 + g.capacity(*lk) for lk in g.links()}
    ch = mesh.channels_per_pair(g, load, budget)
    assert set(ch) == set(g.links())
    for u, v in g.links():
        assert ch[(u, v)] == ch[(v, u)] >= 1
        assert ch[(u, v)] & (ch[(u, v)] - 1) == 0  # powers of two: copies deal evenly
    for r in range(g.size):
        assert sum(c for (u, _), c in ch.items() if u == r) <= budget
    # The whole budget is used where a doubling still fits: no GPU could take one more.
    used = [sum(c for (u, _), c in ch.items() if u == r) for r in range(g.size)]
    assert not any(used[u] + ch[(u, v)] <= budget and used[v] + ch[(u, v)] <= budget
                   for u, v in g.links())  # fmt: skip


def _max_load_per_lane(g: GroupTopo, routes: dict[tuple[int, int], list[list[int]]]) -> float:
    load: dict[tuple[int, int], int] = {}
    for rs in routes.values():
        for r in rs:
            for hop in itertools.pairwise(r):
                load[hop] = load.get(hop, 0) + 1
    return max(c / g.capacity(*hop) for hop, c in load.items())


def test_alltoall_routes_relay_one_link_pairs_on_the_cube_mesh() -> None:
    g = GroupTopo.gpu_mesh(load_cluster("v100-cubemesh-4"))
    k = 4
    routes = mesh.alltoall_routes(g, k)
    assert set(routes) == {(s, d) for s in range(4) for d in range(4) if s != d}
    for (s, d), rs in routes.items():
        assert len(rs) == k
        assert all(r[0] == s and r[-1] == d and len(r) <= 3 for r in rs)
        assert all(hop in set(g.links()) for r in rs for hop in itertools.pairwise(r))
    direct = {pair: [[*pair]] * k for pair in routes}
    # Direct sends load a 1-link pair with all k pieces; max-flow routing spreads them (the
    # LP's optimum is 3 per lane, whole pieces round one pair's split up).
    assert _max_load_per_lane(g, direct) == k
    assert _max_load_per_lane(g, routes) < k
    assert any(len(r) == 3 for rs in routes.values() for r in rs)


def test_alltoall_routes_stay_direct_on_a_full_mesh() -> None:
    g = GroupTopo.gpu_mesh(load_cluster("mi300x-8"))
    routes = mesh.alltoall_routes(g, 4)
    assert all(r == [s, d] for (s, d), rs in routes.items() for r in rs)


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                  Collective.ALLREDUCE, Collective.ALLTOALL])  # fmt: skip
def test_variants_are_correct_and_fit_the_executor(coll: Collective) -> None:
    topo = load_cluster("v100-cubemesh-4")
    found = mesh.variants(topo, coll, 8, node_limit=200)
    assert found.schedules
    for label, arr in list(found.schedules.items()):
        assert arr.collective == coll and arr.nranks == 4
        # every chunk delivered / reduced, no write races (scratch variants: reduces land in
        # slots of their own, added by the file's `re` chains, so they commute)
        check_schedule(arr.to_schedule(), reduces_commute="/scratch" in label)
        if found.fits(label):
            assert found.lowered[label].threadblocks <= 8, label
        else:
            assert label in found.unfit and label in found.dropped[-1]
    assert found.lowered  # some variant of every collective runs within the budget


def test_reverse_orders_reduces_into_one_chunk() -> None:
    g = GroupTopo.gpu_mesh(load_cluster("v100-cubemesh-4"))
    ranks = tuple(range(4))
    pattern = solve(SubDemand(g, ranks, ranks, False, 8, tuple(r for r in ranks for _ in "ab")),
                    node_limit=0)  # fmt: skip
    chans = mesh.channels_per_pair(g, {lk: 1 for lk in g.links()}, 8)
    ag = mesh.allgather(g, pattern, 2, 4, chans, "t", queue=False)
    rs = mesh.reverse(ag, "t-rs")
    assert len(rs) == len(ag) and rs.reduce.all()
    assert sorted(zip(rs.src.tolist(), rs.dst.tolist(), rs.chunk.tolist(), strict=True)) == sorted(
        zip(ag.dst.tolist(), ag.src.tolist(), ag.chunk.tolist(), strict=True))  # fmt: skip
    ptr, idx = rs.dep_ptr.tolist(), rs.dep_idx.tolist()
    assert all(d < i for i in range(len(rs)) for d in idx[ptr[i] : ptr[i + 1]])  # topological
    check_schedule(rs.to_schedule())


def test_cube_mesh_is_synthesized_and_never_slower_than_nccl(tmp_path: Path) -> None:
    topo = load_cluster("v100-cubemesh-4")
    res = synthesize(topo, Collective.ALLTOALL, SIZES, time_budget_s=3600, out_dir=tmp_path)
    assert not res.symmetric and "GPU mesh" in res.notes[0]
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert files and all(Path(r.xml_file or "").exists() for r in files)
    assert all(s.estimate.time_us <= s.default.time_us for s in res.sizes)
    # AlltoAll at 64 MiB: NCCL's p2p moves a 1-link pair's quarter over one NVLink; the mesh
    # schedule drives each pair with two threadblocks at least (simulated). Its copy of the own
    # quarter is charged: 4 chunks on 4 of 8 threadblocks, 1,182.8 against NCCL's 1,440.8 us.
    at = next(s for s in res.sizes if s.size_bytes == 1 << 26)
    assert at.chosen.startswith("mesh-a2a/") and at.estimate.time_us < 0.85 * at.default.time_us


def test_full_mesh_alltoall_is_synthesized(tmp_path: Path) -> None:
    topo = load_cluster("mi300x-8")
    res = synthesize(topo, Collective.ALLTOALL, [1 << 20, 1 << 26], time_budget_s=3600,
                     out_dir=tmp_path)  # fmt: skip
    assert res.symmetric
    big = res.sizes[-1]
    assert big.chosen.startswith("mesh-a2a/")
    # Direct sends on 4 threadblocks per peer vs NCCL's p2p: well over 2x (simulated).
    assert big.estimate.time_us < 0.5 * big.default.time_us
    assert all(s.estimate.time_us <= s.default.time_us for s in res.sizes)


def test_broadcast_is_left_to_the_symmetric_engine() -> None:
    topo = load_cluster("v100-cubemesh-4")
    res = synthesize(topo, Collective.BROADCAST, [1 << 20], time_budget_s=3600)
    assert all(r.kind == "nccl" for r in res.ranges)
    assert not res.schedules


def test_milp_runs_where_its_model_is_small_enough() -> None:
    # DGX-1 AllGather: 2 pieces per GPU (2,048 binaries) MILP 3 epochs vs greedy 4; 4 pieces
    # (6,144, over mesh.MILP_VARS) keep the greedy pattern.
    found = mesh.variants(load_cluster(CUBE_8), Collective.ALLGATHER, 12, node_limit=2000)
    by_pieces = {p.demand.pieces // 8: p for p in found.patterns}
    assert by_pieces[2].milp and by_pieces[2].epochs == 3 < by_pieces[2].greedy_epochs
    assert not by_pieces[4].milp and by_pieces[4].status == "greedy"


def test_fill_plan_puts_the_same_share_on_every_threadblock() -> None:
    """MI300X at 32 threadblocks, 7 peers: offsets 1, 2, 6, 7 on 5 channels, 3, 4, 5 on 4;
    every channel carries 7 of the 32 x 7 chunks a GPU receives (and sends), the 12 chunks
    the 4-channel offsets cannot carry relayed by GPUs that receive them anyway."""
    g = GroupTopo.gpu_mesh(load_cluster("mi300x-8"))
    plan = fill.fill_plan(g, 32)
    assert plan is not None
    assert plan.channels == {1: 5, 2: 5, 3: 4, 4: 4, 5: 4, 6: 5, 7: 5}
    assert plan.cpr == 32 and plan.per_channel == 7 and len(plan.relays) == 12
    assert len({c for _, c, _ in plan.relays}) == 12  # disjoint: no relay waits on a relay
    arr = fill.fill_allgather(plan, "fill")
    check_schedule(arr.to_schedule())  # every chunk reaches every GPU
    for r in range(8):
        for side, peer in ((arr.src, arr.dst), (arr.dst, arr.src)):
            mine = side == r
            per = Counter(zip(((peer[mine] - r) % 8).tolist(), arr.channel[mine].tolist(), strict=True))
            assert sum(1 for _ in per) == 32 and set(per.values()) == {7}
    # Not where the budget already divides evenly, nor on a mesh with missing or unequal links.
    assert fill.fill_plan(g, 28) is None
    assert fill.fill_plan(GroupTopo.gpu_mesh(load_cluster("v100-cubemesh-4")), 8) is None


def test_fill_wins_mi300x_allgather_at_64_mib() -> None:
    """All 32 threadblocks at one share each: the file takes 211.5 us against 226.6 us for NCCL's
    ring (simulated, local steps charged). Its copy of the own 8 MiB is dealt one chunk per
    threadblock, 8 chunks where each received 7, so it stays within 8/7 of its uncharged 190.0
    us: 88.2% of the bound at the budget (the bound has no copy: NCCL's ring sends from the
    input into the output, directCopySend); on one threadblock it took 941.8 us."""
    topo = load_cluster("mi300x-8")
    res = synthesize(topo, Collective.ALLGATHER, [1 << 26], time_budget_s=3600)
    at = res.sizes[0]
    assert at.chosen.startswith("mesh/fill")
    bound = budget_bound_us(Collective.ALLGATHER, 1 << 26, topo, res.max_threadblocks, at.bound_us)
    assert at.estimate.time_us >= bound and bound / at.estimate.time_us >= 0.875


def test_alltoall_fill_relays_over_two_spare_hops() -> None:
    """AlltoAll relays cost a second hop, so whole chunks of 32 per pair gain nothing (the
    busiest channel keeps 8); with 64, 4 of each 4-channel pair's chunks ride two 5-channel
    hops and no channel carries more than 15 (direct sends: 16)."""
    g = GroupTopo.gpu_mesh(load_cluster("mi300x-8"))
    plan = fill.fill_alltoall_plan(g, 32)
    assert plan is not None and plan.cpr == 64 and plan.per_channel == 15
    five = {d for d, k in plan.channels.items() if k == 5}
    for d, _, a in plan.relays:
        assert plan.channels[d] == 4 and a in five and (d - a) % 8 in five
    arr = fill.fill_alltoall(plan)
    check_schedule(arr.to_schedule())  # every pair's data delivered
    for r in range(8):
        for side, peer in ((arr.src, arr.dst), (arr.dst, arr.src)):
            mine = side == r
            per = Counter(zip(((peer[mine] - r) % 8).tolist(), arr.channel[mine].tolist(), strict=True))
            assert len(per) == 32 and max(per.values()) == 15
    assert fill.fill_alltoall_plan(g, 16) is None  # no whole-chunk deal beats direct sends there


def test_fill_only_adds_sizes_where_its_file_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fill's schedules run at the bound and its files ~10% slower: it is timed after the
    other variants, so no size is slower than without it (mi300x-8 AllGather, simulated: ranked
    with them it took 512K..16M from faster direct files), and 64 MiB is faster."""
    topo = load_cluster("mi300x-8")
    sizes = [1 << 21, 1 << 22, 1 << 26]
    res = synthesize(topo, Collective.ALLGATHER, sizes, time_budget_s=3600)
    monkeypatch.setattr(mesh, "fill_plan", lambda group, budget: None)
    without = synthesize(topo, Collective.ALLGATHER, sizes, time_budget_s=3600)
    for a, b in zip(res.sizes, without.sizes, strict=True):
        assert a.estimate.time_us <= b.estimate.time_us, (a.size_bytes, a.chosen, b.chosen)
    assert res.sizes[-1].chosen.startswith("mesh/fill")
    assert res.sizes[-1].estimate.time_us < 0.95 * without.sizes[-1].estimate.time_us
