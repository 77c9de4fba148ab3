"""The planning pipeline shared by `ccltune plan` and the operator: spec + cluster -> Plan.

Knows nothing of Kubernetes. Steps: expand the spec into task keys (collective, size range,
communicator), carve each communicator's sub-cluster, estimate NCCL's default choice on it,
run synthesis/tuning when asked, and render the files to publish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .api.ccltuning import CCLTuningSpec, CollectiveTask, Parallelism
from .api.cluster import ClusterTopology
from .api.common import Collective, Source, parse_size
from .api.plan import Plan, PlanFile, PlanTask, TaskKey
from .model.nccl_default import default_estimate, nccl_default
from .plan_steps import synth_step, tune_step
from .publish.files import (
    NCCL_CONF,
    NCCL_TOPO,
    REPORT_JSON,
    REPORT_MD,
    plan_file,
    render_nccl_conf,
    with_files,
)
from .publish.report import render_report_json, render_report_md
from .topology.export import describe, node_spec
from .topology.nccl_xml import write_nccl_xml
from .topology.subgroup import subcluster

Progress = Callable[[str], None]


class PlanError(ValueError):
    """The spec cannot be planned on this cluster; the message names the field."""


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


def _baseline_task(key: TaskKey, sub: ClusterTopology, progress: Progress) -> PlanTask:
    progress(f"{key.collective} on {key.ranks} ranks: NCCL default (simulated)")
    estimates = []
    for size in size_points(key.min_bytes, key.max_bytes):
        est = default_estimate(key.collective, size, sub)
        estimates.append(
            est.model_copy(update={"choice": nccl_default(key.collective, size, sub).choice})
        )
    default = nccl_default(key.collective, key.max_bytes, sub).choice
    return PlanTask(
        key=key,
        default=default,
        chosen=default,
        default_estimates=estimates,
        chosen_estimates=estimates,
        notes=[],
    )


def _topology_files(topo: ClusterTopology) -> tuple[list[PlanFile], list[str]]:
    """One NCCL_TOPO_FILE when every node's XML is the same (the pod cannot know its node)."""
    xmls = {write_nccl_xml(node_spec(topo, n.name)) for n in topo.nodes}
    if len(xmls) == 1:
        return [plan_file(NCCL_TOPO, xmls.pop())], []
    return [], ["nodes differ in layout: no NCCL_TOPO_FILE is published, NCCL detects each node"]


def build_plan(
    tuning: CCLTuningSpec,
    cluster: ClusterTopology,
    *,
    name: str,
    progress: Progress | None = None,
) -> Plan:
    """The whole offline pipeline. Deterministic: same inputs, same files and digest."""
    say = progress or (lambda _msg: None)
    tasks: list[PlanTask] = []
    subs: list[ClusterTopology] = []
    notes: list[str] = []
    for index, task in enumerate(expand_tasks(tuning, cluster)):
        key, comm = _task_key(task, index, tuning, cluster)
        sub = subcluster(cluster, comm.ranks)
        subs.append(sub)
        tasks.append(_baseline_task(key, sub, say))
    env: dict[str, str] = {}
    step_files: list[PlanFile] = []
    if tuning.tuning.enabled:
        tasks, env, step_files, tune_notes = tune_step(tuning, cluster, tasks, say)
        notes += tune_notes
    if tuning.synthesis.enabled:
        for index, sub in enumerate(subs):
            tasks[index], xml_files = synth_step(tuning, sub, tasks[index], index, say)
            step_files += xml_files
    topo_files, topo_notes = _topology_files(cluster)
    notes += topo_notes
    plan = Plan(
        name=name,
        cluster=cluster.name,
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
        plan_file(NCCL_CONF, render_nccl_conf(env, header)),
        plan_file(REPORT_MD, render_report_md(plan, line)),
        plan_file(REPORT_JSON, render_report_json(plan, line)),
    ]
    return with_files(plan, files)


__all__ = ["PlanError", "Source", "build_plan", "expand_tasks", "size_points"]
