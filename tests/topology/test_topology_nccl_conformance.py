"""NCCL 2.30.7's own topology loader (../shared/conformance) on every topology file ccltune writes.

For each preset, example cluster and recorded agent fixture: either the file ccltune would publish
(publish.topologyFile: always) loads in NCCL with exit 0, or ccltune publishes none and NCCL's
loader rejects the file as written (exit 1, the FAIL line names why). Exit 2 means the kit could
not run: a failure, never a skip.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ccltune.api.cluster import ClusterTopology
from ccltune.topology.export import node_spec
from ccltune.topology.from_nodes import from_nodes
from ccltune.topology.load import load_cluster
from ccltune.topology.nccl_xml import parse_nccl_xml, write_nccl_xml
from ccltune.topology.presets import list_presets, load_preset
from ccltune.topology.topo_file import decide
from ccltune_agent.nvml import ReplayNvml
from ccltune_agent.probe import probe

REPO = Path(__file__).resolve().parents[2]
CHECK_PLAN = REPO.parent / "shared" / "conformance" / "check-plan"
FIXTURES = REPO / "tests" / "fixtures" / "agent"
EXAMPLES = sorted((REPO / "examples" / "clusters").glob("*.yaml"))
AGENT_FIXTURES = sorted(p.name for p in FIXTURES.iterdir() if (p / "nvml.json").is_file())


def check_plan(tmp_path: Path, xml: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "nccl-topo.xml").write_text(xml)
    p = subprocess.run([str(CHECK_PLAN), str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert p.returncode != 2, p.stdout + p.stderr  # the kit itself could not run
    return p


def assert_loads(tmp_path: Path, xml: str) -> str:
    p = check_plan(tmp_path, xml)
    assert p.returncode == 0, p.stdout
    topo_line = next(line for line in p.stdout.splitlines() if " topology:" in line)
    assert topo_line.startswith("PASS topology:"), p.stdout
    return topo_line


def assert_published_or_rejected(tmp_path: Path, topo: ClusterTopology, runtime: str = "nccl") -> str | None:
    """The published file loads; when none is published, NCCL's loader rejects the file as written."""
    decision = decide(topo, "always", runtime)  # type: ignore[arg-type]
    if decision.xml is not None:
        assert_loads(tmp_path, decision.xml)
        return decision.xml
    assert decision.notes and decision.notes[0].startswith("no NCCL_TOPO_FILE"), decision.notes
    raw = write_nccl_xml(node_spec(topo, topo.nodes[0].name)) if not topo.nccl_topology else topo.nccl_topology[0].xml
    p = check_plan(tmp_path, raw)
    assert p.returncode == 1, p.stdout
    assert "FAIL topology: nccl-topo.xml:" in p.stdout, p.stdout
    return None


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_file_loads_in_nccl_or_is_not_published(tmp_path: Path, name: str) -> None:
    topo = load_preset(name)
    xml = assert_published_or_rejected(tmp_path, topo)
    if name.startswith("mi300x"):
        assert xml is None  # AMD GPUs: NVIDIA NCCL cannot run them
    else:
        assert xml is not None
        assert xml == write_nccl_xml(node_spec(topo, topo.nodes[0].name))
        cpus = parse_nccl_xml(xml).cpus.values()
        assert all({"arch", "vendor", "familyid", "modelid"} <= set(c) for c in cpus)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_cluster_file_loads_in_nccl_or_is_not_published(tmp_path: Path, path: Path) -> None:
    topo = load_cluster(str(path))
    xml = assert_published_or_rejected(tmp_path, topo)
    if topo.gpu_model:
        assert xml is not None, decide(topo, "always").notes
    else:  # ASTRA-sim files name no GPU: NCCL needs its compute capability
        assert xml is None
        assert "lacks sm" in decide(topo, "always").notes[0]


@pytest.mark.parametrize("fixture", AGENT_FIXTURES)
def test_file_from_recorded_agent_reports_loads_with_real_bus_ids(tmp_path: Path, fixture: str) -> None:
    base = FIXTURES / fixture
    specs = [probe(node, base / "sysfs", ReplayNvml(base / "nvml.json")).spec for node in ("node-a", "node-b")]
    topo = from_nodes(specs, {})
    assert [v.nodes for v in topo.nccl_topology] == [["node-a", "node-b"]]  # same hardware, one file
    xml = assert_published_or_rejected(tmp_path, topo)
    assert xml is not None
    written = {g.busid for g in parse_nccl_xml(xml).gpus}
    assert written == {g.pci_bus_id for g in specs[0].gpus}  # the node's own bus ids, not invented ones


def test_rccl_file_for_amd_is_what_nvidia_nccl_rejects(tmp_path: Path) -> None:
    """RCCL's form (written, not published) is refused by NVIDIA NCCL: no file can serve both."""
    topo = load_preset("mi300x-8")
    assert all(decide(topo, "always", r).xml is None for r in ("nccl", "msccl", "rccl"))
    xml = write_nccl_xml(node_spec(topo, topo.nodes[0].name))
    assert xml.startswith('<system version="2">')
    assert 'gcn="gfx942"' in xml and 'sm="304"' in xml and "<xgmi " in xml and "<nvlink" not in xml
    p = check_plan(tmp_path, xml)
    assert p.returncode == 1, p.stdout
    assert "FAIL topology: nccl-topo.xml: parse failed: XML Topology has wrong version 2, 1 needed" in p.stdout
