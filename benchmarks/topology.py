"""Cluster model build time: compact spec -> graph -> symmetry detection, and from agent reports.

    .venv/bin/python benchmarks/topology.py [--repeat 5] [--out benchmarks/results/topology.md]

Rows: every preset at its size, then synthetic H800-like rail clusters up to 4096 GPUs (same
server shape as h800-rail-512, more servers per rail), and from_nodes() over node_spec() reports
of the 64-server preset. Numbers are measured wall-clock medians on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ccltune.topology.cluster_file import from_spec
from ccltune.topology.export import describe, node_spec
from ccltune.topology.from_nodes import from_nodes
from ccltune.topology.presets import _load, list_presets, load_preset, preset_text
from ccltune.topology.spec import ClusterSpec
from machine import cpu_model


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def rail_spec(servers: int) -> ClusterSpec:
    data = yaml.safe_load(preset_text("h800-rail-512"))
    data["name"] = f"h800-rail-{servers * 8}"
    data["servers"] = servers
    data["network"]["tiers"][0]["size"] = servers
    return ClusterSpec.model_validate(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    for name in list_presets():
        def load(name: str = name) -> object:
            _load.cache_clear()
            return load_preset(name)
        topo = load_preset(name)
        rows.append((name, topo.world_size, len(topo.devices), len(topo.links), median_ms(load, args.repeat),
                     describe(topo)))
    for servers in (128, 256, 512):
        spec = rail_spec(servers)
        topo = from_spec(spec)
        rows.append((spec.name + " (synthetic)", topo.world_size, len(topo.devices), len(topo.links),
                     median_ms(lambda spec=spec: from_spec(spec), args.repeat), describe(topo)))
    base = load_preset("h800-rail-64")
    reports = [node_spec(base, n.name) for n in base.nodes]
    labels = {n.name: {"ccltune.io/rail": n.fabric["rail"], "ccltune.io/spine": n.fabric["spine"]} for n in base.nodes}
    topo = from_nodes(reports, labels, name="from-nodes-64")
    rows.append(("from_nodes(h800-rail-64 reports)", topo.world_size, len(topo.devices), len(topo.links),
                 median_ms(lambda: from_nodes(reports, labels), args.repeat), describe(topo)))
    lines = [
        "# Topology build benchmark",
        "",
        f"Command: `.venv/bin/python benchmarks/topology.py --repeat {args.repeat}`  ",
        f"Machine: {cpu_model()}, nproc {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()}, "
        f"Python {sys.version.split()[0]}  ",
        "Source of every number: measured (wall clock, median of the repeats; parse + build + detect).",
        "",
        "| cluster | GPUs | devices | links | build ms (measured) | dimensions |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, gpus, ndev, nlink, ms, desc in rows:
        lines.append(f"| {name} | {gpus} | {ndev} | {nlink} | {ms:.1f} | {desc.split(' · ', 1)[-1]} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
