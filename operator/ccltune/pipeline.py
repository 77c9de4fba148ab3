"""The planning pipeline shared by `ccltune plan` and the operator: spec + cluster -> Plan.

Knows nothing of Kubernetes. Steps: expand the spec into task keys (collective, size range,
communicator), carve each communicator's sub-cluster, estimate NCCL's default choice on it,
run synthesis/tuning when asked, and render the files to publish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .api.ccltuning import CCLTuningSpec, CollectiveTask, Parallelism, PublishOptions
from .api.cluster import ClusterTopology
from .api.common import Collective, Source, parse_size
from .api.errors import InputError
from .api.plan import Estimate, Plan, PlanFile, PlanTask, TaskKey
from .model.evaluate import nccl_estimate
from .plan_steps import Judge, msccl_step, realize_step, synth_step, synthesis_unit, tune_step
from .publish.files import (
    NCCL_CONF,
    NCCL_TOPO,
    plan_file,
    render_nccl_conf,
    with_files,
)
from .publish.report_files import published_report_files
from .publish.runtime import RCCL_MSCCL_ENV, RuntimeMismatch, check_gpus, nccl_version, runs_msccl
from .synth.units import SynthesisUnit, Synthesized, run_units
from .topology.export import describe
from .topology.shape_warnings import shape_warnings
from .topology.subgroup import subcluster
from .topology.topo_file import decide as decide_topology_file
from .tune.emit import check_process_wide
from .tune.tuner import TuningResult, communicator_topology, tune_tasks

Progress = Callable[[str], None]


class PlanError(InputError):
    """The spec cannot be planned on this cluster; the message names the field."""


# "not available" makes the controller's Synthesized condition NotAvailable with this message.
NO_MSCCL_NOTE = (
    "synthesis: not available on runtime nccl, stock NCCL cannot run MSCCL files; set "
    "spec.publish.runtime to msccl (msccl-executor-nccl) or rccl to publish synthesized schedules"
)

# Sizes are planned at every power of two between minBytes and maxBytes, like nccl-tests -f 2.
SIZE_FACTOR = 2


def size_points(min_bytes: int, max_bytes: int) -> list[int]:
    sizes, size = [], min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= SIZE_FACTOR
    sizes.append(max_bytes)
    return sizes


@dataclass(frozen=True)
class Communicator:
    role: str
    ranks: tuple[int, ...]  # global ranks of the first group of this role


def _group(role: str, size: int, world: int, par: Parallelism | None) -> tuple[int, ...]:
    """The first communicator of a role, in Megatron's rank order (TP innermost, then DP, PP)."""
    tp = par.tp if par else 1
    dp = par.dp if par else 1
    if role in ("world", "tp"):
        stride = 1
    elif role in ("dp", "ep"):  # EP groups sit inside DP in Megatron's default order
        stride = tp if par else max(1, world // size)
    else:  # pp
        stride = tp * dp if par else max(1, world // size)
    ranks = tuple(i * stride for i in range(size))
    if ranks[-1] >= world:
        raise PlanError(
            f"a {role} group of {size} ranks with stride {stride} needs {ranks[-1] + 1} GPUs; "
            f"the cluster has {world}"
        )
    return ranks


def _role_size(role: str, world: int, par: Parallelism | None) -> int:
    if role == "world":
        return world
    if par is None:
        raise PlanError(f"role {role!r} needs spec.parallelism or an explicit ranks count")
    return {"tp": par.tp, "dp": par.dp, "pp": par.pp, "ep": par.dp}[role]


# What each parallelism role communicates, with typical message sizes (Megatron-LM / FSDP):
# TP: activation all-reduce (sequence parallel: all-gather + reduce-scatter) of a few MiB;
# DP: gradient buckets (DDP 25 MiB default, ZeRO/FSDP shards) up to hundreds of MiB.
_DERIVED: dict[str, list[tuple[Collective, str, str]]] = {
    "tp": [
        (Collective.ALLREDUCE, "64K", "256M"),
        (Collective.ALLGATHER, "64K", "256M"),
        (Collective.REDUCESCATTER, "64K", "256M"),
    ],
    "dp": [
        (Collective.ALLREDUCE, "1M", "1G"),
        (Collective.REDUCESCATTER, "1M", "1G"),
        (Collective.ALLGATHER, "1M", "1G"),
    ],
}


def expand_tasks(spec: CCLTuningSpec, topo: ClusterTopology) -> list[CollectiveTask]:
    tasks = list(spec.collectives)
    if not tasks and spec.parallelism is not None:
        par = spec.parallelism
        for role, ops in _DERIVED.items():
            if getattr(par, role) < 2:
                continue
            tasks += [
                CollectiveTask(op=op, min_bytes=lo, max_bytes=hi, role=role)
                for op, lo, hi in ops
            ]
        if not tasks:
            raise PlanError("spec.parallelism: tp and dp are both 1, so there is nothing to plan")
    return tasks


def _task_key(
    task: CollectiveTask, index: int, spec: CCLTuningSpec, topo: ClusterTopology
) -> tuple[TaskKey, Communicator]:
    world = topo.world_size
    par = spec.parallelism
    try:
        size = task.ranks or _role_size(task.role, world, par)
        ranks = _group(task.role, size, world, par)
    except PlanError as exc:
        raise PlanError(f"spec.collectives[{index}]: {exc}") from None
    if size < 2:
        raise PlanError(
            f"spec.collectives[{index}]: a {task.role} communicator of 1 rank has nothing to do"
        )
    nodes = len({r // topo.gpus_per_node for r in ranks})
    key = TaskKey(
        collective=task.op,
        min_bytes=parse_size(task.min_bytes),
        max_bytes=parse_size(task.max_bytes),
        ranks=size,
        nodes=nodes,
        role=task.role,
    )
    return key, Communicator(task.role, ranks)


def task_keys(spec: CCLTuningSpec, topo: ClusterTopology) -> list[tuple[TaskKey, Communicator]]:
    """Each task's key and communicator, in spec order (cheap: no simulation)."""
    return [_task_key(t, i, spec, topo) for i, t in enumerate(expand_tasks(spec, topo))]


def _baseline_task(key: TaskKey, sub: ClusterTopology, progress: Progress) -> PlanTask:
    progress(f"{key.collective} on {key.ranks} ranks: NCCL default (simulated)")
    # The common evaluator (model/evaluate.py) times NCCL's default: every comparison uses it.
    estimates = [nccl_estimate(key.collective, size, sub)
                 for size in size_points(key.min_bytes, key.max_bytes)]  # fmt: skip
    default = estimates[-1].choice
    assert default is not None
    return PlanTask(
        key=key,
        default=default,
        chosen=default,
        default_estimates=estimates,
        chosen_estimates=estimates,
        notes=[],
    )


def _with_bounds(task: PlanTask, baseline: PlanTask) -> PlanTask:
    """The lower bound depends on collective, size and communicator only: carry the baseline's
    onto estimates that lack one (tuning measures times, not bounds)."""
    bound = {e.size_bytes: e.bound_us for e in baseline.default_estimates}

    def fill(e: Estimate) -> Estimate:
        b = bound.get(e.size_bytes)
        if e.bound_us is not None or b is None:
            return e
        return e.model_copy(update={"bound_us": b, "pct_of_bound": b / e.time_us * 100.0})

    return task.model_copy(update={
        "default_estimates": [fill(e) for e in task.default_estimates],
        "chosen_estimates": [fill(e) for e in task.chosen_estimates],
    })  # fmt: skip


def judged_tuning(keys: list[TaskKey], topo: ClusterTopology, *, say: Progress | None = None,
                  **tune_options: Any) -> tuple[TuningResult, list[PlanTask]]:  # fmt: skip
    """`ccltune tune` on the simulated profiler, judged as a plan is: NCCL's default and every
    pick timed by the common evaluator in this run, a pick it does not time faster not
    published (nor written to the tuner files), every row with its bound. Returns the tuning
    (its files) and one task per key with both sides from the evaluator."""
    subs = [communicator_topology(topo, k) for k in keys]
    for key, sub in zip(keys, subs, strict=True):
        if sub is None:
            raise PlanError(f"--ranks/--nodes: {key.ranks} ranks on {key.nodes} node(s) is not a "
                            f"communicator of {topo.name!r}")  # fmt: skip
    usable = [s for s in subs if s is not None]
    baseline = [_baseline_task(k, s, say or (lambda _msg: None)) for k, s in zip(keys, usable, strict=True)]
    judge = Judge(baseline, usable)
    result = tune_tasks(keys, topo, keep=judge, **tune_options)
    tasks = [judge.retime(t) for t in result.plan_tasks_by_key()]
    return result, [_with_bounds(t, b) for t, b in zip(tasks, baseline, strict=True)]


def _topology_files(topo: ClusterTopology, publish: PublishOptions) -> tuple[list[PlanFile], list[str]]:
    """NCCL_TOPO_FILE only where it helps and is safe (topology/topo_file.py decides)."""
    decision = decide_topology_file(topo, publish.topology_file, publish.runtime)
    files = [plan_file(NCCL_TOPO, decision.xml)] if decision.xml is not None else []
    return files, decision.notes


def synthesis_units(spec: CCLTuningSpec, cluster: ClusterTopology) -> list[SynthesisUnit]:
    """The syntheses build_plan will run, without running anything (the operator shards them)."""
    if not spec.synthesis.enabled or not runs_msccl(spec.publish.runtime):
        return []
    return [
        SynthesisUnit(index, subcluster(cluster, comm.ranks), key.collective,
                      tuple(size_points(key.min_bytes, key.max_bytes)),
                      spec.synthesis.max_threadblocks)
        for index, (key, comm) in enumerate(task_keys(spec, cluster))
    ]  # fmt: skip


def build_plan(
    tuning: CCLTuningSpec,
    cluster: ClusterTopology,
    *,
    name: str,
    progress: Progress | None = None,
    profiles: Path | None = None,
    profile_note: str | None = None,
    workers: int = 1,
    syntheses: Mapping[int, Synthesized] | None = None,
) -> Plan:
    """The whole offline pipeline. Deterministic: same inputs, same files and digest, whatever
    `workers` (processes for the tasks' syntheses) and wherever `syntheses` (task index -> its
    synthesis, e.g. from an Indexed Job's shards; synthesis_units lists them) were run."""
    say = progress or (lambda _msg: None)
    runtime = tuning.publish.runtime
    try:
        version = nccl_version(tuning.publish)
        check_gpus(runtime, cluster.gpu_model)
    except RuntimeMismatch as exc:
        raise PlanError(str(exc)) from None
    tasks: list[PlanTask] = []
    subs: list[ClusterTopology] = []
    notes: list[str] = shape_warnings(cluster)
    if profiles is not None and profile_note:  # where the measured profiles came from (a run, a time)
        notes.append(f"tuning: {profile_note}")
    for index, task in enumerate(expand_tasks(tuning, cluster)):
        key, comm = _task_key(task, index, tuning, cluster)
        sub = subcluster(cluster, comm.ranks)
        subs.append(sub)
        tasks.append(_baseline_task(key, sub, say))
    baseline = list(tasks)
    env: dict[str, str] = {}
    step_files: list[PlanFile] = []
    if tuning.tuning.enabled:
        tasks, env, step_files, tune_notes = tune_step(tuning, cluster, tasks, say, version, profiles,
                                                       Judge(baseline, subs))  # fmt: skip
        tasks = [_with_bounds(t, b) for t, b in zip(tasks, baseline, strict=True)]
        notes += tune_notes
    if tuning.synthesis.enabled and not runs_msccl(runtime):
        notes.append(NO_MSCCL_NOTE)
    elif tuning.synthesis.enabled:
        before = [t.chosen_estimates for t in tasks]
        before_defaults = [t.default_estimates for t in tasks]
        xml_files: list[PlanFile] = []
        done = dict(syntheses or {})
        if workers > 1:  # the tasks' syntheses are independent: run them at once
            units = [synthesis_unit(tuning, sub, tasks[i], i) for i, sub in enumerate(subs)]
            todo = [u for u in units if u.index not in done or done[u.index].sizes != u.sizes]
            done.update(run_units(todo, workers=workers, progress=say))
        for index, sub in enumerate(subs):
            tasks[index], files_of_task = synth_step(tuning, sub, tasks[index], index, say,
                                                     baseline[index], done.get(index))  # fmt: skip
            xml_files += files_of_task
        tasks, xml_files, msccl_notes = msccl_step(runtime, tasks, before, xml_files, before_defaults)
        notes += msccl_notes
        step_files += xml_files
        if xml_files and runtime == "rccl":
            env.update(RCCL_MSCCL_ENV)
    tasks = [realize_step(t) for t in tasks]
    topo_files, topo_notes = _topology_files(cluster, tuning.publish)
    notes += topo_notes
    plan = Plan(
        name=name,
        cluster=cluster.name,
        runtime=runtime,
        world_size=cluster.world_size,
        nodes=cluster.node_count,
        tasks=tasks,
        env=env,
        notes=notes,
    )
    line = describe(cluster)
    header = f"ccltune plan {name} for cluster {cluster.name}: {line}"
    files = [
        *topo_files,
        *step_files,
        plan_file(NCCL_CONF, render_nccl_conf(check_process_wide(env), header)),
        *published_report_files(plan, line),
    ]
    return with_files(plan, files)


__all__ = ["Communicator", "PlanError", "Source", "build_plan", "expand_tasks", "size_points",
           "synthesis_units", "task_keys"]
