"""cost.py: NCCL's published numbers and latency formulas (tuning.cc, v2.19)."""

from __future__ import annotations

import pytest

from ccltune.api.cluster import LinkKind
from ccltune.model.cost.protocols import (
    LL,
    LL128,
    PROTOCOL_COSTS,
    SIMPLE,
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
    assert SIMPLE.efficiency == 1.0 and SIMPLE.channel_cap_gbps is None
    # Step latency: NCCL's ring hwLat over NVLink.
    assert (LL.step_latency_us, LL128.step_latency_us, SIMPLE.step_latency_us) == (0.6, 1.9, 3.4)
    assert SIMPLE is PROTOCOL_COSTS["Simple"]


def test_protocol_cost_variants() -> None:
    assert protocol_cost("simple", link_kind=LinkKind.PCIE).step_latency_us == 5.7
    assert protocol_cost("LL", link_kind=LinkKind.NET).step_latency_us == 2.7
    assert protocol_cost("LL128", arch=Arch.HOPPER).channel_cap_gbps == 36.7
    assert protocol_cost("LL128", arch=Arch.VOLTA).channel_cap_gbps == 20.0
    assert protocol_cost("Simple").channel_cap_gbps is None
    with pytest.raises(ValueError, match="unknown protocol"):
        protocol_cost("LL64")


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
