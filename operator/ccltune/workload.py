"""Before any planning work: can this spec be planned on this cluster, and how much work is it?

`ccltune plan`, the operator and its plan Jobs run `preflight` first, so a spec the planner would
reject fails in milliseconds with the field named instead of after minutes of simulation, and the
operator can route (in-process or Job), queue and limit plans by their estimated work.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from .api.ccltuning import CCLTuningSpec
from .api.cluster import ClusterTopology
from .api.common import format_size
from .api.plan import TaskKey
from .pipeline import Communicator, PlanError, size_points, task_keys

# Work is counted in units of about 1 ms of planning on the benchmark machine (measured with
# benchmarks/plan_work.py, BENCHMARKS.md "Plan work estimate"): NCCL's default at one size costs
# ~3 units per rank (12-90 ms on 16 GPUs), broadcast at 256 MiB and up far more (the simulator
# pipelines it in many chunks: 6-12 s per size on 16 GPUs); a tuning trial is at most one unit.
BASELINE_UNITS_PER_RANK = 3
BIG_BROADCAST_BYTES = 256 << 20
BIG_BROADCAST_UNITS_PER_RANK = 500
# tune_tasks re-runs each bucket's winner this many times (verify_reps) besides the budget.
VERIFY_TRIALS_PER_BUCKET = 5
# Synthesis: sketches x MILP epochs grow with the communicator; a rough charge per size point and
# rank, not calibrated (the engine's own time budget bounds it).
SYNTH_UNITS_PER_POINT_RANK = 64


@dataclass(frozen=True)
class Workload:
    tasks: int
    size_points: int  # NCCL-default estimates: every power-of-two size of every task
    trials: int  # tuning trials: budget + verification per size bucket, as the tuner spends them
    baseline: int = 0  # units the size points cost
    synthesis: int = 0  # units synthesis costs (rough)

    @property
    def units(self) -> int:
        return self.baseline + self.trials + self.synthesis

    def describe(self) -> str:
        parts = [f"{self.tasks} task(s)", f"{self.size_points} size point(s)"]
        if self.trials:
            parts.append(f"{self.trials} tuning trial(s)")
        if self.synthesis:
            parts.append(f"synthesis ~{self.synthesis} units")
        return f"{self.units} work units ({', '.join(parts)})"


def _field(spec: CCLTuningSpec, index: int) -> str:
    return f"spec.collectives[{index}]" if spec.collectives else "spec.parallelism"


def _buckets(key: TaskKey) -> int:
    """How many size buckets the tuner splits a key into (tune.keys.bucket_keys, factor 2)."""
    count, p = 0, key.min_bytes
    while p <= key.max_bytes:
        count, p = count + 1, p * 2
    return count


def _point_units(key: TaskKey, size: int) -> int:
    big_broadcast = str(key.collective) == "broadcast" and size >= BIG_BROADCAST_BYTES
    return key.ranks * (BIG_BROADCAST_UNITS_PER_RANK if big_broadcast else BASELINE_UNITS_PER_RANK)


def estimate(spec: CCLTuningSpec, keys: list[TaskKey]) -> Workload:
    points = [(k, s) for k in keys for s in size_points(k.min_bytes, k.max_bytes)]
    trials = 0
    if spec.tuning.enabled and spec.tuning.profiler == "simulated":  # others do not search here
        per_bucket = spec.tuning.budget + VERIFY_TRIALS_PER_BUCKET
        trials = sum(_buckets(k) * per_bucket for k in keys)
    synth = 0
    if spec.synthesis.enabled and spec.publish.runtime != "nccl":  # stock NCCL: not synthesized
        synth = sum(k.ranks for k, _ in points) * SYNTH_UNITS_PER_POINT_RANK
    baseline = sum(_point_units(k, s) for k, s in points)
    return Workload(len(keys), len(points), trials, baseline, synth)


def _check_parallelism(spec: CCLTuningSpec, topo: ClusterTopology) -> None:
    par = spec.parallelism
    if par is None:
        return
    need = par.tp * par.pp * par.dp
    if need > topo.world_size:
        raise PlanError(f"spec.parallelism: tp x pp x dp = {par.tp} x {par.pp} x {par.dp} = {need} "
                        f"GPUs, but the target nodes have {topo.world_size}")  # fmt: skip


def _check_communicator(field: str, comm: Communicator, topo: ClusterTopology) -> None:
    """The planner (and NCCL's regular groups) need the same GPU count on each node of a group."""
    per_node = Counter(r // topo.gpus_per_node for r in comm.ranks)
    if len(set(per_node.values())) == 1:
        return
    shown = ", ".join(f"{c} on {topo.nodes[n].name}" for n, c in sorted(per_node.items())[:6])
    gpn = topo.gpus_per_node
    raise PlanError(f"{field}: the {comm.role} communicator of {len(comm.ranks)} ranks puts {shown}; "
                    f"each node of a communicator must hold the same number of its GPUs (with "
                    f"{gpn} GPUs per node, use sizes that divide {gpn} or are multiples of it)")  # fmt: skip


def _check_overlap(spec: CCLTuningSpec, keyed: list[tuple[TaskKey, Communicator]]) -> None:
    groups: dict[tuple[str, int, int, str], list[tuple[int, TaskKey]]] = {}
    for i, (k, _) in enumerate(keyed):
        groups.setdefault((str(k.collective), k.ranks, k.nodes, k.role), []).append((i, k))
    for (coll, ranks, _nodes, role), items in groups.items():
        items.sort(key=lambda item: item[1].min_bytes)
        for (i, a), (j, b) in itertools.pairwise(items):
            if b.min_bytes <= a.max_bytes:
                first, second = sorted((i, j))
                raise PlanError(
                    f"{_field(spec, second)}: {coll} {format_size(b.min_bytes)}..{format_size(b.max_bytes)} "
                    f"overlaps {_field(spec, first)} ({format_size(a.min_bytes)}..{format_size(a.max_bytes)}) "
                    f"on the same {role} communicator of {ranks} ranks; give each size once"
                )


def preflight(spec: CCLTuningSpec, topo: ClusterTopology) -> tuple[list[TaskKey], Workload]:
    """The task keys and the work estimate; PlanError naming the field when it cannot be planned."""
    _check_parallelism(spec, topo)
    try:
        keyed = task_keys(spec, topo)
    except PlanError as exc:
        text = str(exc)
        if not spec.collectives and text.startswith("spec.collectives["):
            text = "spec.parallelism" + text[text.index("]") + 1 :]  # derived tasks have no index
        raise PlanError(text) from None
    for i, (_key, comm) in enumerate(keyed):
        _check_communicator(_field(spec, i), comm, topo)
    _check_overlap(spec, keyed)
    keys = [k for k, _ in keyed]
    return keys, estimate(spec, keys)


__all__ = ["Workload", "estimate", "preflight"]
