"""Lower bounds: never above the simulated time of a correct schedule; tight where they should be."""

from __future__ import annotations

import pytest
from cost_model_topos import spec_topology, symmetric_topologies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccltune.api.cluster import ClusterNode, ClusterTopology, Device, DeviceKind, Link, LinkKind
from ccltune.model.cost.bounds import lower_bound
from ccltune.model.cost.busbw import busbw_gbps
from ccltune.model.cost.protocols import PROTOCOL_COSTS, SIMPLE
from ccltune.model.nccl.baselines import SUPPORTED, nccl_schedule_arrays
from ccltune.model.sim.simulate import simulate

ALL = [(c, a) for c, algos in SUPPORTED.items() for a in algos]


def star(n: int, bw: float = 100.0, lat: float = 1.0) -> ClusterTopology:
    """n GPUs on one switch, nothing else: the per-rank bound is exact for alltoall."""
    devices = [
        Device(id=f"n0/gpu{i}", kind=DeviceKind.GPU, node="n0", local_index=i) for i in range(n)
    ]
    devices.append(Device(id="n0/sw", kind=DeviceKind.NVSWITCH, node="n0"))
    links = [Link(a=f"n0/gpu{i}", b="n0/sw", kind=LinkKind.NVLINK, bandwidth_gbps=bw, latency_us=lat)
             for i in range(n)]  # fmt: skip
    return ClusterTopology(name="star", gpus_per_node=n, nodes=[ClusterNode(name="n0", gpus=n)],
                           devices=devices, links=links)  # fmt: skip


def test_alltoall_bound_is_exact_on_a_star() -> None:
    topo = star(4)
    size = 1 << 24
    b = lower_bound("alltoall", size, topo, SIMPLE)
    sim = simulate(nccl_schedule_arrays("alltoall", "direct", topo), topo, size, SIMPLE)
    assert b.time_us == pytest.approx(sim.time_us, rel=1e-9)
    assert b.binding in ("rank-bandwidth", "aggregate")
    # alpha (step + two 1 us hops) + 3/4 of the buffer over 100 GB/s
    assert b.time_us == pytest.approx(SIMPLE.step_latency_us + 2.0 + 0.75 * size / 100e3)


def test_bound_fields() -> None:
    topo = star(8)
    b = lower_bound("allreduce", 1 << 26, topo)
    assert b.binding in b.parts and b.time_us == max(b.parts.values())
    assert b.busbw_gbps == pytest.approx(busbw_gbps("allreduce", 8, 1 << 26, b.time_us))
    # Aggregate allreduce bound: 2(N-1)/N of the buffer per rank -> busbw <= link bandwidth.
    assert b.busbw_gbps <= 100.0 + 1e-9
    assert b.parts["aggregate"] > b.parts["rank-bandwidth"]


def test_tiny_messages_are_latency_bound() -> None:
    topo = spec_topology(2, 4, "nvswitch", nics=4, layout="rail", nic_lat=2.5)
    b = lower_bound("allgather", 8, topo, "LL")
    assert b.binding in ("hop-latency", "cut:node", "cut:rail")
    # Farthest pair crosses two NIC links (2 x 2.5 us) plus PCIe/leaf hops, plus one LL step.
    assert b.time_us > PROTOCOL_COSTS["LL"].step_latency_us + 5.0


def test_cut_bound_names_the_dimension() -> None:
    topo = spec_topology(2, 8, "nvswitch", nics=1, intra_bw=300.0, nic_gbps=12.5)
    b = lower_bound("allreduce", 1 << 28, topo)
    assert b.binding.startswith("cut:")  # one 100 Gb/s NIC per node is the bottleneck
    # M must leave the node over 12.5 GB/s.
    assert b.time_us >= (1 << 28) / 12.5e3


@pytest.mark.parametrize("bad", [0, -1])
def test_rejects_bad_size(bad: int) -> None:
    with pytest.raises(ValueError, match="size must be positive"):
        lower_bound("allreduce", bad, star(2))


def test_single_rank() -> None:
    assert lower_bound("allreduce", 1024, star(1)).time_us == 0.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=symmetric_topologies(),
    which=st.sampled_from(ALL),
    size=st.sampled_from([1, 1000, 1 << 16, 1 << 22, 1 << 27]),
    proto=st.sampled_from(sorted(PROTOCOL_COSTS)),
    channels=st.integers(1, 3),
    chunks=st.integers(1, 3),
    root=st.integers(0, 63),
)
def test_bound_never_exceeds_simulated_time(
    topo, which, size: int, proto: str, channels: int, chunks: int, root: int
) -> None:
    coll, algo = which
    root %= topo.world_size
    cost = PROTOCOL_COSTS[proto]
    sched = nccl_schedule_arrays(coll, algo, topo, chunks=chunks, channels=channels, root=root)
    sim = simulate(sched, topo, size, cost)
    b = lower_bound(coll, size, topo, cost, root=root)
    assert b.time_us <= sim.time_us * (1 + 1e-9), (b, sim.time_us)
