"""A plan's syntheses sharded over the pods of one Indexed Job (batch/v1, completionMode Indexed).

The operator spreads the tasks' syntheses over `shards` (synth/units.assign), writes spec,
cluster and that assignment into an input ConfigMap, and starts a Job with completions =
parallelism = shards. Pod i runs `ccltune solve-shard`, which reads $JOB_COMPLETION_INDEX,
synthesizes its tasks and writes them (gzipped JSON, split under the ConfigMap limit) to
`<job>-result-<i>`, owned by the Job. Once every index has written, the results are merged by
task index (the same whatever order the pods finished in) and the plan continues with them, in
the operator or in the plan Job (`--shard-job`). A failed index is retried per
backoffLimitPerIndex; one that still fails is reported by index, and nothing is published.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from typing import Any

from ..api.ccltuning import CCLTuningSpec
from ..api.cluster import ClusterTopology
from ..api.common import API_GROUP
from ..api.errors import InputError
from ..pipeline import synthesis_units
from ..synth.units import SynthesisUnit, Synthesized, assign, from_json, merge, run_units, to_json
from ..workload import Workload
from . import jobs
from .config import OperatorConfig
from .kube import ApiError, KubeClient, connection_from_env

LABEL_SHARDS = f"{API_GROUP}/shards"
SHARD_COMMAND = ["python", "-m", "ccltune", "solve-shard"]
FORMAT = 1  # of the shard input; bumped when it changes, so old results are never reused


def shard_count(spec: CCLTuningSpec, units: list[SynthesisUnit], work: Workload,
                cfg: OperatorConfig) -> int:  # fmt: skip
    """spec.synthesis.shards, else one shard per synthesisShardWork of estimated synthesis work;
    at most one per task and synthesisMaxShards."""
    wanted = spec.synthesis.shards or work.synthesis // cfg.synthesis_shard_work
    return max(1, min(wanted, len(units), cfg.synthesis_max_shards))


@dataclass(frozen=True)
class ShardNames:
    digest: str
    shards: int

    @property
    def job(self) -> str:
        return f"ccltune-synth-{self.digest[:12]}"

    @property
    def input(self) -> str:
        return f"{self.job}-input"

    def result(self, index: int) -> str:
        return f"{self.job}-result-{index}"

    @classmethod
    def of_job(cls, job: str, shards: int) -> ShardNames:
        return cls(job.removeprefix("ccltune-synth-"), shards)


_adopted: set[str] = set()  # shard Jobs whose input this process has made theirs


class ShardFailed(Exception):
    """A shard failed for good: the message names the shard(s) and the Job."""


class ShardsRunning(Exception):
    """The Indexed Job has not finished: the message says how far it is."""


def shard_input(spec: CCLTuningSpec, cluster: ClusterTopology, name: str,
                shards: tuple[tuple[int, ...], ...]) -> dict[str, Any]:  # fmt: skip
    return {"format": FORMAT, "name": name, "spec": spec.wire(), "cluster": cluster.wire(),
            "shards": [list(s) for s in shards]}  # fmt: skip


def _labels(names: ShardNames, tuning_uid: str, role: str) -> dict[str, str]:
    # component plan-job: the healer's sweep removes what a deleted CCLTuning left (healing.py).
    return {"app.kubernetes.io/managed-by": "ccltune-operator",
            "app.kubernetes.io/component": "plan-job", jobs.LABEL_INPUT: names.digest[:63],
            jobs.LABEL_ROLE: role, jobs.LABEL_TUNING_UID: tuning_uid,
            LABEL_SHARDS: str(names.shards)}  # fmt: skip


def job_manifest(names: ShardNames, cfg: OperatorConfig, tuning_uid: str,
                 deadline_s: int) -> dict[str, Any]:  # fmt: skip
    args = ["--namespace", cfg.namespace, "--input", names.input, "--output", names.job + "-result",
            "--job", names.job]  # fmt: skip
    spec = {"completionMode": "Indexed", "completions": names.shards, "parallelism": names.shards,
            "backoffLimitPerIndex": cfg.job_backoff_limit}  # fmt: skip
    return jobs.batch_job(names.job, _labels(names, tuning_uid, "synthesis-shard"), cfg, deadline_s,
                          SHARD_COMMAND, args, spec)  # fmt: skip


# ---- operator side ----------------------------------------------------------------------------


def plan_shards(spec: CCLTuningSpec, cluster: ClusterTopology, work: Workload, cfg: OperatorConfig,
                name: str, namespace: str) -> tuple[ShardNames, dict[str, Any]] | None:  # fmt: skip
    """The Indexed Job this plan's syntheses run in (names, input payload); None: not sharded."""
    units = synthesis_units(spec, cluster)
    count = shard_count(spec, units, work, cfg)
    if count < 2:
        return None
    payload = shard_input(spec, cluster, name, assign(units, count))
    return ShardNames(jobs.input_hash(payload, namespace), count), payload


@dataclass
class Results:
    merged: dict[int, Synthesized] | None  # None until every index has written, without error
    errors: dict[int, str]  # shard index -> the error it wrote (or why its result is unreadable)
    missing: list[int]  # shard indexes that have written nothing yet


async def read_results(client: KubeClient, names: ShardNames, namespace: str) -> Results:
    found: list[list[Synthesized]] = []
    errors: dict[int, str] = {}
    missing: list[int] = []
    for index in range(names.shards):
        main = await client.get("v1", "configmaps", names.result(index), namespace)
        if main is None:
            missing.append(index)
            continue
        error = (main.get("data") or {}).get(jobs.ERROR_KEY)
        if error is not None:
            errors[index] = error
            continue
        parts = [await client.get("v1", "configmaps", part, namespace)
                 for part in jobs.result_part_names(main)]  # fmt: skip
        try:
            found.append(from_json(jobs.read_packed(main, parts).decode()))
        except (ValueError, OSError, EOFError) as exc:  # a part deleted by hand, or corrupt
            errors[index] = f"unreadable result {names.result(index)}: {exc}"
    return Results(None if missing or errors else merge(found), errors, missing)


async def syntheses(client: KubeClient, cfg: OperatorConfig, spec: CCLTuningSpec,
                    cluster: ClusterTopology, work: Workload, name: str, namespace: str,
                    tuning_uid: str) -> tuple[ShardNames, dict[int, Synthesized]] | None:  # fmt: skip
    """The plan's syntheses from its Indexed Job, started here if need be; None: not sharded.
    Raises ShardsRunning until every index has written, ShardFailed when one never will."""
    planned = plan_shards(spec, cluster, work, cfg, name, namespace)
    if planned is None:
        return None
    names, payload = planned
    jns = cfg.namespace
    where = f"Job {jns}/{names.job}"
    got = await read_results(client, names, jns)
    if got.merged is not None or got.errors:
        return names, _checked(got, names, payload, where)
    job = await client.get("batch/v1", "jobs", names.job, jns)
    if job is None:
        with contextlib.suppress(ApiError):  # 409: a pass before this one wrote it
            await client.create("v1", "configmaps", jobs.packed_input(
                names.input, payload, jns, _labels(names, tuning_uid, "input")), jns)
        per_shard = max(len(s) for s in payload["shards"])
        deadline = spec.synthesis.time_budget_seconds * per_shard + 900
        try:
            job = await client.create("batch/v1", "jobs",
                                      job_manifest(names, cfg, tuning_uid, deadline), jns)  # fmt: skip
        except ApiError as exc:
            if exc.status != 409:
                raise
            job = await client.get("batch/v1", "jobs", names.job, jns)
    assert job is not None
    if names.job not in _adopted:
        # The input goes with the Job. Also on resume: a pass killed between creating the Job
        # and this patch left the input ownerless (as for plan Jobs, reconcile.py).
        with contextlib.suppress(ApiError):  # gone already (404): nothing to own
            await client.patch("v1", "configmaps", names.input, {"metadata": {"ownerReferences": [
                jobs.owner_ref({**job, "apiVersion": "batch/v1", "kind": "Job"})]}}, jns)
            _adopted.add(names.job)
    status = job.get("status") or {}
    failure = jobs.job_failure(job)
    # Only the Complete condition says it finished: status.succeeded counts indexes as they end.
    complete = any(c.get("type") == "Complete" and c.get("status") == "True"
                   for c in status.get("conditions") or [])  # fmt: skip
    if failure is not None or complete:
        got = await read_results(client, names, jns)  # pods write before they end: read again
        if got.merged is not None or got.errors:
            return names, _checked(got, names, payload, where)
        # Finished, yet these indexes wrote nothing (killed: out of memory, deadline, evicted).
        reason, message = failure or ("NoResult", "finished without writing its result")
        raise ShardFailed(f"synthesis shard(s) {', '.join(map(str, got.missing))} of {names.shards} "
                          f"({where}) failed: {reason}" + (f": {message}" if message else ""))  # fmt: skip
    done = status.get("completedIndexes") or "none"
    raise ShardsRunning(f"synthesizing in {names.shards} shards ({where}; indexes done: {done})")


def _checked(got: Results, names: ShardNames, payload: dict[str, Any],
             where: str) -> dict[int, Synthesized]:  # fmt: skip
    """The merged results, or ShardFailed naming each shard that wrote an error."""
    if got.errors:
        raise ShardFailed("; ".join(f"synthesis shard {i} of {names.shards} ({where}) failed: {e}"
                                    for i, e in sorted(got.errors.items())))  # fmt: skip
    assert got.merged is not None
    expected = {u for s in payload["shards"] for u in s}
    if set(got.merged) != expected:
        raise ShardFailed(f"{where}: results for tasks {sorted(got.merged)}, expected {sorted(expected)}")
    return got.merged


def _indexes(text: str | None) -> set[int]:
    """'0,2-4' (the Job status' index list) -> {0, 2, 3, 4}."""
    out: set[int] = set()
    for part in (text or "").split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.add(int(part))
    return out


# ---- pod side: `ccltune solve-shard` ----------------------------------------------------------


async def run(namespace: str, input_cm: str, output: str, job_name: str | None, index: int) -> int:
    client = KubeClient(connection_from_env())
    name = f"{output}-{index}"
    try:
        cm = await client.get("v1", "configmaps", input_cm, namespace)
        if cm is None:
            print(f"solve-shard: input ConfigMap {namespace}/{input_cm} not found", file=sys.stderr)
            return 2
        job = await client.get("batch/v1", "jobs", job_name, namespace) if job_name else None
        try:
            text = await asyncio.to_thread(solve, jobs.read_payload(cm, jobs.INPUT_KEY + ".gz"), index)
            bodies = jobs.packed_configmaps(name, text, namespace, job)
            code = 0
        except (InputError, ValueError, KeyError) as exc:
            bodies = jobs.packed_configmaps(name, None, namespace, job, error=f"bad shard input: {exc}")
            code = 1
        except Exception as exc:
            bodies = jobs.packed_configmaps(name, None, namespace, job, error=(
                f"internal error (a ccltune bug): {type(exc).__name__}: {exc}"))
            code = 1
        for body in bodies:
            try:
                await client.create("v1", "configmaps", body, namespace)
            except ApiError as exc:
                if exc.status != 409:  # a retried pod may find its own earlier result: keep it
                    raise
        print(f"solve-shard: wrote {namespace}/{name}" + (" (error)" if code else ""))
        return code
    finally:
        await client.aclose()


def solve(payload: dict[str, Any], index: int) -> str:
    """Shard `index` of a shard input: its tasks' syntheses as JSON (synth/units.to_json)."""
    if payload.get("format") != FORMAT:
        raise ValueError(f"shard input format {payload.get('format')}, expected {FORMAT}")
    shards = payload["shards"]
    if not 0 <= index < len(shards):
        raise ValueError(f"shard index {index} not in 0..{len(shards) - 1}")
    spec = CCLTuningSpec.model_validate(payload["spec"])
    cluster = ClusterTopology.model_validate(payload["cluster"])
    mine = set(shards[index])
    units = [u for u in synthesis_units(spec, cluster) if u.index in mine]
    if len(units) != len(mine):
        raise ValueError(f"shard {index} names tasks {sorted(mine)}; the spec has "
                         f"{len(synthesis_units(spec, cluster))} syntheses")  # fmt: skip
    return to_json(run_units(units).values())
