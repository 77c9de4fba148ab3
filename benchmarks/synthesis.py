"""Synthesis benchmark (issue 4 acceptance): wall time and simulated schedule quality.

For each preset and collective, runs `synthesize` over 1 KiB .. 1 GiB (powers of two) `--repeat`
times and prints a markdown table:
- synthesis wall time, mean and max over the repeats: `synth` excludes the reference work (NCCL's
  default choice simulated at every size, and the lower bounds), `total` includes it; `core` is
  sketch search + MILPs + combination + assembly (no simulation), `eval/size` the simulator-based
  selection per size point;
- busbw of the chosen schedule as % of the lower bound, worst size >= 64 MiB;
- speedup over NCCL's default choice: worst size (>= 1.0 means never slower) and at 1 GiB;
- whether the budget ran out. Every time is simulated (model/simulate.py), the bound analytic;
- the SM budget (threadblocks per GPU the files may use; `--max-threadblocks`, default NCCL's
  own channel count) and the most any range's schedule needs, as msccl-executor-nccl would run
  it (every variant is fitted to its limits; none fitting means NCCL everywhere).

    .venv/bin/python benchmarks/synthesis.py --presets syccl-a800-16,h800-rail-64 --repeat 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.synth.engine import synthesize
from ccltune.topology.presets import load_preset

PRESETS = ("syccl-a800-16", "syccl-a800-32", "h800-rail-64", "h800-rail-512")
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")
# SyCCL SIGCOMM'25 §7 (192-core Xeon 8469C), AllGather synthesis time.
PUBLISHED = {"syccl-a800-16": "0.8 s", "syccl-a800-32": "9.0 s", "h800-rail-64": "1.6 s",
             "h800-rail-512": "2246 s"}  # fmt: skip


def sizes(lo: int, hi: int, step: int = 2) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    if out[-1] != hi:
        out.append(hi)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument(
        "--step", type=int, default=2, help="size factor between points (nccl-tests -f)"
    )
    ap.add_argument("--budget", type=float, default=600.0, help="time budget per synthesis, s")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max-threadblocks", type=int, default=None,
                    help="SM budget per GPU (default: NCCL's channel count)")  # fmt: skip
    args = ap.parse_args()
    sz = sizes(args.min_bytes, args.max_bytes, args.step)
    print(f"sizes {len(sz)} ({sz[0]}..{sz[-1]} B), repeat {args.repeat}, budget {args.budget:g} s, "
          f"python {platform.python_version()}")  # fmt: skip
    print()
    print("| preset | GPUs | collective | core s mean | eval s per size | synth s mean | synth s max | total s mean | "
          "worst % of bound >= 64M | worst speedup vs NCCL | speedup at max size | budget out | "
          "SM budget | threadblocks used | SyCCL published (AG) |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for preset in args.presets.split(","):
        topo = load_preset(preset)
        for coll in args.collectives.split(","):
            synth_t, total_t, core_t, eval_t = [], [], [], []
            res = None
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                res = synthesize(topo, Collective(coll), sz, time_budget_s=args.budget,
                                 workers=args.workers,
                                 max_threadblocks=args.max_threadblocks)  # fmt: skip
                total = time.perf_counter() - t0
                total_t.append(total)
                synth_t.append(total - res.timings.get("reference_s", 0.0))
                tm = res.timings
                core_t.append(
                    sum(tm.get(k, 0.0) for k in ("coarse_s", "combine_s", "fine_s", "assemble_s"))
                )
                eval_t.append(tm.get("evaluate_s", 0.0) / len(sz))
            assert res is not None
            big = [s for s in res.sizes if s.size_bytes >= 64 << 20]
            pct = min((s.estimate.pct_of_bound or 0.0) for s in big) if big else float("nan")
            speed = [s.default.time_us / s.estimate.time_us for s in res.sizes]
            pub = PUBLISHED.get(preset, "") if coll == "allgather" else ""
            used = {r.label for r in res.ranges if r.kind == "msccl"}
            tbs = max((_threadblocks(res.schedules[lb]) for lb in used), default=0)
            print(f"| {preset} | {topo.world_size} | {coll} | {statistics.mean(core_t):.2f} | "
                  f"{statistics.mean(eval_t):.2f} | {statistics.mean(synth_t):.2f} | "
                  f"{max(synth_t):.2f} | {statistics.mean(total_t):.2f} | {pct:.1f}% | "
                  f"{min(speed):.2f}x | {speed[-1]:.2f}x | {'yes' if res.budget_exhausted else 'no'} | "
                  f"{res.max_threadblocks} | {tbs or '-'} | {pub} |", flush=True)  # fmt: skip


def _threadblocks(arr: ScheduleArrays) -> int:
    return lower_msccl(arr.to_schedule()).threadblocks


if __name__ == "__main__":
    main()
