"""NodeTopology reports + node labels -> ClusterTopology."""

from __future__ import annotations

import pytest

from ccltune.api.cluster import ClusterTopology
from ccltune.api.nodetopology import NodeTopology, NodeTopologySpec
from ccltune.topology.errors import TopologyError
from ccltune.topology.export import describe, node_spec
from ccltune.topology.from_nodes import from_nodes
from ccltune.topology.presets import load_preset


def reports(topo: ClusterTopology) -> list[NodeTopologySpec]:
    return [node_spec(topo, n.name) for n in topo.nodes]


def topograph_labels(topo: ClusterTopology) -> dict[str, dict[str, str]]:
    out = {}
    for n in topo.nodes:
        labels = {}
        if "rail" in n.fabric:
            labels["ccltune.io/rail"] = n.fabric["rail"]
        if "leaf" in n.fabric:
            labels["network.topology.nvidia.com/leaf"] = n.fabric["leaf"]
        if "spine" in n.fabric:
            labels["network.topology.nvidia.com/spine"] = n.fabric["spine"]
        out[n.name] = labels
    return out


@pytest.mark.parametrize("name", ["syccl-a800-32", "h800-rail-64", "dgx-h100-2", "mi300x-8", "v100-cubemesh-4"])
def test_reports_of_a_preset_give_back_its_dimensions(name: str) -> None:
    topo = load_preset(name)
    built = from_nodes([NodeTopology(spec=s) for s in reports(topo)], topograph_labels(topo), name=name)
    assert built.dimensions == topo.dimensions
    assert built.asymmetry_reason == topo.asymmetry_reason
    assert describe(built).split(" · ")[1:] == describe(topo).split(" · ")[1:]


def test_nodes_are_ordered_by_fabric_so_domains_are_consecutive() -> None:
    topo = load_preset("syccl-a800-32")
    specs = reports(topo)
    shuffled = [specs[i] for i in (3, 0, 2, 1)]
    built = from_nodes(shuffled, topograph_labels(topo))
    assert [n.name for n in built.nodes] == ["node0", "node1", "node2", "node3"]
    assert built.dimensions == topo.dimensions
    kept = from_nodes(shuffled, topograph_labels(topo), keep_order=True)
    assert [n.name for n in kept.nodes] == ["node3", "node0", "node2", "node1"]
    assert kept.dimensions is None and "consecutive" in (kept.asymmetry_reason or "")


def test_label_keys_can_be_overridden() -> None:
    topo = load_preset("syccl-a800-32")
    labels = {n.name: {"example.com/tor": n.fabric["leaf"], "example.com/agg": n.fabric["spine"]} for n in topo.nodes}
    # Unknown keys: no node has fabric labels, so one flat switch is assumed and said so.
    flat = from_nodes(reports(topo), labels)
    assert flat.dimensions is not None and [d.size for d in flat.dimensions] == [8, 4]
    assert "one non-blocking switch" in flat.sources["assumption"]
    # Some nodes labelled, one not: that node is named.
    mixed = {**labels, "node0": {"ccltune.io/tor": "leaf0"}}
    with pytest.raises(TopologyError, match=r"node node1: no leaf label \(looked for network\.topology\.nvidia\.com/leaf"):
        from_nodes(reports(topo), mixed)
    built = from_nodes(reports(topo), labels, label_keys={"leaf": "example.com/tor", "spine": ["example.com/agg"]})
    assert built.dimensions == topo.dimensions
    with pytest.raises(TopologyError, match="unknown role 'rack'"):
        from_nodes(reports(topo), labels, label_keys={"rack": "x"})


def test_missing_spine_label_is_named_when_leaves_differ() -> None:
    topo = load_preset("syccl-a800-32")
    labels = {n.name: {"ccltune.io/tor": n.fabric["leaf"]} for n in topo.nodes}
    with pytest.raises(TopologyError, match=r"node node\d: no spine label .* different leaf switches"):
        from_nodes(reports(topo), labels)


def test_conflicting_spine_labels_are_named() -> None:
    topo = load_preset("syccl-a800-32")
    labels = topograph_labels(topo)
    for node_labels in labels.values():
        node_labels["network.topology.nvidia.com/core"] = "c0"
    labels["node1"]["network.topology.nvidia.com/spine"] = "other-spine"
    with pytest.raises(TopologyError, match=r"node node[01]: labels put switch leaf-leaf0 under spine-\S+, other nodes under spine-"):
        from_nodes(reports(topo), labels)


def test_oversubscription_argument_shows_in_the_spine_dimension() -> None:
    topo = load_preset("syccl-a800-32")
    built = from_nodes(reports(topo), topograph_labels(topo), oversubscription=2.0)
    assert built.dimensions is not None and built.dimensions[2].bandwidth_gbps == 6.25


def test_node_with_other_gpu_count_is_rejected() -> None:
    topo = load_preset("dgx-a100-2")
    specs = reports(topo)
    specs[1] = specs[1].model_copy(update={"gpus": specs[1].gpus[:4]})
    with pytest.raises(TopologyError, match="node node1: has 4 GPUs but node node0 has 8"):
        from_nodes(specs, topograph_labels(topo))


def test_node_with_other_nic_rate_is_rejected() -> None:
    topo = load_preset("dgx-a100-2")
    specs = reports(topo)
    nics = [n.model_copy(update={"ports": [p.model_copy(update={"rate_gbps": 100.0}) for p in n.ports]})
            for n in specs[1].nics]
    specs[1] = specs[1].model_copy(update={"nics": nics})
    with pytest.raises(TopologyError, match=r"node node1: NIC rates \[100, .*\] Gb/s differ from node node0"):
        from_nodes(specs, topograph_labels(topo))


def test_duplicate_and_empty_reports() -> None:
    topo = load_preset("dgx-a100-2")
    specs = reports(topo)
    with pytest.raises(TopologyError, match="node node0: reported twice"):
        from_nodes([specs[0], specs[0]], {})
    with pytest.raises(TopologyError, match="no NodeTopology"):
        from_nodes([], {})


def test_flattened_vm_pcie_is_attached_to_numa_nodes() -> None:
    topo = load_preset("dgx-a100-1")
    spec = reports(topo)[0].model_copy(update={"pcie_flattened": True})
    built = from_nodes([spec], {})
    assert not [d for d in built.devices if d.kind == "pcie_switch"]
    assert built.dimensions is not None and built.dimensions[0].bandwidth_gbps == 300.0


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("hgx-h100", "switch 8 @ 450 GB/s · switch 2 @ 50 GB/s"),
        ("azure-ndv4-vm", "switch 8 @ 300 GB/s · switch 2 @ 25 GB/s"),
        ("v100-sxm2-4", "asymmetric: node a: NVLink per-pair bandwidth differs"),
        ("a40-pcie-8", "asymmetric: node a: GPUs reach each other only through PCIe/CPU"),
    ],
)
def test_real_agent_reports_from_fixtures(fixture: str, expected: str) -> None:
    """Agent probes of recorded machines (tests/fixtures/agent), two identical nodes on one leaf."""
    from pathlib import Path

    probe_mod = pytest.importorskip("ccltune_agent.probe")
    nvml_mod = pytest.importorskip("ccltune_agent.nvml")
    base = Path(__file__).resolve().parents[1] / "fixtures" / "agent" / fixture
    specs = [probe_mod.probe(n, base / "sysfs", nvml_mod.ReplayNvml(base / "nvml.json")).spec for n in ("a", "b")]
    labels = {"a": {"ccltune.io/tor": "t0"}, "b": {"ccltune.io/tor": "t0"}}
    topo = from_nodes(specs, labels, name=fixture)
    assert expected in describe(topo)


def test_single_node_keeps_nic_rates_for_nccl_xml() -> None:
    topo = load_preset("dgx-h100-1")
    built = from_nodes(reports(topo), {})
    assert "assumption" not in built.sources
    again = node_spec(built, "node0")
    assert sorted(p.rate_gbps for n in again.nics for p in n.ports) == [400.0] * 8
    assert {p.link_layer for n in again.nics for p in n.ports} == {"InfiniBand"}
