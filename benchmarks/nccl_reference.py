"""NCCL's default choice as the reference at every size: CPU seconds per sweep (issue 18).

`ccltune synthesize` simulates NCCL's own choice at each size next to the synthesized schedules
(model/nccl/default.py `default_estimate`). Each row: one cluster and collective, the 21 sizes
1K..1G in one process (as a sweep does: one router, NCCL's schedules cached per shape), CPU time
of this process (time.process_time), and which simulator engines ran. Times are simulated; the
table is about their cost, not their values.

    .venv/bin/python benchmarks/nccl_reference.py
    .venv/bin/python benchmarks/nccl_reference.py --rows h800-rail-64:allgather
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Any

from machine import cpu_model, load_average  # benchmarks/machine.py (run as scripts)

ROWS = ("dgx-h100-1:allgather", "dgx-h100-1:reducescatter", "dgx-h100-1:allreduce",
        "dgx-a100-1:allreduce", "mi300x-8:allgather", "syccl-a800-16:allgather",
        "h800-rail-64:allgather")  # fmt: skip
SIZES = [1024 << i for i in range(21)]


def sweep(cluster: str, coll: str) -> tuple[float, Counter[str]]:
    from ccltune.model.nccl import default as nccl_default
    from ccltune.model.sim import simulate as sim
    from ccltune.model.sim.routing import Router
    from ccltune.topology.load import load_cluster

    engines: Counter[str] = Counter()
    real = sim.simulate

    def counted(*args: Any, **kw: Any) -> sim.SimResult:
        res = real(*args, **kw)
        engines[res.engine] += 1
        return res

    nccl_default.simulate = counted
    try:
        topo = load_cluster(cluster)
        t0 = time.process_time()
        router = Router(topo)
        for size in SIZES:
            nccl_default.default_estimate(coll, size, topo, router=router, with_bound=False)
        return time.process_time() - t0, engines
    finally:
        nccl_default.simulate = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help="CLUSTER:COLLECTIVE[,...]")
    args = ap.parse_args()
    import ccltune

    print(f"{platform.node()}: {os.cpu_count()} CPUs ({cpu_model()}), python "
          f"{platform.python_version()}, ccltune from {Path(ccltune.__file__).parent}, "
          f"load {load_average()} before")  # fmt: skip
    print("| cluster | collective | CPU s (21 sizes) | engines (simulations) |")
    print("|---|---|---:|---|")
    for row in args.rows.split(","):
        cluster, coll = row.rsplit(":", 1)
        cpu, engines = sweep(cluster, coll)
        used = ", ".join(f"{e} {n}" for e, n in sorted(engines.items()))
        print(f"| {Path(cluster).name} | {coll} | {cpu:.2f} | {used} |", flush=True)
    print(f"load {load_average()} after")


if __name__ == "__main__":
    main()
