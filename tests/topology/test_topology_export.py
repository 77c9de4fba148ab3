"""describe(), node_spec() and the NCCL topology XML written from it."""

from __future__ import annotations

import pytest

from ccltune.api.nodetopology import Distance
from ccltune.topology.errors import TopologyError
from ccltune.topology.export import describe, node_spec
from ccltune.topology.nccl_xml import parse_nccl_xml, write_nccl_xml
from ccltune.topology.presets import list_presets, load_preset


def test_describe_is_one_line() -> None:
    assert describe(load_preset("syccl-a800-32")) == (
        "4 nodes x 8 A800-SXM4-80GB · switch 8 @ 200 GB/s · switch 4 @ 12.5 GB/s"
    )
    assert describe(load_preset("mi300x-8")) == "1 node x 8 MI300X · fully_connected 8 @ 448 GB/s"
    cube = describe(load_preset("v100-cubemesh-4"))
    assert cube.startswith("1 node x 4 V100-SXM2-32GB · asymmetric: node node0") and "\n" not in cube


@pytest.mark.parametrize("name", list_presets())
def test_node_spec_is_well_formed_for_every_preset(name: str) -> None:
    topo = load_preset(name)
    spec = node_spec(topo, topo.nodes[-1].name)
    assert [g.index for g in spec.gpus] == list(range(topo.gpus_per_node))
    buses = [d.bus_id for d in spec.pci_devices]
    assert len(buses) == len(set(buses))
    for dev in spec.pci_devices:
        assert dev.parent is None or dev.parent in buses
    for gpu in spec.gpus:
        assert gpu.pci_bus_id in buses
    assert len(spec.p2p) == topo.gpus_per_node * (topo.gpus_per_node - 1) // 2
    xml = write_nccl_xml(spec)
    parsed = parse_nccl_xml(xml)
    assert len(parsed.gpus) == topo.gpus_per_node
    assert len(parsed.nets) == len(spec.nics)


def test_nccl_xml_carries_nvlink_counts_and_nic_speeds() -> None:
    topo = load_preset("dgx-h100-2")
    parsed = parse_nccl_xml(write_nccl_xml(node_spec(topo, "node1")))
    for gpu in parsed.gpus:
        assert [(lk.count, lk.tclass) for lk in gpu.nvlinks] == [(18, "0x068000")]  # 18 x NVLink4
    assert {net.speed_mbps for net in parsed.nets} == {400000}
    # Two PCIe switches per socket, each with 2 GPUs and 2 NICs.
    switches = {p.busid for p in parsed.pcis if p.pci_class == "0x060400"}
    assert len(switches) == 4


def test_cube_mesh_nvlink_targets_are_peer_gpus() -> None:
    topo = load_preset("v100-cubemesh-4")
    spec = node_spec(topo, "node0")
    bus = {g.index: g.pci_bus_id for g in spec.gpus}
    parsed = parse_nccl_xml(write_nccl_xml(spec))
    gpu0 = next(g for g in parsed.gpus if g.dev == 0)
    assert {lk.target: lk.count for lk in gpu0.nvlinks} == {bus[1]: 1, bus[2]: 1, bus[3]: 2}
    assert sum(len(g.nvlinks) for g in spec.gpus) == 2 * (1 + 1 + 2 + 2 + 1 + 2)


def test_affinity_and_binding_follow_the_pcie_tree() -> None:
    spec = node_spec(load_preset("dgx-a100-1"), "node0")
    dist = {(a.gpu, a.nic): a.distance for a in spec.affinity}
    assert dist[(0, "mlx5_0")] == Distance.PIX
    assert dist[(0, "mlx5_2")] == Distance.PHB
    assert dist[(0, "mlx5_7")] == Distance.SYS
    assert spec.nic_binding["0"] == "mlx5_0" and spec.nic_binding["7"] == "mlx5_6"
    assert {n.id for n in spec.numa_nodes} == {0, 1}


def test_node_spec_unknown_node() -> None:
    with pytest.raises(TopologyError, match="no node 'ghost'"):
        node_spec(load_preset("dgx-a100-1"), "ghost")
