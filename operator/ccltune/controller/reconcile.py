"""One reconcile pass of a CCLTuning: validate, discover, plan (here or in a Job), publish.

Every step is idempotent and keyed by content (plan input hash, plan digest), so a pass can be
cut anywhere (operator restart) and the next one picks up where the cluster state says.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import ValidationError

from ..api.ccltuning import CCLTuningSpec, PublishedConfigMap, TaskResult, TopologySummary
from ..api.cluster import ClusterTopology
from ..api.common import API_GROUP, API_VERSION
from ..api.errors import InputError, one_line
from ..api.nodetopology import NodeTopology
from ..api.plan import Plan
from ..workload import Workload
from . import benchmarkrun, daemonset, healing, jobs, logs, metrics, shardjob, topology
from .config import OperatorConfig
from .kube import ApiError, KubeClient
from .planqueue import PlanQueue
from .publishing import apply_configmaps, prune, with_owner
from .selectors import target_nodes
from .status import StatusBook

GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
REPROBE_REQUEST = f"{API_GROUP}/reprobe-request"
REPROBE_SERVED = f"{API_GROUP}/reprobe-served"
REPLAN_ANNOTATION = f"{API_GROUP}/replan"
PLAN_INPUT = f"{API_GROUP}/plan-input"


@dataclass
class Context:
    client: KubeClient
    cfg: OperatorConfig
    # (namespace, name) -> {node: content hash} of the reports the last plan used.
    inputs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    # Tunings waiting for reports of these nodes: (namespace, name) -> nodes.
    waiting: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    # In-process plans are CPU-bound and share the GIL: more at once only adds memory.
    plan_queue: PlanQueue | None = None
    # (namespace, name) -> pointer ConfigMap of the generation this process published or found
    # whole; the healer re-checks these (healing.py).
    published: dict[tuple[str, str], str] = field(default_factory=dict)
    # Plan Jobs whose input ConfigMap this process has made theirs (owner reference).
    adopted: set[str] = field(default_factory=set)
    gather_slots: asyncio.Semaphore | None = None

    def gathering(self) -> asyncio.Semaphore:
        if self.gather_slots is None:
            self.gather_slots = asyncio.Semaphore(4)
        return self.gather_slots

    def queue(self) -> PlanQueue:
        if self.plan_queue is None:
            self.plan_queue = PlanQueue(self.cfg.inprocess_concurrency)
        return self.plan_queue


class Stop(Exception):
    """End this pass: permanent (no retries until something changes) or retry after a delay."""

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


def report_hash(report: dict[str, Any]) -> str:
    spec = report.get("spec") or {}
    if spec.get("contentHash"):
        return str(spec["contentHash"])
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": GROUP_VERSION, "kind": "CCLTuning", "name": meta["name"],
            "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}


def _status_patch(book: StatusBook) -> dict[str, Any]:
    wire = book.wire()
    # Merge patch keeps fields it does not mention: clear the ones this pass left unset.
    for name, info in type(book.status).model_fields.items():
        alias = info.alias or name
        wire.setdefault(alias, None)
    return {"status": wire}


async def write_status(ctx: Context, body: dict[str, Any], book: StatusBook) -> None:
    meta = body["metadata"]
    try:
        await ctx.client.patch(GROUP_VERSION, "ccltunings", meta["name"], _status_patch(book),
                               meta["namespace"], subresource="status")
    except ApiError as exc:
        if exc.status == 404:
            return  # deleted meanwhile: nothing to report to
        raise
    for cond in book.transitions:
        kind = "Warning" if cond.status == "False" and cond.reason not in _QUIET else "Normal"
        kopf.event(kopf.Body(cast(kopf.RawBody, body)), type=kind, reason=cond.reason, message=f"{cond.type}={cond.status}: {cond.message}"[:1024])
    book.transitions = []
    ready = book.condition("Ready")
    ctx_ready = ready is not None and ready.status == "True"
    _ready_set(meta, ctx_ready)


_QUIET = {"NotRequested", "WaitingForNodeReports", "Planning", "PlanJobRunning", "ReprobeRequested",
          "BenchmarkRunning", "SynthesisShardsRunning"}
_ready_names: set[tuple[str, str]] = set()


def _ready_set(meta: dict[str, Any], ready: bool) -> None:
    key = (meta["namespace"], meta["name"])
    if ready:
        _ready_names.add(key)
    else:
        _ready_names.discard(key)
    metrics.READY.set(len(_ready_names))


def forget(namespace: str, name: str) -> None:
    _ready_names.discard((namespace, name))
    metrics.READY.set(len(_ready_names))


async def reconcile(ctx: Context, body: dict[str, Any], *, started: datetime, logger: Any) -> None:
    """Run one pass; raises kopf.TemporaryError/PermanentError as kopf expects."""
    t0 = time.monotonic()
    meta = body["metadata"]
    book = StatusBook(body.get("status"), meta.get("generation"))
    outcome = "error"
    try:
        await _reconcile(ctx, body, book, started=started, logger=logger)
        outcome = "ready"
    except Stop as stop:
        await write_status(ctx, body, book)
        outcome = "retry" if stop.delay is not None else "stopped"
        # Waiting (for a Job, for reports) is routine and a stop is the user's to fix: kopf's
        # ERROR line for these is lowered (logs.py).
        logs.expect(meta["namespace"], meta["name"], str(stop),
                    logging.INFO if stop.delay is not None else logging.WARNING)
        if stop.delay is not None:
            raise kopf.TemporaryError(str(stop), delay=stop.delay) from None
        raise kopf.PermanentError(str(stop)) from None
    except (kopf.TemporaryError, kopf.PermanentError):
        raise
    except Exception as exc:
        # A bug or an unreachable API: one line in the status, the traceback in the log.
        logger.exception("reconcile failed")
        book.set("Ready", "False", "InternalError", f"{type(exc).__name__}: {exc}"[:1024])
        with contextlib.suppress(Exception):
            await write_status(ctx, body, book)
        raise kopf.TemporaryError(f"{type(exc).__name__}: {exc}", delay=60) from None
    finally:
        metrics.RECONCILES.labels(outcome).inc()
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - t0)


async def _reconcile(ctx: Context, body: dict[str, Any], book: StatusBook, *, started: datetime,
                     logger: Any) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    try:
        spec = CCLTuningSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        message = one_line(exc, "spec")
        book.set("Ready", "False", "InvalidSpec", message)
        book.status.message = message[:1024]  # every problem is named: the list can be long
        raise Stop(f"invalid spec: {message}") from None

    action = await daemonset.sync(ctx.client, ctx.cfg)
    metrics.DAEMONSET_SYNCS.labels(action).inc()

    # Node and report objects are big and many: read them a few tunings at a time, and only
    # inside _cluster, so they are garbage once the ClusterTopology exists.
    async with ctx.gathering():
        cluster = await _cluster(ctx, body, spec, book, started)

    work = _preflight(ctx, spec, cluster, book)
    profiles = await _profiles(ctx, body, spec, cluster, book)
    files = profiles.files if profiles is not None else None
    note = profiles.describe() if profiles is not None else None
    input_digest = jobs.input_hash(jobs.plan_input(spec, cluster, name=name, profiles=files, profile_note=note), ns)
    if await _up_to_date(ctx, body, spec, input_digest, book):
        _ready_set(meta, True)
        return  # e.g. an operator restart: same inputs, same plan, nothing to redo
    plan = await _plan(ctx, body, spec, cluster, work, book, logger, files, note)
    await _publish(ctx, body, spec, plan, book, input_digest)
    _measured(book, profiles)
    await write_status(ctx, body, book)


async def _profiles(ctx: Context, body: dict[str, Any], spec: CCLTuningSpec, cluster: ClusterTopology,
                    book: StatusBook) -> benchmarkrun.Profiles | None:
    """Measured profiles (profiler live or replay) or None to tune on the simulator."""
    opts = spec.tuning
    if not opts.enabled or opts.profiler == "simulated":
        return None
    try:
        return await benchmarkrun.measured_profiles(ctx.client, ctx.cfg, body, spec, cluster)
    except benchmarkrun.NotYet as exc:
        running = exc.reason == "BenchmarkRunning"
        book.set("Tuned", "Unknown" if running else "False", exc.reason, exc.message[:1024])
        book.set("Ready", "False", exc.reason, exc.message[:1024])
        book.status.message = exc.message[:1024]
        raise Stop(exc.message, delay=exc.delay) from None


def _measured(book: StatusBook, profiles: benchmarkrun.Profiles | None) -> None:
    """Say where measured numbers came from: the run's Job and time, and what is missing."""
    book.status.measurement = None if profiles is None else profiles.record
    tuned = book.condition("Tuned")
    if profiles is None or tuned is None:
        return
    rec = profiles.record
    where = f"measured by {rec.job or 'ConfigMap ' + rec.config_map} at {rec.measured_at or 'unknown time'}"
    missing = f"; {rec.missing_points} point(s) timed out or failed (missing, not zero)" if rec.missing_points else ""
    book.set("Tuned", tuned.status, tuned.reason, f"{tuned.message}; {where}{missing}"[:1024])


async def _cluster(ctx: Context, body: dict[str, Any], spec: CCLTuningSpec, book: StatusBook,
                   started: datetime) -> ClusterTopology:
    """Targets -> their reports -> ClusterTopology; sets TopologyReady either way."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    key = (ns, name)
    nodes = await ctx.client.list("v1", "nodes")
    pods = [] if (spec.nodes.names or spec.nodes.selector) else await ctx.client.list("v1", "pods", ns)
    targets = target_nodes(spec, nodes, pods, ctx.cfg.gpu_label)
    if not targets:
        book.set("TopologyReady", "False", "NoTargetNodes",
                 "no node matches spec.nodes and no GPU node was found")
        book.set("Ready", "False", "NoTargetNodes", "nothing to plan for yet")
        raise Stop("no target nodes", delay=ctx.cfg.retry_seconds * 6)
    reports = await _reports(ctx, targets)
    if spec.rediscover:
        reports = await _rediscover(ctx, body, targets, reports, book, started)
    missing = [n for n in targets if n not in reports]
    if missing:
        ctx.waiting[key] = set(missing)
        shown = ", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
        waited = (datetime.now(UTC) - started).total_seconds()
        if waited >= ctx.cfg.topology_timeout_seconds:
            message = f"no NodeTopology report after {int(waited)}s for node(s): {shown}"
            book.set("TopologyReady", "False", "NodeReportsMissing", message)
            book.set("Ready", "False", "NodeReportsMissing", message)
            raise Stop(message)  # a report arriving later triggers a new pass
        message = f"waiting for NodeTopology of node(s): {shown}"
        book.set("TopologyReady", "False", "WaitingForNodeReports", message)
        book.set("Ready", "False", "WaitingForNodeReports", message)
        raise Stop(message, delay=ctx.cfg.retry_seconds)
    ctx.waiting.pop(key, None)
    used = {n: reports[n] for n in targets}
    try:
        parsed = [NodeTopology.model_validate({"spec": r.get("spec"), "status": r.get("status") or {}})
                  for r in used.values()]
        node_objs = {n["metadata"]["name"]: n for n in nodes}
        cluster = topology.build_cluster(parsed, node_objs, name=name)
    except topology.Unavailable as exc:
        book.set("TopologyReady", "False", "TopologyBuilderUnavailable", str(exc))
        book.set("Ready", "False", "TopologyBuilderUnavailable", str(exc))
        raise Stop(str(exc)) from None
    except (InputError, ValidationError) as exc:
        message = one_line(exc) if isinstance(exc, ValidationError) else str(exc)
        book.set("TopologyReady", "False", "InvalidTopology", message)
        book.set("Ready", "False", "InvalidTopology", message)
        raise Stop(message) from None
    ctx.inputs[key] = {n: report_hash(r) for n, r in used.items()}
    warned = "".join(f"; warning: {w}" for w in topology.caveats(parsed, cluster))
    book.set("TopologyReady", "True", "NodeReportsComplete",
             f"{len(targets)} node(s): {topology.describe(cluster)}{warned}"[:1024])
    book.status.topology = TopologySummary(
        nodes=cluster.node_count, gpus=cluster.world_size, gpu_model=cluster.gpu_model[:256],
        dimensions=topology.describe(cluster)[:256], symmetric=cluster.dimensions is not None)

    return cluster


async def _reports(ctx: Context, targets: list[str]) -> dict[str, dict[str, Any]]:
    """Target node -> its NodeTopology (the agent names the object after the node)."""
    wanted = set(targets)
    out: dict[str, dict[str, Any]] = {}

    def keep(items: list[dict[str, Any]]) -> None:
        for r in items:
            node = (r.get("spec") or {}).get("nodeName") or r["metadata"]["name"]
            if node in wanted:
                out[node] = r

    if len(targets) > 64:  # pages beat many gets; small target sets read only what they use
        async for page in ctx.client.pages(GROUP_VERSION, "nodetopologies"):
            keep(page)
    else:
        got = await asyncio.gather(*(ctx.client.get(GROUP_VERSION, "nodetopologies", n) for n in targets))
        keep([r for r in got if r is not None])
    return out


async def _rediscover(ctx: Context, body: dict[str, Any], targets: list[str],
                      reports: dict[str, dict[str, Any]], book: StatusBook, started: datetime
                      ) -> dict[str, dict[str, Any]]:
    """Ask the agents for a fresh probe once per generation; wait for reports newer than that."""
    meta = body["metadata"]
    token = f"{meta.get('uid', '')[:8]}-{meta.get('generation', 0)}"
    pending = []
    for node in targets:
        report = reports.get(node)
        if report is None:
            continue  # a first report is fresh by definition
        annotations = report["metadata"].get("annotations") or {}
        if annotations.get(REPROBE_SERVED) == token:
            continue
        probed = (report.get("spec") or {}).get("probedAt")
        if probed and datetime.fromisoformat(str(probed).replace("Z", "+00:00")) > started:
            continue
        if annotations.get(REPROBE_REQUEST) != token:
            await ctx.client.patch(GROUP_VERSION, "nodetopologies", report["metadata"]["name"],
                                   {"metadata": {"annotations": {REPROBE_REQUEST: token}}})
        pending.append(node)
    if pending:
        message = f"asked {len(pending)} agent(s) to re-probe (token {token}): {', '.join(pending[:10])}"
        book.set("TopologyReady", "False", "ReprobeRequested", message)
        book.set("Ready", "False", "ReprobeRequested", message)
        raise Stop(message, delay=ctx.cfg.retry_seconds)
    return reports


async def _up_to_date(ctx: Context, body: dict[str, Any], spec: CCLTuningSpec, input_digest: str,
                      book: StatusBook) -> bool:
    """The published generation came from exactly these inputs and the status says so."""
    from ..publish.configmaps import LABEL_DIGEST

    meta = body["metadata"]
    ready = book.condition("Ready")
    if ready is None or ready.status != "True" or book.status.observed_generation != meta.get("generation"):
        return False
    pointer_name = config_map_name(spec, meta["name"])
    pointer = await ctx.client.get("v1", "configmaps", pointer_name, meta["namespace"])
    annotations = ((pointer or {}).get("metadata") or {}).get("annotations") or {}
    if not (annotations.get(PLAN_INPUT) == input_digest
            and book.status.plan_digest == f"sha256:{annotations.get(LABEL_DIGEST)}"):
        return False
    # Same inputs, but is what they produced still there, byte for byte? (a restart is when a
    # deleted or edited ConfigMap would otherwise go unnoticed)
    damage = await healing.check_generation(ctx.client, pointer_name, meta["namespace"])
    if damage is not None:
        metrics.HEALS.labels(damage.reason).inc()
        book.set("Published", "False", "PublicationDamaged", f"{damage.message}; republishing")
        return False
    ctx.published[(meta["namespace"], meta["name"])] = pointer_name
    return True


def _preflight(ctx: Context, spec: CCLTuningSpec, cluster: ClusterTopology, book: StatusBook) -> Workload:
    """Everything the planner would reject, and the hard limits, before any planning work."""
    from ..workload import preflight

    try:
        _keys, work = preflight(spec, cluster)
    except InputError as exc:
        _plan_failed(book, spec, "InvalidSpec", str(exc))
        raise Stop(str(exc)) from None
    too_big = jobs.over_limit(work, ctx.cfg)
    if too_big is not None:
        _plan_failed(book, spec, "PlanTooLarge", too_big)
        raise Stop(too_big)
    return work


async def _plan(ctx: Context, body: dict[str, Any], spec: CCLTuningSpec, cluster: ClusterTopology,
                work: Workload, book: StatusBook, logger: Any, profiles: dict[str, str] | None = None,
                note: str | None = None) -> Plan:
    meta = body["metadata"]
    why = jobs.needs_job(spec, cluster, work, ctx.cfg)
    if why is None:
        sharded = await _sharded(ctx, body, spec, cluster, work, book)
        queue = ctx.queue()
        ahead = queue.ahead(work.units)
        queued = f" (queued: {ahead} plan(s) go first)" if ahead >= queue.slots else ""
        book.set("Ready", "Unknown", "Planning",
                 f"planning in the operator: {work.describe()}{queued}")
        await write_status(ctx, body, book)  # planning can take a while: say so now
        try:
            async with queue.slot((meta["namespace"], meta["name"]), work.units):
                t0 = time.monotonic()
                plan = await asyncio.to_thread(jobs.plan_with_profiles, spec, cluster, meta["name"], profiles, note,
                                               sharded[1] if sharded else None)
        except InputError as exc:
            _plan_failed(book, spec, "InvalidSpec", str(exc))
            raise Stop(str(exc)) from None
        except Exception as exc:  # a bug of ours, never the spec's fault
            logger.exception("planning failed")
            _plan_failed(book, spec, "InternalError", f"internal error (a ccltune bug): {type(exc).__name__}: {exc}")
            raise Stop(str(exc)) from None
        metrics.PLAN_SECONDS.labels("operator").observe(time.monotonic() - t0)
        return plan
    return await _plan_in_job(ctx, body, spec, cluster, book, why, profiles, note, work)


async def _sharded(ctx: Context, body: dict[str, Any], spec: CCLTuningSpec, cluster: ClusterTopology,
                   work: Workload, book: StatusBook) -> tuple[shardjob.ShardNames, dict[int, Any]] | None:
    """The syntheses of a sharded plan (its Indexed Job, started if need be); None: not sharded."""
    meta = body["metadata"]
    try:
        return await shardjob.syntheses(ctx.client, ctx.cfg, spec, cluster, work, meta["name"],
                                        meta["namespace"], meta.get("uid", ""))
    except shardjob.ShardFailed as exc:
        _plan_failed(book, spec, "SynthesisShardFailed", str(exc))
        raise Stop(str(exc)) from None
    except shardjob.ShardsRunning as exc:
        book.set("Synthesized", "Unknown", "SynthesisShardsRunning", str(exc))
        book.set("Ready", "False", "SynthesisShardsRunning", str(exc))
        raise Stop(str(exc), delay=ctx.cfg.job_poll_seconds) from None


async def _plan_in_job(ctx: Context, body: dict[str, Any], spec: CCLTuningSpec, cluster: ClusterTopology,
                       book: StatusBook, why: str, profiles: dict[str, str] | None = None,
                       note: str | None = None, work: Workload | None = None) -> Plan:
    meta = body["metadata"]
    ns, jns = meta["namespace"], ctx.cfg.namespace
    payload = jobs.plan_input(spec, cluster, name=meta["name"], profiles=profiles, profile_note=note)
    names = jobs.JobNames(jobs.input_hash(payload, ns))
    result = await ctx.client.get("v1", "configmaps", names.result, jns)
    if result is not None:
        error = (result.get("data") or {}).get(jobs.ERROR_KEY)
        if error is not None:
            metrics.JOBS.labels("failed").inc()
            _plan_failed(book, spec, "PlanJobFailed", f"Job {jns}/{names.job}: {error}")
            raise Stop(error)
        parts = [await ctx.client.get("v1", "configmaps", part, jns)
                 for part in jobs.result_part_names(result)]  # fmt: skip
        try:
            plan = Plan.model_validate(jobs.read_result(result, parts))
        except (ValueError, OSError, EOFError) as exc:  # a part deleted by hand, or corrupt
            why = one_line(exc) if isinstance(exc, ValidationError) else str(exc)
            text = f"Job {jns}/{names.job}: unreadable result {names.result}: {why}"
            _plan_failed(book, spec, "PlanJobNoResult", text)
            raise Stop(text) from None
        metrics.JOBS.labels("succeeded").inc()
        return plan
    job = await ctx.client.get("batch/v1", "jobs", names.job, jns)
    if job is None:
        uid = meta.get("uid", "")
        # A sharded synthesis runs first (its own Indexed Job); the plan Job reads its results.
        sharded = await _sharded(ctx, body, spec, cluster, work, book) if work is not None else None
        shard_args = [] if sharded is None else ["--shard-job", sharded[0].job, "--shards", str(sharded[0].shards)]
        try:
            await ctx.client.create("v1", "configmaps", jobs.input_configmap(names, payload, jns, uid), jns)
        except ApiError as exc:
            if exc.status != 409:
                raise
        deadline = spec.synthesis.time_budget_seconds + 900 if spec.synthesis.enabled else 3600
        try:
            job = await ctx.client.create("batch/v1", "jobs", jobs.job_manifest(names, ctx.cfg, uid, deadline, shard_args), jns)
            metrics.JOBS.labels("created").inc()
        except ApiError as exc:
            if exc.status != 409:  # a concurrent pass created it: that one is ours too
                raise
            job = await ctx.client.get("batch/v1", "jobs", names.job, jns)
    assert job is not None
    if names.job not in ctx.adopted:
        # The input goes with the Job (owner reference, same namespace). Also on resume: a pass
        # killed between creating the Job and this patch left the input ownerless.
        with contextlib.suppress(ApiError):  # gone already (404): nothing to own
            await ctx.client.patch("v1", "configmaps", names.input, {"metadata": {"ownerReferences": [
                jobs.owner_ref({**job, "apiVersion": "batch/v1", "kind": "Job"})]}}, jns)
            ctx.adopted.add(names.job)
    failure = jobs.job_failure(job)
    if failure is not None:
        reason, message = failure
        metrics.JOBS.labels("failed").inc()
        text = f"Job {jns}/{names.job} failed: {reason}" + (f": {message}" if message else "")
        _plan_failed(book, spec, "PlanJobFailed", text)
        raise Stop(text)
    if jobs.job_succeeded(job):
        text = f"Job {jns}/{names.job} succeeded but wrote no result ConfigMap {names.result}"
        _plan_failed(book, spec, "PlanJobNoResult", text)
        raise Stop(text)
    message = f"planning in Job {jns}/{names.job} ({why})"
    for ctype, enabled in (("Synthesized", spec.synthesis.enabled), ("Tuned", spec.tuning.enabled)):
        if enabled:
            book.set(ctype, "Unknown", "PlanJobRunning", message)
    book.set("Ready", "False", "PlanJobRunning", message)
    raise Stop(message, delay=ctx.cfg.job_poll_seconds)


def _plan_failed(book: StatusBook, spec: CCLTuningSpec, reason: str, message: str) -> None:
    for ctype, enabled in (("Synthesized", spec.synthesis.enabled), ("Tuned", spec.tuning.enabled)):
        if enabled:
            book.set(ctype, "False", reason, message)
    book.set("Published", "False", reason, "no plan to publish")
    book.set("Ready", "False", reason, message)
    book.status.message = message[:1024]


def _cm_digest(cm: dict[str, Any]) -> str:
    content = {"data": cm.get("data") or {}, "binaryData": cm.get("binaryData") or {}}
    return "sha256:" + hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def config_map_name(spec: CCLTuningSpec, name: str) -> str:
    # The same default `ccltune plan` uses, so online and offline publish the same objects.
    from ..publish.configmaps import pointer_name

    return pointer_name(name, spec.publish.config_map_name)


async def _publish(ctx: Context, body: dict[str, Any], spec: CCLTuningSpec, plan: Plan, book: StatusBook,
                   input_digest: str) -> None:
    from ..publish.configmaps import MANIFEST_KEY, render_configmaps

    meta = body["metadata"]
    ns = meta["namespace"]
    cm_name = config_map_name(spec, meta["name"])
    manifests = with_owner(render_configmaps(plan, name=cm_name, namespace=ns), owner_reference(body))
    # Which inputs produced this generation: lets a restarted operator skip re-planning.
    manifests[-1]["metadata"].setdefault("annotations", {})[PLAN_INPUT] = input_digest
    previous = await ctx.client.get("v1", "configmaps", cm_name, ns)
    keep = {m["metadata"]["name"] for m in manifests}
    if previous is not None:  # pods admitted a moment ago may still mount the last generation
        with contextlib.suppress(KeyError, ValueError, TypeError):
            keep |= set(json.loads((previous.get("data") or {})[MANIFEST_KEY])["configMaps"])
    await apply_configmaps(ctx.client, manifests, ns)
    await prune(ctx.client, cm_name, keep, ns)
    metrics.PUBLISHED.inc()
    ctx.published[(ns, meta["name"])] = cm_name

    _outcome_conditions(book, spec, plan)
    book.status.config_maps = [
        PublishedConfigMap(name=m["metadata"]["name"],
                           digest=("sha256:" + plan.digest) if i == len(manifests) - 1 else _cm_digest(m))
        for i, m in enumerate(manifests)
    ]
    book.status.plan_digest = "sha256:" + plan.digest
    book.status.results = [_task_result(t) for t in plan.tasks][:256]
    book.status.speedup = _speedup(plan)
    book.status.message = "; ".join(plan.notes)[:1024] or None
    book.set("Published", "True", "ConfigMapsPublished",
             f"{cm_name} -> generation {plan.digest[:12]} ({len(manifests) - 1} content ConfigMap(s))")
    book.set("Ready", "True", "PlanPublished", f"plan {plan.digest[:12]} published; speedup {book.status.speedup}")


def _outcome_conditions(book: StatusBook, spec: CCLTuningSpec, plan: Plan) -> None:
    notes = " ".join(plan.notes)
    msccl = sum(1 for t in plan.tasks if t.chosen.kind == "msccl" or any(
        e.choice is not None and e.choice.kind == "msccl" for e in t.chosen_estimates))
    tuned = sum(1 for t in plan.tasks if t.trials)
    for ctype, enabled, count, word in (
        ("Synthesized", spec.synthesis.enabled, msccl, "synthesis"),
        ("Tuned", spec.tuning.enabled, tuned, "tuning"),
    ):
        if count:
            book.set(ctype, "True", "Done", f"{count} of {len(plan.tasks)} task(s) use the {word} result")
        elif not enabled:
            book.set(ctype, "False", "NotRequested", f"spec.{word}.enabled is false")
        elif "not available" in notes and word in notes:
            book.set(ctype, "False", "NotAvailable", next(n for n in plan.notes if word in n)[:1024])
        else:
            book.set(ctype, "False", "DefaultKept", f"{word} found nothing better than NCCL's default")


def _task_result(task: Any) -> TaskResult:
    default = task.default_estimates[-1] if task.default_estimates else None
    chosen = task.chosen_estimates[-1] if task.chosen_estimates else None
    d_time = sum(e.time_us for e in task.default_estimates)
    c_time = sum(e.time_us for e in task.chosen_estimates)
    return TaskResult(
        key=task.key.label()[:256],
        default_busbw_gbps=None if default is None else round(default.busbw_gbps, 3),
        chosen_busbw_gbps=None if chosen is None else round(chosen.busbw_gbps, 3),
        speedup=round(d_time / c_time, 3) if c_time > 0 else None,
        choice=task.chosen.describe()[:256],
        source=", ".join(sorted({str(e.source) for e in task.chosen_estimates}))[:256],
    )


def _speedup(plan: Plan) -> str:
    """Total default time over total chosen time across every size point, with its source."""
    d = sum(e.time_us for t in plan.tasks for e in t.default_estimates)
    c = sum(e.time_us for t in plan.tasks for e in t.chosen_estimates)
    sources = sorted({str(e.source) for t in plan.tasks for e in t.chosen_estimates})
    if c <= 0:
        return "n/a"
    return f"{d / c:.2f}x ({'/'.join(sources)})"


async def nodes_changed(ctx: Context, node: str, content: str | None) -> list[tuple[str, str]]:
    """Tunings to re-plan because a target node's report appeared, changed or went away."""
    out = []
    for key, used in list(ctx.inputs.items()):
        if node in used and used[node] != content:
            out.append(key)
    for key, nodes in list(ctx.waiting.items()):
        if node in nodes and content is not None and key not in out:
            out.append(key)
    return out


async def request_replan(ctx: Context, key: tuple[str, str], why: str) -> None:
    ns, name = key
    try:
        await ctx.client.patch(GROUP_VERSION, "ccltunings", name,
                               {"metadata": {"annotations": {REPLAN_ANNOTATION: why[:200]}}}, ns)
    except ApiError as exc:
        if exc.status != 404:
            raise
