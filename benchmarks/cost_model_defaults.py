"""NCCL default choice per preset: NCCL's predicted time, the simulated time and the lower bound.

Run: .venv/bin/python benchmarks/cost_model_defaults.py > benchmarks/results/cost-model.md
"""

from __future__ import annotations

import os
import platform
import subprocess
import time

from ccltune.model.nccl.default import default_estimate, nccl_default
from ccltune.model.sim.routing import Router
from ccltune.topology.presets import list_presets, load_preset
from machine import cpu_model

SIZES = (1 << 16, 1 << 24, 1 << 28)
COLLS = ("allreduce", "allgather", "alltoall", "broadcast")
MAX_RANKS = 64


def main() -> None:
    start = time.time()
    print("# Cost model: NCCL default choice, simulated vs. bound\n")
    print("Command: `.venv/bin/python benchmarks/cost_model_defaults.py`\n")
    nproc = os.cpu_count()
    py = subprocess.run(["python3", "-V"], capture_output=True, text=True).stdout.strip()
    print(
        f"Machine: nproc={nproc}, {platform.python_version()} (venv; system {py}), {cpu_model()}\n"
    )
    print("All times in us. `nccl model` = NCCL's own tuning formula (predicted); `simulated` =")
    print("the chosen baseline schedule in ccltune's simulator; `bound` = lower bound under the")
    print("simulator's model. busbw in GB/s from the simulated time (nccl-tests factors).\n")
    print(
        "| preset | collective | size | NCCL choice | nccl model | simulated | busbw | bound | % of bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in list_presets():
        topo = load_preset(name)
        if topo.world_size > MAX_RANKS:
            continue
        router = Router(topo)
        for coll in COLLS:
            for size in SIZES:
                d = nccl_default(coll, size, topo)
                e = default_estimate(coll, size, topo, router=router)
                pred = f"{d.predicted_time_us:.1f}" if d.predicted_time_us else "-"
                print(
                    f"| {name} | {coll} | {size} | {d.choice.describe()} | {pred} | "
                    f"{e.time_us:.1f} | {e.busbw_gbps:.1f} | {e.bound_us:.1f} | {e.pct_of_bound:.0f}% |",
                    flush=True,
                )
    print(f"\nWall time: {time.time() - start:.0f} s (presets above {MAX_RANKS} ranks skipped).")


if __name__ == "__main__":
    main()
