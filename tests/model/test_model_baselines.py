"""NCCL baselines: tree shapes, ring orders, and every schedule proven correct by check_schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
from cost_model_topos import spec_topology, symmetric_topologies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccltune.api.common import Collective
from ccltune.model.nccl.baselines import (
    SUPPORTED,
    BaselineError,
    btree,
    dtree,
    nccl_schedule,
    nccl_schedule_arrays,
    nvlink_cycles,
    ring_layouts,
    ring_order,
)
from ccltune.model.schedule.check import check_schedule
from ccltune.model.sim.routing import Router
from ccltune.topology.load import load_cluster
from ccltune.topology.presets import load_preset

OCI = (Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "nccl-tests"
       / "oci-a100-2x8-allreduce" / "cluster.yaml")  # fmt: skip

ALL = [(c, a) for c, algos in SUPPORTED.items() for a in algos]


def _tree_ok(n: int, tree: int) -> None:
    parents = {}
    for r in range(n):
        par, kids = dtree(n, r, tree)
        parents[r] = par
        for k in kids:
            assert 0 <= k < n and dtree(n, k, tree)[0] == r
        assert len(kids) <= 2
    roots = [r for r, p in parents.items() if p < 0]
    assert len(roots) == 1
    for r in range(n):  # every node reaches the root
        seen, v = set(), r
        while parents[v] >= 0:
            assert v not in seen
            seen.add(v)
            v = parents[v]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 12, 16, 33])
def test_double_binary_tree_shapes(n: int) -> None:
    _tree_ok(n, 0)
    _tree_ok(n, 1)


def test_btree_matches_nccl_layout() -> None:
    # NCCL trees.cc: 0 is the root with child 4 (n=8); 4 -> (2, 6); 2 -> (1, 3); 6 -> (5, 7).
    assert btree(8, 0) == (-1, [4])
    assert btree(8, 4) == (0, [2, 6])
    assert btree(8, 6) == (4, [5, 7])
    assert btree(8, 7) == (6, [])
    assert btree(6, 4) == (0, [2, 5])  # second child clipped into range


def test_double_tree_interior_nodes_are_leaves_in_the_other() -> None:
    n = 8
    interior = [{r for r in range(n) if dtree(n, r, t)[1]} for t in (0, 1)]
    assert not (interior[0] & interior[1])


def test_ring_is_rail_aligned_on_dgx() -> None:
    topo = spec_topology(2, 8, "nvswitch", nics=8, layout="rail", intra_bw=300.0)
    router = Router(topo)
    exits = set()
    for ch in range(8):
        ring = ring_order(topo, ch)
        assert sorted(ring) == list(range(16))
        assert all(r // 8 == 0 for r in ring[:8])  # node by node
        path = [router.channel_name(c) for c in router.path(ring[7], ring[8])]
        assert not any("spine" in hop for hop in path), path  # stays on its rail
        exits.add(ring[7])
    assert len(exits) >= 4  # channels spread over the node's NICs


def _ring_nics(topo, channels: int) -> list[tuple[str, str]]:
    """Per channel: the NICs its ring leaves node 0 by and enters node 1 by."""
    router = Router(topo)
    out = []
    for ch in range(channels):
        ring = ring_order(topo, ch)
        hops = [router.channel_name(c) for c in router.path(ring[7], ring[8], ch)]
        assert not any("spine" in h for h in hops), hops  # stays on its rail
        nics = [h.split("->")[0] for h in hops if h.split("->")[0].split("/")[-1].startswith("nic")]
        out.append((nics[0], nics[1]))
    return out


def test_ring_channels_use_every_nic_of_a_two_nic_gpu() -> None:
    # OCI BM.GPU4.8: 16 NICs, 4 per PCIe switch with 2 GPUs. NCCL's search gives channel c the
    # c-th NIC (GPU 0's two, then GPU 1's...), entering at the NIC's GPU, leaving by its partner.
    topo = load_cluster(str(OCI))
    nics = _ring_nics(topo, 16)
    assert [a for a, _ in nics] == [f"node0/nic{c}" for c in range(16)]
    assert [b for _, b in nics] == [f"node1/nic{c}" for c in range(16)]
    entries = [ring_order(topo, ch)[0] for ch in range(16)]
    assert entries == [c // 2 for c in range(16)]  # topo.cc ncclTopoGetLocalGpu


def test_ring_channels_on_h100_use_each_nic_once() -> None:
    topo = load_preset("dgx-h100-2")
    nics = _ring_nics(topo, 8)
    assert sorted(a for a, _ in nics) == sorted(f"node0/nic{c}" for c in range(8))


def test_tree_heads_spread_over_nics() -> None:
    # Trees enter and leave a node by one NIC (search.cc: trees are symmetric); the head of
    # channel c is the GPU of NCCL's c-th NIC and uses it.
    topo = load_cluster(str(OCI))
    router = Router(topo)
    arr = nccl_schedule_arrays("allreduce", "tree", topo, channels=16)
    used = {}
    for i in range(len(arr)):
        s, d, ch = int(arr.src[i]), int(arr.dst[i]), int(arr.channel[i])
        if s // 8 == 0 and d // 8 == 1:
            hops = [router.channel_name(c) for c in router.path(s, d, ch)]
            used.setdefault(ch, set()).add(next(h.split("->")[0] for h in hops
                                                if "/nic" in h.split("->")[0]))  # fmt: skip
    assert [sorted(used[ch]) for ch in range(16)] == [[f"node0/nic{c}"] for c in range(16)]


def test_cycles_use_direct_links() -> None:
    topo = spec_topology(1, 4, "ring", nics=0)
    for cyc in nvlink_cycles(topo):
        for a, b in zip(cyc, cyc[1:] + cyc[:1], strict=True):
            assert (a - b) % 4 in (1, 3)  # neighbours on the 4-GPU NVLink ring
    full = spec_topology(1, 8, "fully_connected", nics=0)
    assert len(nvlink_cycles(full)) >= 4  # several distinct rings over the full mesh
    assert len(ring_layouts(full)) >= 4


def test_rings_on_a_full_mesh_do_not_share_links() -> None:
    # NCCL's search books each ring's bandwidth on its links: on 8 fully connected GPUs (MI300X)
    # 3 link-disjoint Hamiltonian cycles and their reverses use 48 of the 56 directed links once.
    topo = load_preset("mi300x-8")
    cycles = nvlink_cycles(topo)
    arcs = [(a, b) for c in cycles for a, b in zip(c, c[1:] + c[:1], strict=True)]
    assert len(cycles) == 6 and len(arcs) == len(set(arcs)) == 48


def test_unknown_algorithm_is_one_clear_error() -> None:
    topo = spec_topology(1, 4, "nvswitch", nics=0)
    with pytest.raises(BaselineError, match="not available for allgather"):
        nccl_schedule("allgather", "tree", topo)
    with pytest.raises(BaselineError, match="chunks must be >= 1"):
        nccl_schedule("allreduce", "ring", topo, chunks=0)
    with pytest.raises(BaselineError, match="root 9 is not a rank"):
        nccl_schedule("broadcast", "ring", topo, root=9)


def test_alltoall_ring_means_direct() -> None:
    topo = spec_topology(1, 4, "nvswitch", nics=0)
    s = nccl_schedule("alltoall", "ring", topo)
    assert len(s.transfers) == 12 and all(t.count == 1 for t in s.transfers)


@pytest.mark.parametrize(("coll", "algo"), ALL)
def test_presets_shape_schedules_are_correct(coll: Collective, algo: str) -> None:
    topo = spec_topology(2, 4, "nvswitch", nics=2, layout="rail")
    for channels, chunks in ((1, 1), (2, 3), (4, 1)):
        s = nccl_schedule(coll, algo, topo, chunks=chunks, channels=channels, root=5)
        check_schedule(s)
        assert s.channels == channels and s.nranks == 8


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=symmetric_topologies(),
    which=st.sampled_from(ALL),
    channels=st.integers(1, 4),
    chunks=st.integers(1, 3),
    root=st.integers(0, 63),
    in_flight=st.sampled_from([None, 0, 1, 2]),
)
def test_random_symmetric_topologies_pass_the_checker(
    topo, which, channels: int, chunks: int, root: int, in_flight: int | None
) -> None:
    coll, algo = which
    s = nccl_schedule(
        coll,
        algo,
        topo,
        chunks=chunks,
        channels=channels,
        root=root % topo.world_size,
        in_flight=in_flight,
    )
    check_schedule(s)
