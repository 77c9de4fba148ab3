"""publish.topologyFile: when a plan publishes NCCL_TOPO_FILE, and the note that says why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccltune.api.ccltuning import PublishOptions
from ccltune.api.cluster import ClusterTopology
from ccltune.api.nodetopology import NodeTopologySpec
from ccltune.topology.cluster_file import load_text
from ccltune.topology.from_nodes import from_nodes
from ccltune.topology.presets import load_preset
from ccltune.topology.topo_file import decide, missing_for_loader
from ccltune_agent.nvml import ReplayNvml
from ccltune_agent.probe import probe

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agent"


def reports(fixture: str, nodes: tuple[str, ...] = ("node-a", "node-b")) -> list[NodeTopologySpec]:
    base = FIXTURES / fixture
    return [probe(n, base / "sysfs", ReplayNvml(base / "nvml.json")).spec for n in nodes]


def cluster_file(cpu: str = "") -> ClusterTopology:
    return load_text(f"""
kind: ClusterSpec
name: c
gpuModel: H100-SXM5-80GB
servers: 2
gpusPerServer: 8
intraNode: {{fabric: nvswitch, bandwidthGbps: 450}}
pcie: {{generation: 5, cpus: 2}}
{cpu}
nics: {{perServer: 8, rateGbps: 400}}
""")


def test_default_is_auto() -> None:
    assert PublishOptions().topology_file == "auto"
    assert PublishOptions.model_validate({"topologyFile": "always"}).topology_file == "always"
    with pytest.raises(ValueError, match="topologyFile"):
        PublishOptions.model_validate({"topologyFile": "sometimes"})


def test_auto_publishes_no_file_with_synthetic_bus_ids() -> None:
    decision = decide(load_preset("dgx-h100-2"), "auto")
    assert decision.xml is None and decision.synthetic
    assert "synthetic" in decision.notes[0]


def test_always_publishes_a_preset_file_and_says_its_bus_ids_are_synthetic() -> None:
    decision = decide(load_preset("dgx-h100-2"), "always")
    assert decision.xml is not None and decision.synthetic
    assert any("GPUDirect RDMA is off" in n for n in decision.notes)


def test_never_publishes_nothing() -> None:
    decision = decide(load_preset("dgx-h100-2"), "never")
    assert decision.xml is None and "never" in decision.notes[0]


def test_auto_keeps_nccl_detection_on_bare_metal_reports() -> None:
    topo = from_nodes(reports("hgx-h100"), {})
    auto, always = decide(topo, "auto"), decide(topo, "always")
    assert auto.xml is None and "whole PCIe tree" in auto.notes[0]
    assert always.xml == topo.nccl_topology[0].xml and not always.synthetic


def test_auto_does_not_replace_the_providers_file_on_a_vm() -> None:
    topo = from_nodes(reports("azure-ndv4-vm"), {})
    assert topo.nccl_topology[0].pcie_hidden
    decision = decide(topo, "auto")
    assert decision.xml is None and "provider's" in decision.notes[0]


def test_nodes_with_different_files_get_none() -> None:
    a, b = reports("hgx-h100", ("node-a",)) + reports("hgx-h100", ("node-b",))
    b = b.model_copy(update={"nics": [n.model_copy(update={"name": f"ib{i}"}) for i, n in enumerate(b.nics)]})
    topo = from_nodes([a, b], {})
    assert len(topo.nccl_topology) == 2
    decision = decide(topo, "always")
    assert decision.xml is None and "nodes differ" in decision.notes[0] and "node-b" in decision.notes[0]


def test_unknown_cpu_on_two_sockets_publishes_nothing_and_names_the_field() -> None:
    decision = decide(cluster_file(), "always")
    assert decision.xml is None
    assert "lacks arch, vendor, familyid, modelid" in decision.notes[0] and "cpu:" in decision.notes[0]
    known = cluster_file("cpu: {arch: x86_64, vendor: GenuineIntel, familyId: 6, modelId: 143}")
    assert decide(known, "always").xml is not None


def test_unknown_cpu_from_agents_is_named() -> None:
    specs = [s.model_copy(update={"cpu": None}) for s in reports("hgx-h100")]
    decision = decide(from_nodes(specs, {}), "always")
    assert decision.xml is None and "/proc/cpuinfo" in decision.notes[0]


def test_a_single_bare_cpu_is_loadable() -> None:
    xml = '<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0"><gpu dev="0" sm="90"/></pci></cpu></system>'
    assert missing_for_loader(xml) is None
    two = xml.replace("</system>", '<cpu numaid="1" arch="arm64"/></system>')
    assert missing_for_loader(two) == "<cpu numaid=0> lacks arch, vendor, familyid, modelid (CPU model unknown)"


@pytest.mark.parametrize("runtime", ["nccl", "msccl", "rccl"])
def test_amd_gpus_get_no_published_file(runtime: str) -> None:
    decision = decide(load_preset("mi300x-8"), "always", runtime)  # type: ignore[arg-type]
    assert decision.xml is None
    assert ("AMD GPUs need RCCL" if runtime != "rccl" else "RCCL's own loader") in decision.notes[0]


def test_rccl_runtime_on_nvidia_gpus_gets_none() -> None:
    decision = decide(load_preset("dgx-h100-1"), "always", "rccl")
    assert decision.xml is None and "NVIDIA GPUs" in decision.notes[0]


def test_reported_files_survive_a_cluster_dump_and_the_topology_cli(tmp_path: Path) -> None:
    """`ccltune topology --nccl-xml` on a dumped operator cluster writes the agents' files, not invented ones."""
    import subprocess
    import sys

    import yaml

    topo = from_nodes(reports("dgx-a100"), {})
    dump = tmp_path / "cluster.yaml"
    dump.write_text(yaml.safe_dump({"kind": "ClusterTopology", **topo.wire()}, sort_keys=False))
    cli = Path(sys.executable).parent / "ccltune"
    p = subprocess.run([str(cli), "topology", "--cluster", str(dump), "--nccl-xml", str(tmp_path / "xml")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for node in ("node-a", "node-b"):
        assert (tmp_path / "xml" / f"{node}.xml").read_text() == topo.nccl_topology[0].xml


def test_from_nodes_keeps_the_cpu_only_when_every_node_agrees() -> None:
    a, b = reports("hgx-h100")
    assert from_nodes([a, b], {}).host_cpu == a.cpu
    other = b.model_copy(update={"cpu": a.cpu.model_copy(update={"model_id": 207}) if a.cpu else None})
    mixed = from_nodes([a, other], {})
    assert mixed.host_cpu is None
    assert sorted(v.nodes for v in mixed.nccl_topology) == [["node-a"], ["node-b"]]
