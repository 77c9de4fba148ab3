"""Probe time per fixture (sysfs walk + NVML replay + derivation), and NCCL XML export time.

    .venv/bin/python benchmarks/probe.py [--repeat 30] [--out benchmarks/results/probe.md]

All numbers are measured wall-clock on this machine, replaying the committed fixtures (no live
NVML: a live nvmlInit adds driver time this cannot see).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ccltune.topology.nccl_xml import write_nccl_xml
from ccltune_agent.nvml import ReplayNvml
from ccltune_agent.probe import probe
from machine import cpu_model, load_average

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "agent"
NAMES = ["dgx-a100", "hgx-h100", "v100-sxm2-4", "a40-pcie-8", "azure-ndv4-vm"]


def measure(name: str, repeat: int) -> dict[str, float]:
    base = FIXTURES / name
    probe("bench", base / "sysfs", ReplayNvml(base / "nvml.json"))  # warm the page cache
    probe_ms, xml_ms = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = probe("bench", base / "sysfs", ReplayNvml(base / "nvml.json"))
        t1 = time.perf_counter()
        write_nccl_xml(result.spec)
        t2 = time.perf_counter()
        probe_ms.append((t1 - t0) * 1e3)
        xml_ms.append((t2 - t1) * 1e3)
    files = sum(1 for p in (base / "sysfs").rglob("*") if p.is_file())
    probe_ms.sort()
    return {"files": files, "gpus": len(result.spec.gpus), "nics": len(result.spec.nics),
            "median": statistics.median(probe_ms), "p90": probe_ms[int(0.9 * (len(probe_ms) - 1))],
            "xml": statistics.median(xml_ms)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "probe.md")
    args = ap.parse_args()
    rows = [(name, measure(name, args.repeat)) for name in NAMES]
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Node agent probe time per fixture",
        "",
        "Source of every number: **measured** (wall clock, `time.perf_counter`), replaying the committed",
        "fixtures in tests/fixtures/agent (sysfs subset + NVML recording). Median and p90 over "
        f"{args.repeat} runs after one warm-up run; other engineers' jobs shared the machine.",
        "",
        "| fixture | sysfs files | GPUs | NICs | probe median (ms) | probe p90 (ms) | NCCL XML export median (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in rows:
        lines.append(f"| {name} | {m['files']:.0f} | {m['gpus']:.0f} | {m['nics']:.0f} | {m['median']:.2f} "
                     f"| {m['p90']:.2f} | {m['xml']:.2f} |")
    lines += [
        "",
        "Command: `.venv/bin/python benchmarks/probe.py --repeat " + str(args.repeat) + "`",
        "",
        f"Machine: nproc={nproc}, {sys.version.split()[0]} (`python -V`), CPU: {cpu_model()}, "
        f"load average at the end: {load_average()}",
        "",
        "Not measured here: live NVML (nvmlInit and per-link queries on a real driver) and a real /sys",
        "with hundreds of PCI functions; the agent reads link attributes only for the devices it reports.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
