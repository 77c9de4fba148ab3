"""`ccltune presets`, `ccltune topology` and `ccltune crds --check` as a user runs them."""

from pathlib import Path

import yaml

from ccltune.topology.load import load_cluster
from ccltune.topology.nccl_xml import parse_nccl_xml

from .test_cli_plan import ROOT, ccltune


def test_presets_lists_every_preset() -> None:
    result = ccltune("presets")
    assert result.returncode == 0, result.stderr
    for name in ("syccl-a800-32", "h800-rail-512", "dgx-h100-2", "v100-cubemesh-4", "mi300x-8"):
        assert name in result.stdout


def test_topology_exports_astra_and_nccl_xml(tmp_path: Path) -> None:
    result = ccltune(
        "topology", "--cluster", "h800-rail-64", "--astra", tmp_path / "net.yaml",
        "--nccl-xml", tmp_path / "xml", "--dump", tmp_path / "cluster.yaml",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "dim0" in result.stdout and "dim1" in result.stdout
    again = load_cluster(str(tmp_path / "net.yaml"))
    assert again.world_size == 64
    assert [d.size for d in again.dimensions or []] == [8, 8]
    xmls = sorted((tmp_path / "xml").glob("*.xml"))
    assert len(xmls) == 8
    parsed = parse_nccl_xml(xmls[0].read_text())
    assert len(parsed.gpus) == 8
    dumped = load_cluster(str(tmp_path / "cluster.yaml"))
    assert dumped.world_size == 64 and dumped.dimensions == load_cluster("h800-rail-64").dimensions
    assert yaml.safe_load((tmp_path / "cluster.yaml").read_text())["name"] == "h800-rail-64"


def test_asymmetric_cluster_cannot_be_exported_to_astra(tmp_path: Path) -> None:
    result = ccltune("topology", "--cluster", "v100-cubemesh-4", "--astra", tmp_path / "net.yaml")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_crds_check_passes_on_the_checked_in_crds() -> None:
    result = ccltune("crds", "--out", ROOT / "crds", "--check")
    assert result.returncode == 0, result.stderr
