"""Synthesis and tuning as steps of the planning pipeline (pipeline.build_plan).

Tuning runs first (NCCL's knobs per task key, simulated profiler offline); synthesis then
offers an MSCCL schedule per size range, which replaces the task's choice at a size only where
its simulated time beats the choice made so far. Both keep every estimate's source.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from .api.ccltuning import CCLTuningSpec
from .api.cluster import ClusterTopology
from .api.plan import Choice, PlanFile, PlanTask
from .publish.files import MSCCL_DIR, TUNER_CSV, plan_file
from .synth.engine import synthesize
from .tune.tuner import TUNER_FILE, tune_tasks

Progress = Callable[[str], None]


def tune_step(spec: CCLTuningSpec, cluster: ClusterTopology, tasks: list[PlanTask],
              say: Progress) -> tuple[list[PlanTask], dict[str, str], list[PlanFile], list[str]]:  # fmt: skip
    """Tuned tasks, env, files (tuner CSV) and notes; the tasks unchanged when it cannot run."""
    opts = spec.tuning
    if opts.profiler != "simulated":
        why = ("needs the replay ConfigMap, which only the operator reads"
               if opts.profiler == "replay" else "runs nccl-tests on GPU nodes (operator Jobs)")  # fmt: skip
        return tasks, {}, [], [f"tuning: profiler {opts.profiler} {why}; NCCL defaults are used"]
    say(f"tuning {len(tasks)} task(s): {opts.searcher}, simulated profiler, budget {opts.budget}")
    result = tune_tasks([t.key for t in tasks], cluster, searcher=opts.searcher,
                        profiler="simulated", budget=opts.budget, seed=opts.seed,
                        nccl_version=spec.publish.nccl_version)  # fmt: skip
    files = [plan_file(TUNER_CSV, result.files[TUNER_FILE])] if TUNER_FILE in result.files else []
    return result.plan_tasks_by_key(), dict(result.env), files, [
        f"tuning: {n}" for n in result.notes
    ]


def synth_step(spec: CCLTuningSpec, sub: ClusterTopology, task: PlanTask, index: int,
               say: Progress) -> tuple[PlanTask, list[PlanFile]]:  # fmt: skip
    """The task with MSCCL where a synthesized schedule is faster; its XML files."""
    key = task.key
    sizes = [e.size_bytes for e in task.default_estimates]
    say(f"synthesizing {key.collective} on {key.ranks} ranks ({len(sizes)} sizes)")
    with tempfile.TemporaryDirectory() as tmp:
        res = synthesize(sub, key.collective, sizes,
                         time_budget_s=spec.synthesis.time_budget_seconds, out_dir=tmp)  # fmt: skip
        xml = {Path(r.xml_file).name: Path(r.xml_file).read_text(encoding="utf-8")
               for r in res.ranges if r.xml_file}  # fmt: skip
    # Files over the ConfigMap limit are published packed (publish/configmaps.py).
    notes = [*task.notes, *(f"synthesis: {n}" for n in res.notes)]
    path_of = {name: f"{MSCCL_DIR}/t{index}-{name}" for name in xml}
    file_at: dict[int, str] = {}
    for r in res.ranges:
        if r.xml_file and Path(r.xml_file).name in path_of:
            for s in r.sizes:
                file_at[s.size_bytes] = path_of[Path(r.xml_file).name]
    # What the task runs so far at each size: tuning's buckets, else NCCL's default.
    current = {e.size_bytes: e for e in [*task.default_estimates, *task.chosen_estimates]}
    used: set[str] = set()
    for s in res.sizes:
        path = file_at.get(s.size_bytes)
        here = current.get(s.size_bytes)
        if path and (here is None or s.estimate.time_us < here.time_us):
            choice = Choice(kind="msccl", algorithm=s.chosen, protocol=s.protocol,
                            msccl_file=path)  # fmt: skip
            current[s.size_bytes] = s.estimate.model_copy(update={"choice": choice})
            used.add(path)
    estimates = [current[size] for size in sorted(current)]
    if not res.symmetric:
        notes.append("synthesis: asymmetric communicator, NCCL kept (see the note above)")
    top = estimates[-1].choice if estimates and estimates[-1].choice else task.chosen
    files = [plan_file(p, xml[name]) for name, p in path_of.items() if p in used]
    return task.model_copy(update={"chosen_estimates": estimates, "chosen": top,
                                   "notes": notes}), files  # fmt: skip


__all__ = ["synth_step", "tune_step"]
