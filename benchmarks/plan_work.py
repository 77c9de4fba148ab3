"""Plan work estimate vs the time `build_plan` takes: what one unit of `ccltune.workload` costs.

    .venv/bin/python benchmarks/plan_work.py [--cluster dgx-a100-2]

Plans a few specs without synthesis (baseline only, and tuning with the simulated profiler) on a
preset cluster in this process, and prints the estimate, the measured wall time and the time per
unit. The operator's `inprocessMaxWork` and `maxPlanWork` defaults are read against this.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.pipeline import build_plan
from ccltune.topology.load import load_cluster
from ccltune.workload import preflight
from machine import cpu_model

SPECS: dict[str, dict] = {
    "baseline 1 x 64K..128K": {"collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "128K"}]},
    "baseline 5 x 1K..16G": {"collectives": [{"op": op, "minBytes": "1K", "maxBytes": "16G"} for op in
                                             ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")]},
    "tuning 1 x 1K..1G, budget 31": {"collectives": [{"op": "allreduce", "minBytes": "1K", "maxBytes": "1G"}],
                                     "tuning": {"enabled": True, "budget": 31}},
    "tuning 3 x 64K..1G, budget 200": {"collectives": [{"op": op, "minBytes": "64K", "maxBytes": "1G"} for op in
                                                       ("allreduce", "allgather", "reducescatter")],
                                       "tuning": {"enabled": True, "budget": 200}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="dgx-a100-2")
    args = parser.parse_args()
    topo = load_cluster(args.cluster)
    print(f"| spec on {args.cluster} | estimated work (units) | build_plan wall (s) | ms per unit |")
    print("|---|---:|---:|---:|")
    for name, raw in SPECS.items():
        spec = CCLTuningSpec.model_validate({**raw, "publish": {"ncclVersion": "2.24"}})
        _keys, work = preflight(spec, topo)
        t0 = time.perf_counter()
        build_plan(spec, topo, name="bench")
        wall = time.perf_counter() - t0
        print(f"| {name} | {work.units} | {wall:.2f} | {1000 * wall / work.units:.2f} |")
    print()
    print(f"machine: nproc={os.cpu_count()}, python {platform.python_version()}, {cpu_model()}, "
          f"load average at the end {os.getloadavg()[0]:.1f}; times measured, plans simulated")


if __name__ == "__main__":
    main()
