"""What a `profiler: live` run costs: launches, GPUs held and collective time, per preset.

    .venv/bin/python benchmarks/live_cost.py [--budget 200] [--sizes 1K:1G]

The configurations, launches and GPUs are what the operator would start
(controller/benchmark.plan_trials: NCCL's default in one launch, the configurations in trial-mode
launches of nccl-tests -N). The collective time is SIMULATED (ccltune's surface, noise-free): every
NCCL call nccl-tests makes (warm-up where the launch has one, sync and timed calls, out-of-place
and in-place) at every size of every cycle. It is a lower bound: each launch also pays mpirun
start-up and NCCL initialisation (communicator setup, typically seconds per launch at this
scale), which nothing here models.
"""

from __future__ import annotations

import argparse

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.plan import TaskKey
from ccltune.controller import benchmark as bench
from ccltune.topology.presets import load_preset
from ccltune.tune.default import nccl_default_config
from ccltune.tune.fabric import facts_for
from ccltune.tune.profilers.simulated import SimulatedProfiler
from ccltune.tune.space import build_space

PRESETS = ("dgx-a100-1", "dgx-a100-2", "dgx-h100-1", "dgx-h100-2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--sizes", default="1K:1G")
    args = ap.parse_args()
    lo, hi = args.sizes.split(":")
    print(f"allreduce {lo}..{hi}, budget {args.budget}; collective time simulated (lower bound)\n")
    print("| preset | configurations | launches | sizes | GPUs held | collective time (simulated) |")
    print("|---|---|---|---|---|---|")
    for preset in PRESETS:
        cluster = load_preset(preset)
        spec = CCLTuningSpec.model_validate({
            "selector": {"matchLabels": {"app": "x"}},
            "collectives": [{"op": "allreduce", "minBytes": lo, "maxBytes": hi}],
            "tuning": {"enabled": True, "profiler": "live", "budget": args.budget}})
        plan = bench.plan_trials(spec, cluster)
        prof = SimulatedProfiler(cluster, noise=0.0)
        facts = facts_for(cluster, plan.ranks, len(plan.nodes))
        space = build_space(plan.trials[0].collective, facts)
        total_us = 0.0
        for launch in plan.launches:
            # Trial mode: per cycle and size, 2 x (1 sync + ITERS timed), no warm-up; otherwise
            # 2 x (1 sync + ITERS) per size plus WARMUP calls per size.
            calls = 2 * (1 + bench.ITERS) + (0 if launch.trial_mode else bench.WARMUP)
            for t in launch.trials:
                key = TaskKey(collective=t.collective, min_bytes=t.min_bytes, max_bytes=t.max_bytes,
                              ranks=plan.ranks, nodes=len(plan.nodes))
                for size in t.sizes():
                    config = t.config or nccl_default_config(t.collective, size, facts, space, cluster).config
                    total_us += calls * prof.true_time_us(key, size, config)
        print(f"| {preset} | {len(plan.trials) - 1} | {len(plan.launches)} | {len(plan.trials[0].sizes())} "
              f"| {plan.ranks} | {total_us / 1e6:.1f} s |")


if __name__ == "__main__":
    main()
