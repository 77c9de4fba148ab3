"""Router: directed channels, shortest (hops, latency) paths, GPUs never transit, ECMP."""

from __future__ import annotations

import itertools

import pytest
from cost_model_topos import spec_topology

from ccltune.api.cluster import ClusterNode, ClusterTopology, Device, Link
from ccltune.model.sim.routing import Router, RoutingError


def rail_cluster(nodes: int = 2, gpus: int = 4, spines: int = 2) -> ClusterTopology:
    """Per node: GPUs on one NVSwitch, one NIC per GPU; NIC i on rail leaf i; leaves to spines."""
    devices, links = [], []
    for n in range(nodes):
        sw = f"n{n}/nvsw"
        devices.append(Device(id=sw, kind="nvswitch", node=f"n{n}"))
        for g in range(gpus):
            gpu, nic = f"n{n}/gpu{g}", f"n{n}/nic{g}"
            devices += [
                Device(id=gpu, kind="gpu", node=f"n{n}", local_index=g),
                Device(id=nic, kind="nic", node=f"n{n}"),
            ]
            links += [
                Link(a=gpu, b=sw, kind="nvlink", bandwidth_gbps=200, latency_us=0.5),
                Link(a=gpu, b=nic, kind="pcie", bandwidth_gbps=50, latency_us=0.25),
                Link(a=nic, b=f"leaf{g}", kind="net", bandwidth_gbps=50, latency_us=1.0),
            ]
    for g in range(gpus):
        devices.append(Device(id=f"leaf{g}", kind="leaf"))
        for s in range(spines):
            links.append(
                Link(a=f"leaf{g}", b=f"spine{s}", kind="net", bandwidth_gbps=100, latency_us=1.0)
            )
    devices += [Device(id=f"spine{s}", kind="spine") for s in range(spines)]
    return ClusterTopology(
        name="rail",
        gpus_per_node=gpus,
        nodes=[ClusterNode(name=f"n{n}", gpus=gpus) for n in range(nodes)],
        devices=devices,
        links=links,
    )


def names(router: Router, path: tuple[int, ...]) -> list[str]:
    return [router.channel_name(c) for c in path]


def test_channels_are_two_directions_of_each_link() -> None:
    topo = rail_cluster()
    r = Router(topo)
    assert r.nchannels == 2 * len(topo.links)
    for i, link in enumerate(topo.links):
        assert r.channel_name(2 * i) == f"{link.a}->{link.b}"
        assert r.channel_name(2 * i + 1) == f"{link.b}->{link.a}"
        assert r.capacity[2 * i] == r.capacity[2 * i + 1] == link.bandwidth_gbps
        assert r.latency[2 * i] == r.latency[2 * i + 1] == link.latency_us


def test_intra_node_goes_through_nvswitch() -> None:
    r = Router(rail_cluster())
    assert names(r, r.path(0, 3)) == ["n0/gpu0->n0/nvsw", "n0/nvsw->n0/gpu3"]
    assert r.path_latency(0, 3) == pytest.approx(1.0)
    assert r.path_bandwidth(0, 3) == 200


def test_same_rail_stays_on_the_leaf() -> None:
    r = Router(rail_cluster())
    assert names(r, r.path(1, 5)) == [
        "n0/gpu1->n0/nic1",
        "n0/nic1->leaf1",
        "leaf1->n1/nic1",
        "n1/nic1->n1/gpu1",
    ]


def test_cross_rail_crosses_a_spine_never_a_gpu() -> None:
    topo = rail_cluster()
    r = Router(topo)
    for src in range(topo.world_size):
        for dst in range(topo.world_size):
            if src == dst:
                continue
            p = r.path(src, dst)
            inner = [r.vertex_names[r.chan_dst[c]] for c in p[:-1]]
            assert not any("gpu" in v for v in inner), (src, dst, inner)
            assert r.vertex_names[r.chan_src[p[0]]] == topo.gpu_id(src)
            assert r.vertex_names[r.chan_dst[p[-1]]] == topo.gpu_id(dst)
            # consecutive channels connect
            for a, b in itertools.pairwise(p):
                assert r.chan_dst[a] == r.chan_src[b]
    assert len(r.path(0, 5)) == 6  # gpu-nic-leaf0-spine-leaf1-nic-gpu


def test_ecmp_spreads_over_spines_deterministically() -> None:
    topo = rail_cluster(nodes=4, gpus=4, spines=4)
    r1, r2 = Router(topo), Router(topo)
    used = set()
    for src in range(4):
        for dst in range(4, 16):
            if src % 4 != dst % 4:
                p = r1.path(src, dst)
                assert p == r2.path(src, dst)
                used.update(n for n in names(r1, p) if n.startswith("spine"))
    assert len(used) > 1
    fixed = Router(topo, ecmp=False)
    spines = {
        n.split("->")[0]
        for src in range(4)
        for dst in range(5, 16, 4)
        for n in names(fixed, fixed.path(src, dst))
        if n.startswith("spine")
    }
    assert spines == {"spine0"}


def test_fewer_hops_beat_lower_latency_then_latency_breaks_ties() -> None:
    gpus = ["n0/gpu0", "n0/gpu1"]
    links = [
        # 2 hops, slow
        Link(a=gpus[0], b="swA", kind="nvlink", bandwidth_gbps=10, latency_us=50),
        Link(a="swA", b=gpus[1], kind="nvlink", bandwidth_gbps=10, latency_us=50),
        # 3 hops, fast
        Link(a=gpus[0], b="swB", kind="nvlink", bandwidth_gbps=10, latency_us=1),
        Link(a="swB", b="swC", kind="nvlink", bandwidth_gbps=10, latency_us=1),
        Link(a="swC", b=gpus[1], kind="nvlink", bandwidth_gbps=10, latency_us=1),
        # 2 hops, faster than swA
        Link(a=gpus[0], b="swD", kind="nvlink", bandwidth_gbps=10, latency_us=5),
        Link(a="swD", b=gpus[1], kind="nvlink", bandwidth_gbps=10, latency_us=5),
    ]
    topo = ClusterTopology(
        name="t", gpus_per_node=2, nodes=[ClusterNode(name="n0", gpus=2)], links=links
    )
    r = Router(topo)
    assert names(r, r.path(0, 1)) == ["n0/gpu0->swD", "swD->n0/gpu1"]
    assert r.path_latency(0, 1) == 10


def test_gpu_chain_is_unreachable_and_errors_are_clear() -> None:
    links = [
        Link(a="n0/gpu0", b="n0/gpu1", kind="nvlink", bandwidth_gbps=10),
        Link(a="n0/gpu1", b="n0/gpu2", kind="nvlink", bandwidth_gbps=10),
    ]
    topo = ClusterTopology(
        name="chain", gpus_per_node=4, nodes=[ClusterNode(name="n0", gpus=4)], links=links
    )
    r = Router(topo)
    assert len(r.path(0, 1)) == 1
    with pytest.raises(RoutingError, match=r"rank 0 \(n0/gpu0\) cannot reach rank 2 \(n0/gpu2\)"):
        r.path(0, 2)
    with pytest.raises(RoutingError, match=r"rank 3 \(n0/gpu3\) has no links"):
        r.path(0, 3)
    with pytest.raises(RoutingError, match="rank 7 is outside"):
        r.path(0, 7)
    with pytest.raises(RoutingError, match="itself"):
        r.path(1, 1)


def test_paths_csr_matches_path() -> None:
    r = Router(rail_cluster())
    pairs = [(0, 1), (0, 5), (6, 2)]
    off, chans, lat = r.paths_csr(pairs)
    for i, (s, d) in enumerate(pairs):
        assert tuple(chans[off[i] : off[i + 1]].tolist()) == r.path(s, d)
        assert lat[i] == pytest.approx(r.path_latency(s, d))


def test_inter_node_routes_leave_by_the_source_gpus_home_nic() -> None:
    # Two GPUs and two NICs per PCIe switch, NIC i on rail i, rails joined by a spine (the
    # MI300X 2x8 set's shape). A route to a GPU on another rail must still leave by the source's
    # own NIC (NCCL's channel NIC), not by a rail an ECMP hash picks at the spine.
    topo = spec_topology(2, 8, "fully_connected", nics=8, layout="rail",
                         tiers=[{"name": "rail", "size": 2},
                                {"name": "spine", "size": 1, "oversubscription": 1.0}])  # fmt: skip
    r = Router(topo)
    names = r.vertex_names
    first_nics = set()
    for src in range(8):
        home = names[int(r.home_nic[r.rank_vertex[src]])]
        for dst in range(8, 16):
            nics = [r.channel_name(c).split("->")[0] for c in r.path(src, dst)]
            nics = [n for n in nics if "nic" in n]
            assert nics[0] == home, (src, dst, nics)
        first_nics.add(home)
    assert len(first_nics) == 8  # every NIC of the node is some GPU's home
