"""Helpers shared by the agent tests (imported by name: tests/agent is on sys.path)."""

from __future__ import annotations

from pathlib import Path

from ccltune_agent.nvml import ReplayNvml
from ccltune_agent.probe import ProbeResult, probe

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agent"
NAMES = ["dgx-a100", "hgx-h100", "v100-sxm2-4", "a40-pcie-8", "azure-ndv4-vm"]


def run_fixture(name: str, root: Path = FIXTURES, node: str = "node-a") -> ProbeResult:
    base = root / name
    return probe(node, base / "sysfs", ReplayNvml(base / "nvml.json"))
