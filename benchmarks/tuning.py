"""Tuning benchmark: the four searchers against the exhaustive optimum.

Run: .venv/bin/python benchmarks/tuning.py [--quick] [--write]
(--write saves the report to benchmarks/results/tuning.md.)

Surfaces:
- simulated: ccltune's two-phase NCCL performance surface (tune/profilers/simulated.py) on five
  presets, allreduce/allgather/reducescatter, 4 KiB..1 GiB; 2% measurement noise per repetition and
  interference 0.2. The exhaustive optimum and every "within 2%" verdict use the noise-free surface.
- replayed: NCCL's sweep CSV sample in ../shared/data (its numbers are illustrative, per that
  README) and the two nccl-tests logs (stock NCCL vs MSCCL on one 8xA100 NDv4 VM), measured data.

Per task key: budget = 10% of the exhaustive trial count (at least 1). Reported per searcher: share
of tasks whose final choice is within 2% of the optimum, trials until the incumbent (the best
measured so far) first is within 2%, trials and measurements used, and the gain over NCCL's default.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ccltune.api.common import Collective
from ccltune.api.plan import TaskKey
from ccltune.topology.presets import load_preset
from ccltune.tune.default import nccl_default_config
from ccltune.tune.fabric import facts_for
from ccltune.tune.profilers.replay import SWEEP_COLUMNS, ReplayProfiler
from ccltune.tune.profilers.simulated import SimulatedProfiler
from ccltune.tune.searchers import SEARCHERS, make_searcher
from ccltune.tune.searchers.base import point_at, start_index
from ccltune.tune.space import Config, TaskSpace, build_space
from ccltune.tune.tuner import communicator_topology, tune_tasks

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "nccl-tests"
SHAPES = [  # preset, ranks, nodes
    ("dgx-a100-1", 8, 1),
    ("dgx-h100-2", 16, 2),
    ("h800-rail-64", 64, 8),
    ("a40-pcie-8", 8, 1),
    ("mi300x-8", 8, 1),
]
COLLECTIVES = [Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER]
NOISE, INTERFERENCE, WITHIN = 0.02, 0.2, 1.02


@dataclass
class Tally:
    hits: int = 0
    tasks: int = 0
    to_2pct: list[int] = field(default_factory=list)
    trials_pct: list[float] = field(default_factory=list)
    measurements: int = 0
    gains: list[float] = field(default_factory=list)

    def row(self, name: str) -> str:
        share = 100.0 * self.hits / max(self.tasks, 1)
        med = statistics.median(self.to_2pct) if self.to_2pct else float("nan")
        used = statistics.mean(self.trials_pct) if self.trials_pct else float("nan")
        gain = math.exp(statistics.mean(math.log(g) for g in self.gains)) if self.gains else float("nan")
        return (f"| {name} | {self.hits}/{self.tasks} ({share:.1f}%) | {med:.0f} | {used:.1f}% | "
                f"{self.measurements} | {gain:.3f}x |")


def _start(space: TaskSpace, config: Config) -> Config | None:
    for sub in space.subspaces:
        if sub.impl == config.impl:
            return sub.config(point_at(sub, start_index(sub, config)))
    return None


def simulated(quick: bool) -> tuple[dict[str, Tally], dict[str, dict[str, Tally]], float, int]:
    sizes = [4096 << (2 * i) for i in range(10)]  # 4K .. 1G, x4
    shapes = SHAPES[:4] if quick else SHAPES
    if quick:
        sizes = sizes[::3]
    total: dict[str, Tally] = {s: Tally() for s in SEARCHERS}
    per: dict[str, dict[str, Tally]] = {}
    opt_gains: list[float] = []
    space_sizes: list[int] = []
    for name, ranks, nodes in shapes:
        topo = load_preset(name)
        facts = facts_for(topo, ranks, nodes)
        per[name] = {s: Tally() for s in SEARCHERS}
        for coll in COLLECTIVES:
            space = build_space(coll, facts)
            truth_prof = SimulatedProfiler(topo, interference=INTERFERENCE, noise=0.0)
            sub_topo = communicator_topology(topo, TaskKey(collective=coll, min_bytes=1, max_bytes=1, ranks=ranks, nodes=nodes))
            for size in sizes:
                key = TaskKey(collective=coll, min_bytes=size, max_bytes=size, ranks=ranks, nodes=nodes)
                true = {c: truth_prof.true_time_us(key, size, c) for c in space}
                opt = min(true.values())
                default = nccl_default_config(coll, size, facts, space, sub_topo).config
                t_default = truth_prof.true_time_us(key, size, default)
                opt_gains.append(t_default / opt)
                space_sizes.append(len(space))
                budget = max(1, len(space) // 10)
                for s in SEARCHERS:
                    prof = SimulatedProfiler(topo, interference=INTERFERENCE, noise=NOISE, seed=11)

                    def evaluate(config: Config, reps: int, prof: SimulatedProfiler = prof,
                                 key: TaskKey = key, size: int = size) -> float:
                        return prof.measure(key, size, config, reps).time_us

                    res = make_searcher(s).search(space, evaluate, budget, seed=11, start=_start(space, default))
                    first = None
                    inc: tuple[float, Config] | None = None
                    for i, t in enumerate(res.trials, start=1):
                        if not t.pruned and (inc is None or t.value < inc[0]):
                            inc = (t.value, t.config)
                        if first is None and inc is not None and true[inc[1]] <= WITHIN * opt:
                            first = i
                    for tally in (total[s], per[name][s]):
                        tally.tasks += 1
                        tally.hits += int(true[res.best] <= WITHIN * opt)
                        if first is not None:
                            tally.to_2pct.append(first)
                        tally.trials_pct.append(100.0 * res.n_trials / len(space))
                        tally.measurements += res.n_measurements
                        tally.gains.append(t_default / true[res.best])
    geo_opt = math.exp(statistics.mean(math.log(g) for g in opt_gains))
    return total, per, geo_opt, int(statistics.median(space_sizes))


def _replay_table(prof: ReplayProfiler, topo_of: dict[int, str]) -> list[str]:
    """Searchers on a replayed table: optimum = the table's best entry at each size."""
    tally: dict[str, Tally] = {s: Tally() for s in SEARCHERS}
    for (coll, nodes, ranks), configs in sorted(prof.table.items()):
        topo = load_preset(topo_of[nodes])
        facts = facts_for(topo, ranks, nodes)
        full = build_space(coll, facts)
        for size in sorted({s for series in configs.values() for s in series}):
            key = TaskKey(collective=coll, min_bytes=size, max_bytes=size, ranks=ranks, nodes=nodes)
            space = prof.space(key, facts, full)
            if len(space) == 0:
                continue
            true = {c: prof.measure(key, size, c).time_us for c in space}
            opt = min(true.values())
            dflt = nccl_default_config(coll, size, facts, full).config
            same = [c for c in space if c.impl == dflt.impl] or list(space)
            d = min(same, key=lambda c: (abs(c.channels - dflt.channels), c))  # nearest replayed
            budget = max(1, len(space) // 10)

            def evaluate(c: Config, r: int, key: TaskKey = key, size: int = size) -> float:
                return prof.measure(key, size, c, r).time_us

            for s in SEARCHERS:
                res = make_searcher(s).search(space, evaluate, budget, seed=11, start=_start(space, d))
                t = tally[s]
                t.tasks += 1
                t.hits += int(true[res.best] <= WITHIN * opt)
                first = next((i for i, tr in enumerate(res.trials, 1)
                              if min(true[x.config] for x in res.trials[:i]) <= WITHIN * opt), None)
                if first is not None:
                    t.to_2pct.append(first)
                t.trials_pct.append(100.0 * res.n_trials / len(space))
                t.measurements += res.n_measurements
                t.gains.append(true[d] / true[res.best])
    lines = ["| searcher | within 2% | median trials to 2% | trials used (% of exhaustive) | measurements | gain vs default |",
             "|---|---|---|---|---|---|"]
    return lines + [tally[s].row(s) for s in SEARCHERS]


def _sweep_csv(preset: str, ranks: int, nodes: int) -> str:
    """A sweep in NCCL's CSV schema written from the simulated surface (channels x algo x proto)."""
    topo = load_preset(preset)
    facts = facts_for(topo, ranks, nodes)
    rows = [",".join((*SWEEP_COLUMNS[:7], "pipeOps", "regBuff", *SWEEP_COLUMNS[7:]))]
    prof = SimulatedProfiler(topo, interference=INTERFERENCE, noise=0.0)
    for coll in COLLECTIVES:
        for sub in build_space(coll, facts).subspaces:
            if sub.impl.transport != "p2p":
                continue
            threads = sub.values[1][-1]
            for size in [4096 << (2 * i) for i in range(10)]:
                key = TaskKey(collective=coll, min_bytes=size, max_bytes=size, ranks=ranks, nodes=nodes)
                for ch in sub.values[0]:
                    t = prof.true_time_us(key, size, Config(sub.impl, ch, threads, 4 << 20))
                    rows.append(f"{coll},{size},{sub.impl.algorithm},{sub.impl.protocol.lower()},{ch},{nodes},"
                                f"{ranks},-1,-1,{t:.3f},0,{t:.3f}")
    return "\n".join(rows) + "\n"


def replayed() -> list[str]:
    lines = ["NCCL's sweep CSV sample (its numbers are illustrative, see ../shared/data/README.md; "
             "validity judged on DGX H100; 2-4 entries per size, so the budget is 1 trial):", ""]
    lines += _replay_table(ReplayProfiler.from_file(DATA / "nccl-sweep-schema-sample.csv"),
                           {1: "dgx-h100-1", 2: "dgx-h100-2"})
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    sweep = tmp / "ccltune-bench-sweep.csv"
    sweep.write_text(_sweep_csv("dgx-h100-2", 16, 2))
    lines += ["", "A sweep written in the same CSV schema from the simulated surface (dgx-h100-2, 16 ranks/"
              "2 nodes, algorithm x protocol x 8 channel counts, default threads/buffer; so its source is "
              "simulated, replayed through the CSV path):", ""]
    lines += _replay_table(ReplayProfiler.from_file(sweep), {2: "dgx-h100-2"})
    # Joint choice NCCL vs MSCCL on the measured nccl-tests logs.
    both = (DATA / "ndv4-1x8-allreduce-nccl.txt").read_text().rstrip("\n") + "\n"
    both += (DATA / "ndv4-1x8-allreduce-msccl.txt").read_text()
    logs = tmp / "ccltune-bench-ndv4.txt"
    logs.write_text(both)
    lines += ["", "Joint choice NCCL vs synthesized (MSCCL) on the measured nccl-tests logs (source: replayed):", "",
              "| nccl-tests logs (NDv4 8xA100, allreduce) | sizes | MSCCL chosen | geomean speedup vs stock NCCL | best |",
              "|---|---|---|---|---|"]
    for inplace in (False, True):
        tuned = tune_tasks([TaskKey(collective="allreduce", min_bytes=128, max_bytes=32 << 20, ranks=8, nodes=1)],
                           load_preset("dgx-a100-1"), profiler=f"replay:{logs}", collective="allreduce", ranks=8,
                           nodes=1, inplace=inplace, budget=1)
        chosen = sum(1 for t in tuned.tasks if t.synthesized)
        geo = math.exp(statistics.mean(math.log(t.speedup) for t in tuned.tasks))
        best = max(tuned.tasks, key=lambda t: t.speedup)
        lines.append(f"| {'in-place' if inplace else 'out-of-place'} | {len(tuned.tasks)} | {chosen} | "
                     f"{geo:.3f}x | {best.speedup:.2f}x at {best.size} B |")
    return lines


def machine() -> str:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"nproc {os.cpu_count()}, Python {platform.python_version()}, CPU {cpu}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer presets and sizes (smoke run)")
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/tuning.md")
    args = ap.parse_args()
    t0 = time.time()
    total, per, geo_opt, median_space = simulated(args.quick)
    sim_s = time.time() - t0
    out = ["# Tuning benchmark", "",
           f"Command: `.venv/bin/python benchmarks/tuning.py{' --quick' if args.quick else ''}` "
           f"({sim_s:.0f} s for the simulated part)  ",
           f"Machine: {machine()}", "",
           "## Simulated surfaces (source: simulated)", "",
           f"Presets {', '.join(f'{n} ({r} ranks/{k} nodes)' for n, r, k in (SHAPES[:4] if args.quick else SHAPES))}; "
           f"allreduce, allgather, reducescatter; sizes 4 KiB..1 GiB (x4); noise {NOISE:.0%} per repetition, "
           f"interference {INTERFERENCE}. Budget per task = 10% of the exhaustive count "
           f"(median space {median_space} configurations). Optimum and verdicts on the noise-free surface; "
           f"the exhaustive optimum itself is {geo_opt:.3f}x faster than NCCL's default (geomean).", "",
           "| searcher | within 2% | median trials to 2% | trials used (% of exhaustive) | measurements | gain vs default |",
           "|---|---|---|---|---|---|"]
    out += [total[s].row(s) for s in SEARCHERS]
    out += ["", "Per preset (within 2% of optimum):", "", "| preset | " + " | ".join(SEARCHERS) + " |",
            "|---|" + "---|" * len(SEARCHERS)]
    for name, tallies in per.items():
        out.append(f"| {name} | " + " | ".join(f"{t.hits}/{t.tasks}" for t in tallies.values()) + " |")
    out += ["", "## Replayed tables", ""]
    out += replayed()
    text = "\n".join(out) + "\n"
    print(text)
    if args.write:
        path = Path(__file__).parent / "results" / "tuning.md"
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
