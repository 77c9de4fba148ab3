"""NCCL topology XML: reading the real cloud files, writing ours, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ccltune.api.nodetopology import GPU, NIC, NICPort, NodeTopologySpec, NVLink
from ccltune.topology.nccl_xml import cpulist_to_mask, parse_nccl_xml, switch_chain, write_nccl_xml

REAL = Path("/work/shared/data/topologies")


@pytest.mark.skipif(not REAL.exists(), reason="shared data not mounted")
def test_parses_the_azure_files() -> None:
    ndv4 = parse_nccl_xml((REAL / "azure-ndv4-topo.xml").read_text())
    assert sorted(ndv4.cpus) == [0, 1, 2, 3]
    assert ndv4.cpus[0]["affinity"] == "00000000,00000000,00ffffff"
    gpus = [p for p in ndv4.pcis if p.pci_class == "0x030200"]
    nics = [p for p in ndv4.pcis if p.pci_class == "0x020700"]
    assert len(gpus) == 8 and len(nics) == 8
    assert {p.parent for p in gpus} == {"ffff:ff:01.0", "ffff:ff:02.0", "ffff:ff:03.0", "ffff:ff:04.0"}
    ncv4 = parse_nccl_xml((REAL / "azure-ncv4-topo.xml").read_text())
    assert next((g.dev, g.sm, g.busid) for g in ncv4.gpus) == (0, 80, "0001:00:00.0")
    assert ncv4.gpus[0].nvlinks[0].count == 12
    assert [(n.name, n.speed_mbps, n.busid, n.numaid) for n in ncv4.nets] == [("eth0", 100000, None, 0)]
    ndv5 = parse_nccl_xml((REAL / "azure-ndv5-topo.xml").read_text())
    assert len([p for p in ndv5.pcis if p.pci_class == "0x030200"]) == 8
    ndv2 = parse_nccl_xml((REAL / "azure-ndv2-topo.xml").read_text())
    assert ndv2.pci("0101:00:00.0").numaid == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("text, fragment", [
    ("<system><cpu", "not well-formed"),
    ("<topology/>", "root element is <topology>"),
    ('<system><cpu affinity="f"/></system>', "lacks attribute 'numaid'"),
    ('<system><cpu numaid="x"/></system>', "numaid='x' is not an integer"),
    ('<system><cpu numaid="0"><pci class="0x030200"/></cpu></system>', "<pci> under cpu numaid=0 lacks"),
    ('<system><cpu numaid="0"><gpu dev="0"/></cpu></system>', "not inside a <pci>"),
    ('<system><cpu numaid="0"><pci busid="0000:01:00.0"><gpu/></pci></cpu></system>',
     "<gpu> in pci 0000:01:00.0 lacks attribute 'dev'"),
    ('<system><cpu numaid="0"><nic><net dev="0"/></nic></cpu></system>', "<net> under cpu numaid=0 lacks"),
])
def test_malformed_xml_names_the_element(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        parse_nccl_xml(text)


def test_cpulist_mask_known_values() -> None:
    assert cpulist_to_mask("0-23", 3) == "00000000,00000000,00ffffff"
    assert cpulist_to_mask("72-95", 3) == "ffffff00,00000000,00000000"
    assert cpulist_to_mask("0,2,33", 2) == "00000002,00000005"


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=255), max_size=40))
def test_cpulist_mask_sets_exactly_the_listed_cpus(cpus: set[int]) -> None:
    mask = cpulist_to_mask(",".join(map(str, sorted(cpus))), 8)
    value = int(mask.replace(",", ""), 16)
    assert {i for i in range(256) if value >> i & 1} == cpus


def test_switch_chain_skips_downstream_ports() -> None:
    # root port -> switch upstream -> downstream port -> device, as sysfs nests them.
    parents = {"dev": "down", "down": "up", "up": "root", "root": None}
    assert switch_chain("dev", parents) == ["up"]
    assert switch_chain("up", parents) == []
    cyclic = {"a": "b", "b": "a"}
    assert len(switch_chain("a", cyclic)) == 64  # bounded, no hang


def test_writer_without_pci_tree_or_numa() -> None:
    spec = NodeTopologySpec(
        node_name="n",
        gpus=[GPU(index=0, uuid="u0", name="g", pci_bus_id="0000:01:00.0", compute_capability="9.0",
                  nvlinks=[NVLink(link=0, state="up", remote_type="unknown", remote_pci_bus_id="0000:99:00.0"),
                           NVLink(link=1, state="up", remote_type="nvswitch"),
                           NVLink(link=2, state="down")])],
        nics=[NIC(name="eth0", ports=[NICPort(rate_gbps=25, state="UP", link_layer="Ethernet")])],
    )
    text = write_nccl_xml(spec)
    assert text.startswith('<system version="1">') and "/>" in text and " />" not in text
    topo = parse_nccl_xml(text)
    assert list(topo.cpus) == [0]
    gpu = topo.gpus[0]
    assert gpu.sm == 90 and [(x.tclass, x.count) for x in gpu.nvlinks] == [("0x068000", 1)]
    assert [(n.name, n.busid, n.speed_mbps) for n in topo.nets] == [("eth0", None, 25000)]
