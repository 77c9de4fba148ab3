"""cost.py: NCCL's published numbers and latency formulas (tuning.cc, v2.19)."""

from __future__ import annotations

import pytest

from ccltune.api.cluster import LinkKind
from ccltune.model.cost.gpu import LL_OF_SIMPLE, Family, gpu_physics
from ccltune.model.cost.protocols import (
    LL,
    LL128,
    PROTOCOL_COSTS,
    SIMPLE,
    STEP_BYTES,
    Arch,
    arch_of,
    canonical_algorithm,
    canonical_protocol,
    comp_cap_of,
    nccl_latency_us,
    protocol_cost,
    tree_correction,
)


def test_protocol_costs_from_wire_formats() -> None:
    assert set(PROTOCOL_COSTS) == {"LL", "LL128", "Simple"}
    assert LL.efficiency == 0.5  # 4 data bytes + 4 flag bytes
    assert LL128.efficiency == pytest.approx(120 / 128)
    assert SIMPLE.efficiency == 1.0 and SIMPLE.tb_gbps is None
    # Step cost: NCCL's ring hwLat over NVLink (0.6 / 1.9 / 3.4) beyond LL's, the hop itself.
    assert (LL.step_latency_us, LL128.step_latency_us, SIMPLE.step_latency_us) == (0.0, 1.3, 2.8)
    assert SIMPLE is PROTOCOL_COSTS["Simple"]
    # Steps: NCCL's buffers / NCCL_STEPS, payload bytes (init.cc DEFAULT_*BUFFSIZE)
    assert STEP_BYTES == {"Simple": 512 * 1024, "LL": 32 * 1024, "LL128": 576_000}


def test_protocol_cost_variants() -> None:
    assert protocol_cost("simple", link_kind=LinkKind.PCIE).step_latency_us == pytest.approx(4.7)
    assert protocol_cost("LL", link_kind=LinkKind.NET).step_latency_us == 0.0
    assert protocol_cost("Simple", link_kind=LinkKind.NET).step_latency_us == pytest.approx(11.3)
    assert protocol_cost("Simple").tb_gbps is None  # no GPU given: no threadblock physics
    with pytest.raises(ValueError, match="unknown protocol"):
        protocol_cost("LL64")


def test_gpu_physics_per_family() -> None:
    h100 = protocol_cost("LL128", gpu=gpu_physics("H100-SXM5-80GB"))
    assert h100.tb_gbps == pytest.approx(36.7 / 2)  # perChMaxRingLL128Bw per 2 threadblocks
    assert h100.launch_us == 14.0  # baseLat ring/LL128
    assert h100.nvlink_efficiency == 0.8
    a100 = gpu_physics("A100-SXM4-80GB")
    assert a100 is not None and a100.tb("Simple") == 12.5 and a100.tb("LL128") == 10.0
    assert a100.tb("LL") == pytest.approx(LL_OF_SIMPLE * 12.5)
    assert protocol_cost("Simple", gpu=a100, algorithm="tree").launch_us == 8.4
    mi = gpu_physics("AMD Instinct MI300X")
    assert mi is not None and mi.family == Family.CDNA3 and mi.sms == 304
    assert mi.tb("Simple") == 10.5 and mi.tb("LL128") == pytest.approx(2.1)
    assert mi.floor_us["LL128"] == 200.0 and mi.nvlink_efficiency == 1.0
    assert gpu_physics("") is None and gpu_physics("Radeon VII") is None
    # LL < LL128 < Simple per threadblock on NVIDIA GPUs; on MI300X both are below Simple
    for model in ("V100-SXM2-32GB", "A100-SXM4-80GB", "H100-SXM5-80GB"):
        g = gpu_physics(model)
        assert g is not None and g.tb("LL") < g.tb("LL128") <= g.tb("Simple")
    assert max(mi.tb("LL"), mi.tb("LL128")) < mi.tb("Simple")


@pytest.mark.parametrize(
    ("args", "kw", "expected"),
    [
        # baseLat 8.4 + 2*(8-1) steps * hwLat[NVLink][ring][Simple] 3.4
        (("ring", "Simple", "nvlink", 8, 1), {}, 8.4 + 14 * 3.4),
        # 2 nodes: 30 steps, 2*nNodes = 4 of them inter-node (2.7), intra max(0.6, net overhead 1)
        (("ring", "LL", "nvlink", 16, 2), {}, 6.6 + 26 * 1.0 + 4 * 2.7),
        # Simple: intra max(3.4, net overhead 1 x 3) = 3.4; inter hwLat[NET][ring][Simple] 14.0
        (("ring", "Simple", "nvlink", 16, 2), {}, 8.4 + 26 * 3.4 + 4 * 14.0),
        # tree: 2 * ((ppn-1) * intra + log2(nNodes) * inter)
        # NCCL 2.30.7: baseLat tree/Simple 8.4, hwLat tree/Simple 4.0 (NVLink), 14 (NET)
        (("tree", "Simple", "nvlink", 64, 8), {}, 8.4 + 2 * (7 * 4.0 + 3 * 14.0)),
        (("tree", "LL", "nvlink", 16, 2), {}, 6.8 + 2 * (7 * 0.6 + 1 * 5.0)),
        (("ring", "LL128", "pcie", 4, 1), {"collective": "allgather"}, 14.0 + 3 * 2.5),
        (("ring", "Simple", "nvlink", 8, 1), {"collective": "broadcast"}, 8.4 + 3.4),
        (
            ("ring", "Simple", "nvlink", 8, 1),
            {"collective": "broadcast", "same_channels": False},
            8.4 + 8 * 4.0,
        ),
        (("ring", "Simple", "nvlink", 1, 1), {}, 0.0),
    ],
)
def test_nccl_latency(args: tuple, kw: dict, expected: float) -> None:
    assert nccl_latency_us(*args, **kw) == pytest.approx(expected)


def test_net_latency_counts_twice_for_simple() -> None:
    base = nccl_latency_us("ring", "Simple", "nvlink", 16, 2)
    assert nccl_latency_us("ring", "Simple", "nvlink", 16, 2, net_latency_us=1.0) == pytest.approx(
        base + 4 * 2.0
    )


@pytest.mark.parametrize(
    ("model", "arch", "cc"),
    [
        ("H100-SXM5-80GB", Arch.HOPPER, 90),
        ("NVIDIA H800", Arch.HOPPER, 90),
        ("A100-SXM4-80GB", Arch.AMPERE, 80),
        ("A800", Arch.AMPERE, 80),
        ("A40", Arch.AMPERE, 86),
        ("V100-SXM2-32GB", Arch.VOLTA, 70),
        ("MI300X", None, None),
        ("", None, None),
    ],
)
def test_arch(model: str, arch: Arch | None, cc: int | None) -> None:
    assert arch_of(model) == arch
    assert comp_cap_of(model) == cc


def test_tree_correction_table() -> None:
    assert tree_correction("Simple", 64) == 0.9
    assert tree_correction("Simple", 1 << 20) == 0.5  # log2(2^20 / 64) = 14
    assert tree_correction("LL", 1 << 12) == 0.7
    assert tree_correction("LL128", 1 << 40) == 1.0


def test_names() -> None:
    assert canonical_protocol("ll128") == "LL128"
    assert canonical_algorithm("NVLS-Tree") == "nvls_tree"
    with pytest.raises(ValueError, match="unknown NCCL algorithm"):
        canonical_algorithm("butterfly")
