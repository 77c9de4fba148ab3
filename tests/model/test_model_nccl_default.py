"""NCCL's default choice model and the simulated default estimate."""

from __future__ import annotations

import pytest
from cost_model_topos import spec_topology

from ccltune.api.common import Collective, Source
from ccltune.model.cost.busbw import busbw_gbps
from ccltune.model.cost.protocols import Arch, ll_max_bw
from ccltune.model.nccl.default import (
    default_estimate,
    nccl_default,
    nccl_graph,
    nccl_protocol_cost,
    nccl_step_bytes,
    predicted_time_us,
    simulation_shape,
    tree_ll128_chunk,
)


@pytest.fixture(scope="module")
def dgx() -> object:
    return spec_topology(1, 8, "nvswitch", nics=0, intra_bw=300.0, gpu_model="A100-SXM4-80GB")


@pytest.fixture(scope="module")
def two_nodes() -> object:
    return spec_topology(2, 8, "nvswitch", nics=8, layout="rail", intra_bw=300.0, nic_gbps=25.0)


def test_graph_model(dgx) -> None:
    g = nccl_graph(dgx)
    # 300 GB/s of NVLink per GPU, booked at NCCL's nominal 240 (20 per 25 GB/s lane): speed 40
    # (highest of the Ampere array that fits) x 6 channels, then NCCL duplicates channels of
    # >= 25 GB/s: 12 channels x 20 GB/s, and the kernels run 24 (HGX A100 logs: 24 channels).
    assert g.ring_bw_gbps == pytest.approx(240.0)
    assert g.speed_gbps == 20.0 and g.channels == 12 and g.comm_channels == 24
    assert g.ll128_ok and g.intra_kind == "nvlink"


def test_protocol_moves_from_ll_to_simple_with_size(dgx) -> None:
    small = nccl_default("allreduce", 1024, dgx).choice
    mid = nccl_default("allreduce", 16 << 20, dgx).choice
    big = nccl_default("allreduce", 1 << 30, dgx).choice
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    assert mid.protocol == "LL128"
    assert (big.algorithm, big.protocol) == ("ring", "Simple")
    # enqueue.cc: tiny messages run on one channel.
    # connect.cc ncclTopoPostset: the kernels run twice the search's 12 channels.
    assert small.channels == 1 and big.channels == nccl_graph(dgx).comm_channels == 24


def test_channel_duplication_follows_search_and_postset() -> None:
    # search.cc ncclTopoDupChannels: sm90 at 48 GB/s with 8 channels is not duplicated (25-50 GB/s,
    # > 4 channels); ncclTopoPostset still doubles them for the kernels.
    h100 = spec_topology(2, 8, "nvswitch", nics=8, intra_bw=450.0, nic_gbps=50.0,
                         gpu_model="H100-SXM5-80GB")  # fmt: skip
    g = nccl_graph(h100)
    assert (g.speed_gbps, g.channels, g.comm_channels) == (48.0, 8, 16)
    assert nccl_default("allreduce", 1 << 30, h100).choice.channels == 16
    # With 2 channels of 48 GB/s the search duplicates them (4 x 24), the postset doubles again.
    narrow = spec_topology(2, 8, "nvswitch", nics=8, gpu_model="H100-SXM5-80GB")
    g2 = nccl_graph(narrow)
    assert (g2.speed_gbps, g2.channels, g2.comm_channels) == (24.0, 4, 8)


def test_multi_node_small_allreduce_uses_tree(two_nodes) -> None:
    d = nccl_default("allreduce", 4096, two_nodes)
    assert d.choice.algorithm == "tree"
    assert d.predicted_time_us == min(d.table.values())
    assert nccl_default("allgather", 4096, two_nodes).choice.algorithm == "ring"


def test_no_ll128_without_nvlink_or_on_amd() -> None:
    pcie = spec_topology(1, 4, "pcie", nics=0)
    amd = spec_topology(1, 8, "fully_connected", nics=0, gpu_model="MI300X")
    for topo in (pcie, amd):
        d = nccl_default("allreduce", 16 << 20, topo)
        assert "ring/LL128" not in d.table and d.choice.protocol != "LL128"


def test_prediction_formula(dgx) -> None:
    g = nccl_graph(dgx)
    # Ring/Simple allreduce: latency 8.4 + 14 * 3.4; busBw = 12 ch * 20 GB/s; algbw = busBw * 8/14.
    size = 1 << 28
    expect = 8.4 + 14 * 3.4 + size / (1000 * 240.0 * 8 / 14)
    assert predicted_time_us("allreduce", "ring", "Simple", size, g) == pytest.approx(expect)


def test_alltoall_is_p2p(dgx) -> None:
    assert nccl_default("alltoall", 8 * 1024, dgx).choice.protocol == "LL"
    assert nccl_default("alltoall", 1 << 24, dgx).choice.describe() == "p2p/Simple"


def test_simulation_shape_budget() -> None:
    assert simulation_shape("allreduce", "tree", "Simple", 1 << 30, 8, 16, 10_000) == (41, 8)
    assert simulation_shape("allreduce", "ring", "Simple", 1 << 30, 8, 16, 10_000)[0] == 1
    assert simulation_shape("allreduce", "ring", "Simple", 1 << 30, 8, 512, 10_000) == (1, 1)


@pytest.mark.parametrize(
    "coll", ["allreduce", "allgather", "reducescatter", "broadcast", "alltoall"]
)
def test_default_estimate(two_nodes, coll: str) -> None:
    size = 1 << 22
    e = default_estimate(coll, size, two_nodes)
    assert e.source == Source.SIMULATED and e.size_bytes == size
    assert e.busbw_gbps == pytest.approx(busbw_gbps(coll, 16, size, e.time_us))
    assert e.bound_us is not None and 0 < e.bound_us <= e.time_us
    assert e.pct_of_bound is not None and 0 < e.pct_of_bound <= 100.0
    assert e.choice == nccl_default(coll, size, two_nodes).choice


def test_bad_size(dgx) -> None:
    with pytest.raises(ValueError, match="size must be positive"):
        nccl_default("allreduce", 0, dgx)


def test_single_gpu() -> None:
    one = spec_topology(1, 1, "pcie", nics=0)
    assert nccl_default("allreduce", 1024, one).predicted_time_us == 0.0
    with pytest.raises(ValueError, match="has 1 GPU"):
        default_estimate("allreduce", 1024, one)


def test_tree_ll128_chunks_follow_nccl() -> None:
    # enqueue.cc calcCollChunking, 2 nodes x 8: 8 MiB over 8 channels halves 576 000 three times;
    # a 1 GiB call keeps the full step; one node (ppn 8) needs fewer chunks per channel.
    assert tree_ll128_chunk(8 << 20, 8, 16, 2) == 72_000
    assert tree_ll128_chunk(1 << 30, 8, 16, 2) == 576_000
    assert simulation_shape("allreduce", "tree", "LL128", 8 << 20, 8, 16, 50_000, nnodes=2)[0] >= 14


def test_mid_size_tree_is_not_slower_than_a_bigger_ring(two_nodes) -> None:
    # Issue 14: tree/LL128 at 8 MiB was simulated with 2 pipeline chunks (891.7 us on dgx-a100-2,
    # three times ring's 16 MiB time); NCCL pipelines it in ~72 KB chunks.
    mid = default_estimate("allreduce", 8 << 20, two_nodes, with_bound=False)
    big = default_estimate("allreduce", 16 << 20, two_nodes, with_bound=False)
    assert mid.choice is not None and mid.choice.algorithm == "tree"
    assert mid.time_us < big.time_us


def test_ll_bandwidth_cap_is_the_cpu_vendors_across_nodes(two_nodes) -> None:
    # tuning.cc llMaxBws: the GPU row on one node, the CPU row (Intel: 39.0 GB/s at 2 nodes) across.
    assert ll_max_bw(Arch.AMPERE, 1) == 87.7 and ll_max_bw(Arch.HOPPER, 1) == 141.0
    assert ll_max_bw(Arch.AMPERE, 2) == 39.0 and ll_max_bw(Arch.AMPERE, 4, "amd") == 19.0


def test_ring_simple_steps_follow_nccl_slicing(dgx) -> None:
    # prims_simple.h: a ring chunk (min of 2 MiB and a channel's share per rank) in 2 slices of at
    # least 32 KiB: mid sizes pay many small steps, big ones 1 MiB steps.
    ar = Collective.ALLREDUCE
    assert nccl_step_bytes(ar, "ring", "Simple", 32 << 20, 24, dgx) == pytest.approx(
        (32 << 20) / (24 * 8) / 2
    )
    assert nccl_step_bytes(ar, "ring", "Simple", 1 << 30, 24, dgx) == 1 << 20
    assert nccl_step_bytes(ar, "ring", "Simple", 1 << 20, 24, dgx) == 32 * 1024
    assert nccl_step_bytes(ar, "ring", "LL", 1 << 20, 24, dgx) == 32 * 1024
    assert nccl_step_bytes(ar, "tree", "LL128", 8 << 20, 8, dgx) == tree_ll128_chunk(8 << 20, 8, 8, 1)


def test_threadblocks_bound_nccl(dgx) -> None:
    """A100: 12.5 GB/s per Simple threadblock; NVLink driven at 80% of 300 GB/s."""
    run = nccl_default("allreduce", 1 << 30, dgx).choice
    full = default_estimate("allreduce", 1 << 30, dgx, with_bound=False)
    assert full.busbw_gbps <= 240.0  # the links bind 24 threadblocks (300 GB/s of them)
    four = default_estimate("allreduce", 1 << 30, dgx, with_bound=False,
                            choice=run.model_copy(update={"channels": 4}))  # fmt: skip
    assert 0.8 * 4 * 12.5 <= four.busbw_gbps <= 4 * 12.5  # 4 threadblocks bind
    eight = default_estimate("allreduce", 1 << 30, dgx, with_bound=False,
                             choice=run.model_copy(update={"channels": 8}))  # fmt: skip
    assert four.time_us / eight.time_us == pytest.approx(2.0, rel=0.05)


def test_mid_sizes_pay_per_step_costs(dgx) -> None:
    # 8 MiB ring/Simple on 24 channels: 43.7 KB chunks in 2 slices each, 2.8 us per slice beyond
    # the hop: the per-step costs are a large part of the call.
    run = nccl_default("allreduce", 1 << 30, dgx).choice
    cost = nccl_protocol_cost(Collective.ALLREDUCE, "ring", "Simple", 8 << 20, 24, dgx)
    assert cost.step_latency_us == pytest.approx(2.8) and cost.launch_us == 8.4
    t = default_estimate("allreduce", 8 << 20, dgx, with_bound=False, choice=run).time_us
    # 14 ring steps, each: 2 slices x 2.8 + the 0.6 us hop + its chunk at a channel's 10 GB/s
    # share of the NVLink (240 GB/s over 24 channels); plus the launch (baseLat 8.4).
    chunk = (8 << 20) / (24 * 8)
    assert t == pytest.approx(8.4 + 14 * (2 * 2.8 + 0.6 + chunk / 10e3), rel=1e-6)
