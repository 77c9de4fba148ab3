"""Dimension detection and isomorphic groups on hand-built and edited graphs."""

from __future__ import annotations

import pytest

from ccltune.api.cluster import ClusterTopology, LinkKind
from ccltune.topology.cluster_file import from_spec
from ccltune.topology.presets import load_preset
from ccltune.topology.spec import ClusterSpec
from ccltune.topology.symmetry import detect, groups


def spec(**kw: object) -> ClusterSpec:
    base: dict[str, object] = {
        "name": "t", "servers": 1, "gpusPerServer": 4,
        "intraNode": {"fabric": "nvswitch", "bandwidthGbps": 100},
    }
    base.update(kw)
    return ClusterSpec.model_validate(base)


def dims(topo: ClusterTopology) -> list[tuple[str, int, float]]:
    assert topo.dimensions is not None, topo.asymmetry_reason
    return [(d.kind, d.size, d.bandwidth_gbps) for d in topo.dimensions]


def test_groups_follow_rank_coordinates() -> None:
    topo = from_spec(spec(servers=8, nics={"perServer": 2, "rateGbps": 200}, pcie={"generation": 5},
                          network={"tiers": [{"name": "leaf", "size": 2},
                                             {"name": "spine", "size": 2, "oversubscription": 2},
                                             {"name": "core", "oversubscription": 2}]}))
    assert [d.size for d in topo.dimensions or []] == [4, 2, 2, 2]
    g0, g1, g2, g3 = (groups(topo, i) for i in range(4))
    assert g0[0] == [0, 1, 2, 3] and len(g0) == 8
    assert g1[:2] == [[0, 4], [1, 5]] and [8, 12] in g1 and len(g1) == 16
    assert g2[0] == [0, 8] and [23, 31] in g2 and len(g2) == 16
    assert g3[0] == [0, 16] and len(g3) == 16
    for gs in (g0, g1, g2, g3):
        assert sorted(r for g in gs for r in g) == list(range(32))
    # Members of a group differ only in that coordinate, which runs 0..size-1.
    for g in g2:
        coords = [topo.coords(r) for r in g]
        assert len({(c[0], c[1], c[3]) for c in coords}) == 1 and [c[2] for c in coords] == [0, 1]


def test_non_blocking_tiers_merge_into_one_dimension() -> None:
    topo = load_preset("syccl-a800-32")  # 2 servers per leaf, non-blocking spine
    assert topo.dimensions is not None and topo.dimensions[1].name == "leaf+spine"
    assert groups(topo, 1)[:2] == [[0, 8, 16, 24], [1, 9, 17, 25]]
    assert topo.dimensions[1].latency_us == 8.0  # the cross-leaf path


def test_groups_are_isomorphic_in_the_rail_fabric() -> None:
    topo = load_preset("h800-rail-64")
    rail = groups(topo, 1)
    assert len(rail) == 8 and rail[3] == [3 + 8 * k for k in range(8)]


def test_groups_errors() -> None:
    with pytest.raises(ValueError, match="not symmetric"):
        groups(load_preset("v100-cubemesh-4"), 0)
    with pytest.raises(ValueError, match="out of range"):
        groups(load_preset("dgx-a100-1"), 1)


def test_ring_and_fully_connected_inner_fabrics() -> None:
    ring = from_spec(spec(gpusPerServer=6, intraNode={"fabric": "ring", "linkBandwidthGbps": 20}))
    assert dims(ring) == [("ring", 6, 40.0)]
    fc = from_spec(spec(intraNode={"fabric": "fully_connected", "linkBandwidthGbps": 10}))
    assert dims(fc) == [("fully_connected", 4, 30.0)]


def test_oversubscription_lowers_upper_tier_bandwidth() -> None:
    topo = from_spec(spec(
        servers=8, nics={"perServer": 4, "rateGbps": 400}, pcie={"generation": 5},
        network={"layout": "tor", "tiers": [{"name": "leaf", "size": 2},
                                            {"name": "spine", "size": 2, "oversubscription": 2},
                                            {"name": "core", "oversubscription": 2}]},
    ))
    assert dims(topo) == [("switch", 4, 100.0), ("switch", 2, 50.0), ("switch", 2, 25.0), ("switch", 2, 12.5)]
    lat = [d.latency_us for d in topo.dimensions or []]
    assert lat == sorted(lat) and lat[1] < lat[2] < lat[3]


def test_pcie_bottleneck_caps_the_network_dimension() -> None:
    # 1 GPU per server with 4 x 400 Gb/s NICs: its PCIe Gen4 x16 link (31.5 GB/s) is the limit.
    topo = from_spec(spec(gpusPerServer=1, servers=2, nics={"perServer": 4, "rateGbps": 400}))
    assert dims(topo) == [("switch", 2, 31.508)]


def test_rail_layout_is_named_rail() -> None:
    topo = from_spec(spec(servers=4, nics={"perServer": 4, "rateGbps": 200}, network={"layout": "rail"}))
    assert topo.dimensions is not None and topo.dimensions[1].name == "rail"
    assert dims(topo)[1] == ("switch", 4, 25.0)


def _edit_link(topo: ClusterTopology, a: str, b: str, bw: float) -> ClusterTopology:
    links = [lk.model_copy(update={"bandwidth_gbps": bw}) if {lk.a, lk.b} == {a, b} else lk for lk in topo.links]
    return topo.model_copy(update={"links": links})


def test_node_with_a_different_inner_fabric_is_named() -> None:
    topo = load_preset("dgx-h100-2")
    bad = detect(_edit_link(topo, "node1/gpu3", "node1/nvswitch", 400.0))
    assert bad.dimensions is None and bad.asymmetry_reason is not None
    assert "node node1" in bad.asymmetry_reason and "gpu3" in bad.asymmetry_reason


def test_node_with_different_nic_bandwidth_is_named() -> None:
    topo = load_preset("syccl-a800-32")
    bad = detect(_edit_link(topo, "node2/nic1", "leaf1", 12.5))
    assert bad.asymmetry_reason is not None and "node node2" in bad.asymmetry_reason


def test_partial_switch_overlap_is_named() -> None:
    topo = load_preset("syccl-a800-32")
    # Re-cable one NIC of node1 to the other leaf: node1 now straddles both leaf domains.
    links = [lk.model_copy(update={"b": "leaf1"}) if (lk.a, lk.b) == ("node1/nic3", "leaf0") else lk
             for lk in topo.links]
    bad = detect(topo.model_copy(update={"links": links}))
    assert bad.dimensions is None and "node" in (bad.asymmetry_reason or "")


def test_unequal_leaf_domains_are_named() -> None:
    topo = from_spec(spec(servers=4, nics={"perServer": 1, "rateGbps": 100},
                          network={"tiers": [{"name": "leaf", "size": 2}, {"name": "spine"}]}))
    # Move node1's only NIC under leaf1: leaf0 keeps 1 node, leaf1 gets 3.
    links = [lk.model_copy(update={"b": "leaf1"}) if (lk.a, lk.b) == ("node1/nic0", "leaf0") else lk
             for lk in topo.links]
    bad = detect(topo.model_copy(update={"links": links}))
    assert bad.dimensions is None
    assert "domain has 1 nodes" in (bad.asymmetry_reason or "") or "consecutive" in (bad.asymmetry_reason or "")


def test_nodes_out_of_fabric_order_are_named() -> None:
    topo = load_preset("syccl-a800-32")
    order = [topo.nodes[i] for i in (0, 2, 1, 3)]
    bad = detect(topo.model_copy(update={"nodes": order}))
    assert bad.dimensions is None and "consecutive" in (bad.asymmetry_reason or "")


def test_missing_uplink_splits_the_cluster() -> None:
    topo = load_preset("syccl-a800-32")
    links = [lk for lk in topo.links if not (lk.kind == LinkKind.NET and lk.b == "spine0")]
    bad = detect(topo.model_copy(update={"links": links}))
    assert bad.dimensions is None and "no uplink" in (bad.asymmetry_reason or "")


def test_no_devices_is_asymmetric_with_reason() -> None:
    topo = ClusterTopology(name="x", gpus_per_node=2, nodes=[{"name": "a", "gpus": 2}])  # type: ignore[list-item]
    assert detect(topo).asymmetry_reason == "no devices or links given, so nothing to detect symmetry from"
