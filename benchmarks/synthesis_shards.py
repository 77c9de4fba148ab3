"""What sharding synthesis can gain: where synthesis spends its time, and `plan --workers`.

    .venv/bin/python benchmarks/synthesis_shards.py

Table 1: `synthesize` at three sizes per row; the sub-demand MILPs (coarse + fine steps) against
the whole synthesis (evaluation dominates). This is why a shard is a task's whole synthesis
(synth/units.py), not a set of sub-demands (synth/shard.py).
Table 2: `build_plan` of a three-task synthesis plan with 1, 2 and 3 worker processes (the same
code an Indexed Job's shards run); every plan's files are checked identical to the 1-worker plan.
"""

from __future__ import annotations

import os
import platform
import time

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.pipeline import build_plan
from ccltune.synth.engine import synthesize
from ccltune.topology.load import load_cluster
from machine import cpu_model

ROWS = [("dgx-h100-2", "allgather"), ("dgx-h100-2", "allreduce"), ("syccl-a800-16", "reducescatter"),
        ("mi300x-8", "allgather"), ("h800-rail-64", "allgather")]
SIZES = [1 << 20, 1 << 26, 1 << 30]
PLAN = {
    "collectives": [
        {"op": "allgather", "minBytes": "16M", "maxBytes": "1G"},
        {"op": "allgather", "minBytes": "1M", "maxBytes": "64M", "ranks": 8},
        {"op": "reducescatter", "minBytes": "1M", "maxBytes": "64M", "ranks": 8},
    ],
    "synthesis": {"enabled": True},
    "publish": {"runtime": "msccl"},
}
PLAN_CLUSTER = "dgx-a100-2"


def main() -> None:
    print("| preset | collective | sub-demands | MILP steps (s) | synthesis (s) | MILP share |")
    print("|---|---|---:|---:|---:|---:|")
    for preset, coll in ROWS:
        res = synthesize(load_cluster(preset), coll, SIZES, time_budget_s=600)
        milp = res.timings.get("coarse_s", 0.0) + res.timings.get("fine_s", 0.0)
        total = res.timings.get("total_s", 0.0)
        share = 100 * milp / total if total else 0.0
        print(f"| {preset} | {coll} | {len(res.subschedules)} | {milp:.3f} | {total:.2f} | {share:.1f}% |")
    print()
    spec = CCLTuningSpec.model_validate(PLAN)
    topo = load_cluster(PLAN_CLUSTER)
    print(f"| plan: 3 syntheses on {PLAN_CLUSTER} | workers | wall (s) | same files as 1 worker |")
    print("|---|---:|---:|---|")
    first = None
    for workers in (1, 2, 3):
        t0 = time.perf_counter()
        plan = build_plan(spec, topo, name="bench", workers=workers)
        wall = time.perf_counter() - t0
        files = {f.path: f.content for f in plan.files}
        first = first or files
        print(f"| | {workers} | {wall:.1f} | {'yes' if files == first else 'NO'} |")
    print()
    print(f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, {cpu_model()}, "
          f"load average at the end {os.getloadavg()[0]:.1f}; times measured, schedules simulated")


if __name__ == "__main__":
    main()
