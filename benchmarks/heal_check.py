"""Cost of checking one published generation (healing.check_generation), in-process.

The healer runs this for every published CCLTuning at startup and every healIntervalSeconds; the
webhook runs the existence-only variant on every injection. API reads are served from memory
here, so the table is the operator's own CPU work (gunzip + sha256 of every file), not network.

    .venv/bin/python benchmarks/heal_check.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import time
from typing import Any

from ccltune.api.plan import Plan
from ccltune.controller.healing import check_generation
from ccltune.publish.configmaps import render_configmaps
from ccltune.publish.files import plan_file, with_files


class Store:
    def __init__(self, manifests: list[dict[str, Any]]) -> None:
        self.objs = {m["metadata"]["name"]: m for m in manifests}

    async def get(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Any:
        return self.objs.get(name)

    async def get_metadata(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Any:
        obj = self.objs.get(name)
        return None if obj is None else {"metadata": copy.deepcopy(obj["metadata"])}


def generation(xml_steps: int) -> tuple[list[dict[str, Any]], int]:
    """nccl.conf + topology + one MSCCL-like XML of `xml_steps` lines (packed when large);
    returns the manifests and the plan files' plain bytes."""
    files = {"nccl.conf": "NCCL_ALGO=ring\n", "nccl-topo.xml": "<system/>\n" * 200}
    if xml_steps:
        files["msccl/ar.xml"] = "".join(
            f'<step s="{i}" type="s" srcbuf="i" srcoff="{i * 7919 % 1000003}" dstbuf="o" cnt="1"/>\n'
            for i in range(xml_steps))
    plan = with_files(Plan(name="p", cluster="c", world_size=16, nodes=2, tasks=[]),
                      [plan_file(k, v) for k, v in files.items()])
    plain = sum(len(v.encode()) for v in files.values())
    return render_configmaps(plan, name="bench-ccltune", namespace="ml"), plain


def timed(store: Store, digests: bool, repeat: int) -> tuple[float, float]:
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        damage = asyncio.run(check_generation(store, "bench-ccltune", "ml", digests=digests))  # type: ignore[arg-type]
        w1, c1 = time.perf_counter(), time.process_time()
        assert damage is None, damage
        best_wall, best_cpu = min(best_wall, w1 - w0), min(best_cpu, c1 - c0)
    return best_wall, best_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"best of {args.repeat}; API reads served from memory (measured: operator CPU only)\n")
    print("| plan files | plain bytes | content ConfigMaps | stored bytes | full check wall ms | cpu ms "
          "| existence check wall ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for steps in (0, 20_000, 200_000, 1_000_000):
        manifests, plain = generation(steps)
        stored = sum(len(v) for m in manifests[:-1] for f in ("data", "binaryData")
                     for v in (m.get(f) or {}).values())
        store = Store(manifests)
        full_wall, full_cpu = timed(store, True, args.repeat)
        meta_wall, _ = timed(store, False, args.repeat)
        label = f"conf, topology, XML of {steps:,} steps" if steps else "conf, topology"
        print(f"| {label} | {plain:,} | {len(manifests) - 1} | {stored:,} | {full_wall * 1e3:.1f} | "
              f"{full_cpu * 1e3:.1f} | {meta_wall * 1e3:.2f} |")


if __name__ == "__main__":
    main()
