"""The bound at an SM budget (cost/sm_bound.py): never above a simulated schedule that runs on
that many threadblocks per GPU, equal to the link bound at SM-copy efficiency (NVLink x 0.8)
where threadblocks do not bind."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cost_model_topos import symmetric_topologies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccltune.api.cluster import ClusterNode, ClusterTopology, Device, DeviceKind, Link, LinkKind
from ccltune.api.common import Collective
from ccltune.model.cost.bounds import lower_bound
from ccltune.model.cost.gpu import NVLINK_SM_EFFICIENCY, gpu_physics
from ccltune.model.cost.protocols import BASE_LAT, PROTOCOL_COSTS, PROTOCOLS, protocol_cost
from ccltune.model.cost.sm_bound import (
    budget_bound_us,
    copy_link_bound_us,
    demand_bytes,
    sm_bound,
)
from ccltune.model.evaluate import common_bound_us
from ccltune.model.nccl.baselines import SUPPORTED, nccl_schedule_arrays
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.sim.capacity import threadblocks_per_rank
from ccltune.model.sim.simulate import simulate
from ccltune.synth.engine import default_threadblocks, synthesize
from ccltune.topology.presets import load_preset

MiB = 1 << 20


def test_demand_per_gpu() -> None:
    assert demand_bytes("allgather", 16, 16.0) == 15.0
    assert demand_bytes("reducescatter", 16, 16.0) == 15.0
    assert demand_bytes("alltoall", 4, 8.0) == 6.0
    assert demand_bytes("allreduce", 4, 8.0) == 12.0  # 2 (N-1)/N M
    assert demand_bytes("broadcast", 4, 8.0) == 8.0
    assert demand_bytes("allgather", 1, 8.0) == 0.0


def test_a800_allgather_at_eight_threadblocks() -> None:
    """The issue's example: 8 threadblocks at 12.5 GB/s receive at most 100 GB/s, so 64 MiB
    AllGather on 16 GPUs (15/16 of it into each) takes >= 629 us plus launch and a step."""
    topo = load_preset("syccl-a800-16")
    b = sm_bound("allgather", 64 * MiB, topo, 8)
    assert b.protocol == "Simple"
    bw_us = 15 / 16 * 64 * MiB / 100e3
    assert bw_us + BASE_LAT["ring"][2] < b.time_us < bw_us + BASE_LAT["ring"][2] + 5.0
    link = common_bound_us(Collective.ALLGATHER, 64 * MiB, topo)
    assert link < 0.6 * b.time_us  # the budget, not the links, binds here
    assert budget_bound_us("allgather", 64 * MiB, topo, 8, link) == b.time_us
    # Twice the threadblocks: the threadblock term halves (less the fixed part).
    assert sm_bound("allgather", 64 * MiB, topo, 16).time_us < 0.55 * b.time_us


@pytest.mark.parametrize("preset", ["syccl-a800-16", "h800-rail-64", "mi300x-8", "dgx-h100-2"])
@pytest.mark.parametrize("coll", list(Collective))
def test_equals_the_copy_link_bound_where_threadblocks_do_not_bind(
    preset: str, coll: Collective
) -> None:
    topo = load_preset(preset)
    for size in (64 * MiB, 1 << 30):
        link = common_bound_us(coll, size, topo)
        copy = copy_link_bound_us(coll, size, topo)
        # NVLink at 0.8 of line rate: at most 1/0.8 longer, never shorter.
        assert link * (1 - 1e-9) <= copy <= link / NVLINK_SM_EFFICIENCY
        assert budget_bound_us(coll, size, topo, 1 << 20, link) == max(link, copy)
        assert budget_bound_us(coll, size, topo, 1, link) > max(link, copy)
    # Tiny calls: what is left without threadblock limits is the launch and one step, which
    # the link bound does not count.
    link = common_bound_us(coll, 4 << 10, topo)
    unbound = budget_bound_us(coll, 4 << 10, topo, 1 << 20, link)
    assert link <= unbound <= max(link, max(BASE_LAT["ring"]) + 15.0)


def test_rail_allgather_counts_nvlink_at_copy_efficiency() -> None:
    """By hand (h800-rail-64: NVLink 200 GB/s, PCIe Gen5 x16 63 GB/s per GPU): a GPU takes in at
    most 0.8 x 200 + 63 = 223 GB/s of payload, so 1 GiB AllGather (63/64 of it into each GPU)
    takes >= 4,740 us plus a step and a hop; at line rate the bound said 263 GB/s, 4,022 us."""
    topo = load_preset("h800-rail-64")
    size = 1 << 30
    by_hand = 63 / 64 * size / ((0.8 * 200 + 63.0) * 1e3)
    copy = copy_link_bound_us("allgather", size, topo)
    assert by_hand < copy < by_hand + 5.0
    line = 63 / 64 * size / ((200 + 63.0) * 1e3)
    assert line < common_bound_us("allgather", size, topo) < line + 5.0
    # MI300X's xGMI is no NVLink: nothing changes there; an unknown GPU has no SM-copy model.
    mi = load_preset("mi300x-8")
    assert copy_link_bound_us("allgather", size, mi) == common_bound_us("allgather", size, mi)
    unknown = topo.model_copy(update={"gpu_model": "unknown-gpu"})
    assert copy_link_bound_us("allgather", size, unknown) == 0.0


def test_copy_link_bound_is_exact_for_alltoall_on_an_nvlink_star() -> None:
    """4 GPUs on one NVSwitch, nothing else: direct alltoall meets the per-rank bound, so the
    bound at 0.8 must equal the simulated time at 0.8, not merely stay below it."""
    devices = [
        Device(id=f"n0/gpu{i}", kind=DeviceKind.GPU, node="n0", local_index=i) for i in range(4)
    ] + [Device(id="n0/sw", kind=DeviceKind.NVSWITCH, node="n0")]
    links = [Link(a=f"n0/gpu{i}", b="n0/sw", kind=LinkKind.NVLINK, bandwidth_gbps=100.0,
                  latency_us=1.0) for i in range(4)]  # fmt: skip
    topo = ClusterTopology(name="star", gpus_per_node=4, nodes=[ClusterNode(name="n0", gpus=4)],
                           devices=devices, links=links)  # fmt: skip
    size = 1 << 24
    cost = replace(PROTOCOL_COSTS["Simple"], nvlink_efficiency=NVLINK_SM_EFFICIENCY)
    sim = simulate(nccl_schedule_arrays("alltoall", "direct", topo), topo, size, cost).time_us
    assert lower_bound("alltoall", size, topo, cost).time_us == pytest.approx(sim, rel=1e-9)
    assert sim == pytest.approx(cost.step_latency_us + 2.0 + 0.75 * size / 80e3)


ALL = [(c, a) for c, algos in SUPPORTED.items() for a in algos]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=symmetric_topologies(),
    which=st.sampled_from(ALL),
    size=st.sampled_from([1000, 1 << 16, 1 << 22, 1 << 27]),
    proto=st.sampled_from(sorted(PROTOCOL_COSTS)),
    channels=st.integers(1, 3),
    root=st.integers(0, 63),
)
def test_copy_link_bound_never_exceeds_simulated_time(
    topo, which, size: int, proto: str, channels: int, root: int
) -> None:
    """The link bound with NVLink at SM-copy efficiency against NCCL's schedules simulated with
    that efficiency (every algorithm, random symmetric clusters; tests/model/test_model_bounds.py
    does the same at line rate)."""
    coll, algo = which
    root %= topo.world_size
    cost = replace(PROTOCOL_COSTS[proto], nvlink_efficiency=NVLINK_SM_EFFICIENCY)
    sched = nccl_schedule_arrays(coll, algo, topo, chunks=2, channels=channels, root=root)
    sim = simulate(sched, topo, size, cost)
    b = lower_bound(coll, size, topo, cost, root=root)
    assert b.time_us <= sim.time_us * (1 + 1e-9), (b, sim.time_us)
    line = lower_bound(coll, size, topo, PROTOCOL_COSTS[proto], root=root)
    assert b.time_us >= line.time_us * (1 - 1e-9)


def test_no_bound_without_threadblock_physics() -> None:
    topo = load_preset("syccl-a800-16").model_copy(update={"gpu_model": "unknown-gpu"})
    assert sm_bound("allgather", 64 * MiB, topo, 8).time_us == 0.0
    with pytest.raises(ValueError, match="threadblocks"):
        sm_bound("allgather", 64 * MiB, topo, 0)


def _costs(topo):  # type: ignore[no-untyped-def]
    g = nccl_graph(topo)
    return [protocol_cost(p, link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
            for p in PROTOCOLS]  # fmt: skip


@pytest.mark.parametrize("preset", ["syccl-a800-16", "mi300x-8", "dgx-h100-2"])
@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                  Collective.ALLREDUCE, Collective.BROADCAST])  # fmt: skip
def test_nccl_rings_never_beat_it(preset: str, coll: Collective) -> None:
    """NCCL's rings on 1..8 channels (one threadblock each), every protocol, small to large."""
    topo = load_preset(preset)
    for channels in (1, 2, 8):
        arr = nccl_schedule_arrays(coll, "ring", topo, chunks=2, channels=channels)
        arr.tb = arr.channel
        tbs = threadblocks_per_rank(arr)
        assert tbs == channels
        for size in (64 << 10, 4 * MiB, 256 * MiB):
            bound = budget_bound_us(coll, size, topo, tbs, 0.0)  # threadblocks, copy links
            for cost in _costs(topo):
                t = simulate(arr, topo, size, cost).time_us
                assert t >= bound * (1 - 1e-9), (channels, size, cost.name, t, bound)


@pytest.mark.parametrize(("preset", "coll", "budget"), [
    ("syccl-a800-16", Collective.ALLGATHER, 8),
    ("syccl-a800-16", Collective.REDUCESCATTER, 16),
    ("mi300x-8", Collective.ALLREDUCE, 16),
    ("dgx-h100-2", Collective.ALLGATHER, None),
])  # fmt: skip
def test_synthesized_schedules_never_beat_it(preset: str, coll: Collective,
                                             budget: int | None) -> None:  # fmt: skip
    """Every variant synthesis assembled, at the threadblocks it needs, every protocol; and every
    size's pick (file or NCCL) against the budget the files were fitted to."""
    topo = load_preset(preset)
    sizes = [256 << 10, 64 * MiB, 512 * MiB]
    res = synthesize(topo, coll, sizes, max_threadblocks=budget)
    assert res.schedules
    for arr in res.schedules.values():
        tbs = threadblocks_per_rank(arr)
        for size in sizes:
            bound = budget_bound_us(coll, size, topo, tbs, 0.0)  # threadblocks, copy links
            for cost in _costs(topo):
                t = simulate(arr, topo, size, cost, engine="symmetric").time_us
                assert t >= bound * (1 - 1e-9), (arr.name, size, cost.name, t, bound)
    # NCCL's default runs on its own channel count, which an explicit budget may undercut.
    nccl_tbs = max(res.max_threadblocks, default_threadblocks(coll, topo, sizes))
    for s in res.sizes:
        bound = budget_bound_us(coll, s.size_bytes, topo, res.max_threadblocks, s.bound_us)
        if not s.chosen.startswith("nccl:"):
            assert s.estimate.time_us >= bound * (1 - 1e-9)
        bound = budget_bound_us(coll, s.size_bytes, topo, nccl_tbs, s.bound_us)
        assert s.default.time_us >= bound * (1 - 1e-9)


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER])
def test_rail_variants_never_beat_it(coll: Collective) -> None:
    """h800-rail-64, where the copy-efficiency link bound binds: every assembled variant (engine
    schedules, not files: a file only adds waits), every protocol."""
    topo = load_preset("h800-rail-64")
    sizes = [4 * MiB, 64 * MiB, 1 << 30]
    res = synthesize(topo, coll, sizes, evaluate=False)
    assert res.schedules
    for arr in res.schedules.values():
        tbs = threadblocks_per_rank(arr)
        for size in sizes:
            bound = budget_bound_us(coll, size, topo, tbs, 0.0)
            assert bound >= copy_link_bound_us(coll, size, topo) > 0.0
            for cost in _costs(topo):
                t = simulate(arr, topo, size, cost, engine="symmetric").time_us
                assert t >= bound * (1 - 1e-9), (arr.name, size, cost.name, t, bound)
