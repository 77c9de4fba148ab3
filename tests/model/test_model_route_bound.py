"""The link bound counts into a GPU only the links some simulated route uses (cost/bounds.py
`routed_links`): on a mesh no transfer enters a GPU by its PCIe link, since every peer is one
NVLink hop away (sim/routing.py routes by hop count first). Checked against the router itself,
NCCL's schedules on random meshes and presets, and the mesh synthesis's schedules and files."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import Collective
from ccltune.model.cost.bounds import _Graph, graph_of, lower_bound
from ccltune.model.cost.gpu import NVLINK_SM_EFFICIENCY, gpu_physics
from ccltune.model.cost.protocols import PROTOCOL_COSTS, PROTOCOLS, ProtocolCost, protocol_cost
from ccltune.model.cost.sm_bound import budget_bound_us, copy_link_bound_us
from ccltune.model.nccl.baselines import SUPPORTED, nccl_schedule_arrays
from ccltune.model.nccl.default import default_estimate, nccl_default, nccl_graph
from ccltune.model.sim.capacity import threadblocks_per_rank
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth.engine import synthesize
from ccltune.topology.cluster_file import from_spec
from ccltune.topology.load import load_cluster
from ccltune.topology.presets import list_presets, load_preset
from ccltune.topology.spec import ClusterSpec

MiB = 1 << 20
SMALL_PRESETS = [p for p in list_presets() if load_preset(p).world_size <= 64]
EXAMPLES = ["examples/clusters/dgx1-v100-cubemesh.yaml", "examples/clusters/a100-rail-4node.yaml",
            "examples/clusters/h100-wire-dims.yaml"]  # fmt: skip


def _cluster(name: str) -> ClusterTopology:
    return load_cluster(name) if name.endswith(".yaml") else load_preset(name)


def test_cube_mesh_gpu_receives_over_its_nvlinks_only() -> None:
    """By hand: GPU 0 of the quad has 1 + 1 + 2 NVLinks of 25 GB/s to its three peers, 80 GB/s at
    SM-copy efficiency; it must receive 3/4 of a 64 MiB AllGather, >= 629 us. Counting its
    PCIe link (15.754 GB/s), which no route into it uses, the bound said 529 us."""
    topo = load_preset("v100-cubemesh-4")
    g = graph_of(topo)
    assert [g.injection_at(r, NVLINK_SM_EFFICIENCY) for r in range(4)] == [80.0, 80.0, 100.0, 100.0]
    by_hand = 0.75 * 64 * MiB / 80e3
    copy = copy_link_bound_us("allgather", 64 * MiB, topo)
    assert by_hand < copy < by_hand + 5.0
    cost = replace(PROTOCOL_COSTS["Simple"], nvlink_efficiency=NVLINK_SM_EFFICIENCY)
    assert lower_bound("allgather", 64 * MiB, topo, cost).binding == "rank-bandwidth"


def test_pcie_counts_where_a_route_uses_it() -> None:
    """A40 pairs: every GPU reaches 6 of its 7 peers over PCIe, so its PCIe link counts; a
    multi-node preset's GPU reaches the network through PCIe; MI300X's full xGMI mesh does not."""
    a40 = load_preset("a40-pcie-8")
    g = graph_of(a40)
    assert g.injection_at(0, 1.0) == pytest.approx(56.25 + 31.508)
    h100 = load_preset("dgx-h100-2")
    assert graph_of(h100).injection_at(0, 1.0) == pytest.approx(450.0 + 63.015)
    mi = load_preset("mi300x-8")
    assert graph_of(mi).injection_at(0, 1.0) == pytest.approx(7 * 64.0)


def _assert_routes_use_counted_links(topo: ClusterTopology, g: _Graph) -> None:
    router = Router(topo)
    n = topo.world_size
    counted = [set(g.routed_links(r)) for r in range(n)]
    slots = range(router.nic_period)
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            for slot in slots:
                path = router.path(src, dst, slot)
                # channel 2i / 2i+1 is link i in each direction (routing.py)
                assert path[0] // 2 in counted[src], (src, dst, slot, router.channel_name(path[0]))
                assert path[-1] // 2 in counted[dst], (src, dst, slot, router.channel_name(path[-1]))


@pytest.mark.parametrize("name", SMALL_PRESETS + EXAMPLES)
def test_every_route_enters_and_leaves_by_a_counted_link(name: str) -> None:
    """What makes the bound true: the first and last link of every route the simulator takes,
    every NIC slot, is among the links the bound counts for its sender and receiver; also
    with the search run for every rank (`links_on_routes`)."""
    topo = _cluster(name)
    g = _Graph(topo)
    _assert_routes_use_counted_links(topo, g)
    g.routed_links = g.links_on_routes  # type: ignore[method-assign]
    _assert_routes_use_counted_links(topo, g)


@st.composite
def meshes(draw: st.DrawFn) -> ClusterTopology:
    """Random servers of 3-6 GPUs joined by 0-2 NVLinks per pair, a PCIe tree whose latency may
    be 0 (a PCIe route as short as an NVSwitch's), one or two servers."""
    gpus = draw(st.integers(3, 6))
    pairs = [(a, b) for a in range(gpus) for b in range(a + 1, gpus)]
    counts = draw(st.lists(st.integers(0, 2), min_size=len(pairs), max_size=len(pairs)))
    links = [[a, b, c] for (a, b), c in zip(pairs, counts, strict=True) if c]
    if not links:
        links = [[0, 1, 1]]
    servers = draw(st.integers(1, 2))
    data: dict = {
        "name": "random-mesh",
        "gpuModel": draw(st.sampled_from(["V100-SXM2-32GB", "A100-SXM4-80GB"])),
        "servers": servers,
        "gpusPerServer": gpus,
        "intraNode": {"fabric": "mesh", "linkBandwidthGbps": draw(st.sampled_from([25.0, 50.0])),
                      "latencyUs": draw(st.sampled_from([0.0, 0.6, 1.5])), "links": links},
        "pcie": {"generation": draw(st.sampled_from([3, 4])), "lanes": 16,
                 "gpusPerSwitch": draw(st.integers(0, 2)), "cpus": 1,
                 "latencyUs": draw(st.sampled_from([0.0, 0.5]))},
    }  # fmt: skip
    if servers > 1:
        data["nics"] = {"perServer": draw(st.sampled_from([1, 2])), "rateGbps": 100.0,
                        "latencyUs": 2.5}  # fmt: skip
        data["network"] = {"layout": "tor", "tiers": []}
    return from_spec(ClusterSpec.model_validate(data))


ALL = [(c, a) for c, algos in SUPPORTED.items() for a in algos]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=meshes(),
    which=st.sampled_from(ALL),
    size=st.sampled_from([1000, 1 << 16, 1 << 22, 1 << 27]),
    proto=st.sampled_from(sorted(PROTOCOL_COSTS)),
    channels=st.integers(1, 3),
    root=st.integers(0, 63),
)
def test_random_meshes_never_beat_it(
    topo: ClusterTopology, which: tuple[Collective, str], size: int, proto: str, channels: int,
    root: int,
) -> None:  # fmt: skip
    """NCCL's schedules on random meshes, NVLink at line rate and at SM-copy efficiency, and
    every route of the cluster on a counted link."""
    _assert_routes_use_counted_links(topo, graph_of(topo))
    coll, algo = which
    root %= topo.world_size
    sched = nccl_schedule_arrays(coll, algo, topo, chunks=2, channels=channels, root=root)
    for eff in (1.0, NVLINK_SM_EFFICIENCY):
        cost = replace(PROTOCOL_COSTS[proto], nvlink_efficiency=eff)
        sim = simulate(sched, topo, size, cost).time_us
        b = lower_bound(coll, size, topo, cost, root=root)
        assert b.time_us <= sim * (1 + 1e-9), (b, sim)


@pytest.mark.parametrize("name", SMALL_PRESETS)
def test_nccl_default_never_beats_it_on_presets(name: str) -> None:
    """NCCL's default choice, simulated as the model runs it, against the bound at its own
    channel count (one threadblock each), every collective, small to large."""
    topo = load_preset(name)
    channels = nccl_graph(topo).run_channels
    for coll in Collective:
        for size in (64 << 10, 64 * MiB, 1 << 30):
            est = default_estimate(coll, size, topo, with_bound=False)
            run = nccl_default(coll, size, topo).choice.channels or channels
            bound = budget_bound_us(coll, size, topo, run, 0.0)
            assert est.time_us >= bound * (1 - 1e-9), (coll, size, est.time_us, bound)


def _costs(topo: ClusterTopology) -> list[ProtocolCost]:
    g = nccl_graph(topo)
    return [protocol_cost(p, link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
            for p in PROTOCOLS]  # fmt: skip


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                  Collective.ALLREDUCE, Collective.ALLTOALL])  # fmt: skip
def test_cube_mesh_schedules_and_files_never_beat_it(coll: Collective) -> None:
    """Every schedule the mesh synthesis assembled on the quad, at the threadblocks it needs and
    every protocol, and every size's file (as published) or NCCL's default."""
    topo = load_preset("v100-cubemesh-4")
    sizes = [256 << 10, 4 * MiB, 64 * MiB, 512 * MiB]
    res = synthesize(topo, coll, sizes)
    assert res.schedules
    for arr in res.schedules.values():
        tbs = threadblocks_per_rank(arr)
        for size in sizes:
            bound = budget_bound_us(coll, size, topo, tbs, 0.0)
            for cost in _costs(topo):
                t = simulate(arr, topo, size, cost, engine="symmetric").time_us
                assert t >= bound * (1 - 1e-9), (arr.name, size, cost.name, t, bound)
    for s in res.sizes:
        bound = budget_bound_us(coll, s.size_bytes, topo, res.max_threadblocks, s.bound_us)
        assert s.estimate.time_us >= bound * (1 - 1e-9), (s.size_bytes, s.chosen)
