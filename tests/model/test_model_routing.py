"""Router: directed channels, shortest (hops, latency) paths, GPUs never transit, ECMP, and\nNCCL's NIC per channel between nodes."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from cost_model_topos import spec_topology

from ccltune.api.cluster import ClusterNode, ClusterTopology, Device, Link
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.nccl.baselines import direct_alltoall
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.capacity import step_count
from ccltune.model.sim.routing import Router, RoutingError, local_nets
from ccltune.model.sim.simulate import simulate
from ccltune.topology.cluster_file import load_text
from ccltune.topology.errors import TopologyError


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


def _nics_on(r: Router, path: tuple[int, ...]) -> list[str]:
    return [r.vertex_names[r.chan_src[c]] for c in path if "nic" in r.vertex_names[r.chan_src[c]]]


def _two_nodes(nics: int, gpus_per_switch: int = 2, layout: str = "rail") -> ClusterTopology:
    return load_text(f"""
kind: ClusterSpec
name: t-{nics}nic
gpuModel: A100-SXM4-40GB
servers: 2
gpusPerServer: 8
intraNode: {{fabric: nvswitch, bandwidthGbps: 300}}
pcie: {{generation: 5, gpusPerSwitch: {gpus_per_switch}, cpus: 2}}
nics: {{perServer: {nics}, rateGbps: 100}}
network: {{layout: {layout}, tiers: [{{name: rail, size: 2}}, {{name: spine, size: 1}}]}}
""")


def test_receivers_nic_when_near_else_own_nic() -> None:
    # Two GPUs and two NICs per PCIe switch, NIC i on rail i, rails joined by a spine (the
    # MI300X 2x8 set's shape). NCCL's p2p rule: the sender takes the NIC the receiver's local
    # index uses when that NIC is near it too (then the route stays on one rail), else its own;
    # never a rail an ECMP hash picks at the spine.
    topo = spec_topology(2, 8, "fully_connected", nics=8, layout="rail",
                         tiers=[{"name": "rail", "size": 2},
                                {"name": "spine", "size": 1, "oversubscription": 1.0}])  # fmt: skip
    r = Router(topo)
    assert r.nic_period == 1
    for src in range(8):
        own = r.vertex_names[int(r.home_nic[r.rank_vertex[src]])]
        assert own == f"node0/nic{src}"  # one NIC each, in NIC order
        for dst in range(8, 16):
            nics = _nics_on(r, r.path(src, dst))
            if dst % 8 // 2 == src // 2:  # the receiver's NIC is under the sender's switch
                assert nics == [f"node0/nic{dst % 8}", f"node1/nic{dst % 8}"], (src, dst)
            else:
                assert nics[0] == own, (src, dst, nics)


def test_a_gpu_with_two_nics_uses_both_across_two_channels() -> None:
    # OCI BM.GPU4.8 shape: 4 NICs and 2 GPUs per PCIe switch. ncclTopoGetLocalNet gives each GPU
    # ceil(4/2) = 2 NICs; GPU 1 starts at mirrorBits(1, 4) = 2.
    topo = _two_nodes(16)
    r = Router(topo)
    assert r.nic_period == 2
    name = r.vertex_names
    assert [name[n] for n in r.nic_choices[r.rank_vertex[0]]] == ["node0/nic0", "node0/nic1"]
    assert [name[n] for n in r.nic_choices[r.rank_vertex[1]]] == ["node0/nic2", "node0/nic3"]
    assert _nics_on(r, r.path(0, 8, 0)) == ["node0/nic0", "node1/nic0"]
    assert _nics_on(r, r.path(0, 8, 1)) == ["node0/nic1", "node1/nic1"]
    assert r.path(0, 8, 2) == r.path(0, 8, 0)  # the slot is the channel mod the period
    # Two equal transfers leaving GPU 0: on two channels each has a NIC, on one they share it.
    one = _transfers(topo, [(0, 8, 0), (0, 8, 0)])
    two = _transfers(topo, [(0, 8, 0), (0, 8, 1)])
    t1 = simulate(one, topo, 1 << 30, router=r).time_us
    t2 = simulate(two, topo, 1 << 30, router=r).time_us
    assert t2 == pytest.approx(t1 / 2, rel=0.02)


def test_four_nics_for_eight_gpus_are_shared() -> None:
    # p4d/p4de shape: one NIC per PCIe switch, two GPUs on it: both use it on every channel.
    topo = _two_nodes(4)
    r = Router(topo)
    assert r.nic_period == 1
    for ch in range(4):
        assert _nics_on(r, r.path(0, 8, ch)) == ["node0/nic0", "node1/nic0"]
        assert _nics_on(r, r.path(1, 9, ch)) == ["node0/nic0", "node1/nic0"]
    alone = _transfers(topo, [(0, 8, 0)])
    shared = _transfers(topo, [(0, 8, 0), (1, 9, 1)])
    t1 = simulate(alone, topo, 1 << 30, router=r).time_us
    t2 = simulate(shared, topo, 1 << 30, router=r).time_us
    assert t2 == pytest.approx(2 * t1, rel=0.02)


def test_more_nics_than_gpus_spread_over_channels() -> None:
    # AWS p5 shape: 32 NICs, one GPU and four NICs per PCIe switch: four channels, four NICs.
    topo = _two_nodes(32, gpus_per_switch=1)
    r = Router(topo)
    assert r.nic_period == 4
    for g in range(8):
        used = {_nics_on(r, r.path(g, 8 + g, ch))[0] for ch in range(4)}
        assert used == {f"node0/nic{4 * g + k}" for k in range(4)}, g
    per_nic = _transfers(topo, [(0, 8, ch) for ch in range(4)])
    one_nic = _transfers(topo, [(0, 8, 0)] * 4)
    assert simulate(per_nic, topo, 1 << 30, router=r).time_us == pytest.approx(
        simulate(one_nic, topo, 1 << 30, router=r).time_us / 4, rel=0.02)  # fmt: skip


def test_intra_node_and_single_nic_routes_ignore_the_channel() -> None:
    topo = _two_nodes(16)
    r = Router(topo)
    for ch in range(4):
        assert r.path(0, 3, ch) == r.path(0, 3)
    src = np.array([0, 0, 0, 9], dtype=np.int32)
    dst = np.array([3, 8, 8, 1], dtype=np.int32)
    assert r.nic_slots(src, dst, np.array([1, 1, 2, 3])).tolist() == [0, 1, 0, 1]
    single = Router(rail_cluster())
    assert single.nic_period == 1
    assert single.path(1, 5, 3) == single.path(1, 5)


def test_symmetric_engine_agrees_with_channel_dependent_routes() -> None:
    # Routes keyed by NIC slot must still commute with the fabric's translations where they do.
    topo = _two_nodes(16)
    r = Router(topo)
    arr = direct_alltoall(topo, channels=2)
    cost = protocol_cost("Simple")
    full = simulate(arr, topo, 1 << 26, cost, r, engine="heap")
    sym = simulate(arr, topo, 1 << 26, cost, r, engine="symmetric")
    assert sym.engine == "symmetric", sym.note
    assert sym.time_us == pytest.approx(full.time_us, rel=1e-9)
    np.testing.assert_allclose(sym.finish_us, full.finish_us, rtol=1e-9)


def _with_transport(extra: str) -> ClusterTopology:
    return load_text(f"""
kind: ClusterSpec
name: t-transport
servers: 2
gpusPerServer: 2
intraNode: {{fabric: nvswitch, bandwidthGbps: 300}}
nics: {{perServer: 2, rateGbps: 200{extra}}}
""")


def test_tcpx_per_message_cost_appears_in_time() -> None:
    rdma = _with_transport("")
    tcpx = _with_transport(", transport: {kind: tcpx, perMessageUs: 10}")
    cost = protocol_cost("Simple")
    inter = _transfers(rdma, [(0, 2, 0)])
    size = 1 << 26
    nbytes = np.asarray([size / (rdma.world_size * 4)])
    steps = float(step_count(nbytes, cost)[0])
    assert steps > 1  # several network messages
    t_rdma = simulate(inter, rdma, size, cost).time_us
    t_tcpx = simulate(inter, tcpx, size, cost).time_us
    assert t_tcpx - t_rdma == pytest.approx(10 * steps, rel=1e-9)
    intra = _transfers(rdma, [(0, 1, 0)])  # inside a node no network message is sent
    assert simulate(intra, tcpx, size, cost).time_us == simulate(intra, rdma, size, cost).time_us
    efa = _with_transport(", transport: {kind: efa}")  # the published default (3 us)
    assert simulate(inter, efa, size, cost).time_us - t_rdma == pytest.approx(3 * steps, rel=1e-9)


@pytest.mark.parametrize(
    ("extra", "field"),
    [(", transport: {kind: tcpx}", "nics.transport"),
     (", transport: {kind: efa, perMessageUs: -1}", "nics.transport.perMessageUs"),
     (", transport: {kind: ib}", "nics.transport.kind")],
)  # fmt: skip
def test_bad_transport_names_the_field(extra: str, field: str) -> None:
    with pytest.raises(TopologyError, match=rf"{re.escape(field)}: "):
        _with_transport(extra)


def test_local_nets_follow_nccl() -> None:
    # topo.cc ncclTopoGetLocalNet: start dev % G, bit-mirrored for a power-of-two NIC count.
    near = ("a", "b", "c", "d")
    assert [local_nets(near, 2, dev) for dev in (0, 1)] == [("a", "b"), ("c", "d")]
    assert [local_nets(near, 4, dev) for dev in range(4)] == [("a",), ("c",), ("b",), ("d",)]
    assert local_nets(("a",), 2, 1) == ("a",)
    assert local_nets(("a", "b", "c"), 1, 0) == ("a", "b", "c")


def _transfers(topo: ClusterTopology, moves: list[tuple[int, int, int]]) -> ScheduleArrays:
    """Independent equal transfers (src, dst, channel): one chunk of size / (N * 4) each."""
    n = len(moves)
    return ScheduleArrays(
        name="t", collective=Collective.ALLTOALL, nranks=topo.world_size, chunks_per_rank=4,
        src=np.array([m[0] for m in moves], dtype=np.int32),
        dst=np.array([m[1] for m in moves], dtype=np.int32),
        chunk=np.arange(n, dtype=np.int64), count=np.ones(n, dtype=np.int32),
        reduce=np.zeros(n, dtype=bool), channel=np.array([m[2] for m in moves], dtype=np.int32),
        dep_ptr=np.zeros(n + 1, dtype=np.int64), dep_idx=np.zeros(0, dtype=np.int64),
    )  # fmt: skip
