"""Measured profiles for a pass: the replay ConfigMap, a stored profile of this node shape, or a
benchmark run (MPIJob across nodes, Job on one) started, awaited and turned into profiles.

Profiles live in the operator's namespace as one ConfigMap per (node shape, collective,
communicator), so any later CCLTuning on equal nodes reuses them; delete one to measure again. A run past its deadline
(its controller's, or ours: creation + benchmarkTimeoutSeconds + benchmarkGraceSeconds) is
deleted; what it printed before is kept, the rest is stored missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..api.ccltuning import CCLTuningSpec, MeasuredProfile
from ..api.cluster import ClusterTopology
from . import benchmark as bench
from .config import OperatorConfig
from .kube import ApiError, KubeClient
from .selectors import matches, pod_selector, selector_is_empty

PROFILE_SUFFIXES = (".csv", ".log", ".txt")


class NotYet(Exception):
    """No profiles this pass: `reason` for the conditions; retry after `delay` (None: permanent)."""

    def __init__(self, reason: str, message: str, delay: float | None) -> None:
        super().__init__(message)
        self.reason, self.message, self.delay = reason, message, delay


@dataclass
class Profiles:
    files: dict[str, str]  # file name -> text, read by tune/profilers/replay.ReplayProfiler.from_dir
    record: MeasuredProfile
    notes: list[str]

    def describe(self) -> str:
        """For the plan's notes (the report): which run measured the numbers, when, what is missing."""
        rec = self.record
        text = (f"source measured: profiles {rec.config_map}, measured by {rec.job or 'an unnamed run'} "
                f"at {rec.measured_at or 'an unknown time'}")
        if rec.missing_points:
            text += f"; {rec.missing_points} point(s) timed out or failed and are missing (not zero)"
        return "; ".join([text, *self.notes])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_configmaps(cms: list[dict[str, Any]], notes: list[str]) -> Profiles:
    files: dict[str, str] = {}
    jobs, times, missing = [], [], 0
    for cm in cms:
        for key, text in sorted((cm.get("data") or {}).items()):
            if key.endswith(PROFILE_SUFFIXES):
                files[key] = text
        ann = cm["metadata"].get("annotations") or {}
        if ann.get(bench.ANN_JOB):
            jobs.append(ann[bench.ANN_JOB])
        if ann.get(bench.ANN_AT):
            times.append(ann[bench.ANN_AT])
        missing += int(ann.get(bench.ANN_MISSING) or 0)
        name = cm["metadata"]["name"]
        notes = notes + [f"{name}: {ann[k]}" for k in (bench.ANN_LAUNCHES, bench.ANN_NOTES) if ann.get(k)]
    record = MeasuredProfile(config_map=", ".join(cm["metadata"]["name"] for cm in cms)[:253],
                             job=", ".join(sorted(set(jobs)))[:256] or None,
                             measured_at=max(times) if times else None, missing_points=missing)
    return Profiles(files, record, notes)


async def measured_profiles(client: KubeClient, cfg: OperatorConfig, body: dict[str, Any], spec: CCLTuningSpec,
                            cluster: ClusterTopology) -> Profiles | None:
    """The profiles to tune on; None when the spec tunes nothing a run can measure."""
    meta = body["metadata"]
    if spec.tuning.profiler == "replay" and spec.tuning.replay_config_map:
        cm = await client.get("v1", "configmaps", spec.tuning.replay_config_map, meta["namespace"])
        if cm is None:
            raise NotYet("ReplayConfigMapMissing", f"spec.tuning.replayConfigMap: ConfigMap "
                         f"{meta['namespace']}/{spec.tuning.replay_config_map} not found", cfg.retry_seconds * 12)
        profiles = from_configmaps([cm], [])
        if not profiles.files:
            raise NotYet("InvalidSpec", f"spec.tuning.replayConfigMap: {spec.tuning.replay_config_map} holds no "
                         f"key ending in {', '.join(PROFILE_SUFFIXES)} (sweep CSV or nccl-tests log)", None)
        return profiles
    full = bench.plan_trials(spec, cluster)
    if not full.trials:
        return None
    stored = {u: await client.get("v1", "configmaps", bench.profile_name(full.shape, *u), cfg.namespace)
              for u in full.units}  # fmt: skip
    lacking = {u for u, cm in stored.items() if cm is None}
    if lacking:
        await _run(client, cfg, body, spec, cluster, lacking)  # raises NotYet until stored
        stored = {u: await client.get("v1", "configmaps", bench.profile_name(full.shape, *u), cfg.namespace)
                  for u in full.units}  # fmt: skip
    return from_configmaps([cm for cm in stored.values() if cm is not None], full.notes)


async def _run(client: KubeClient, cfg: OperatorConfig, body: dict[str, Any], spec: CCLTuningSpec,
               cluster: ClusterTopology, lacking: set[bench.Unit]) -> None:
    meta = body["metadata"]
    plan = bench.plan_trials(spec, cluster, wanted=lacking)
    image = spec.tuning.benchmark_image or cfg.benchmark_image
    if image is None:
        raise NotYet("BenchmarkImageMissing", "spec.tuning.benchmarkImage: profiler live needs an image holding "
                     "nccl-tests and the job's NCCL (or the chart's benchmark.image)", None)
    multi = len(plan.nodes) > 1
    kind = "MPIJob" if multi else "Job"
    api = (bench.MPI_GROUP_VERSION, "mpijobs") if multi else ("batch/v1", "jobs")
    name = bench.run_name(plan.shape, plan.trials, image)
    ns = cfg.namespace
    job = await client.get(*api, name, ns)
    if job is None:
        await _check_can_start(client, cfg, spec, meta["namespace"], plan, multi)
        deadline = spec.tuning.benchmark_timeout_seconds
        args = dict(name=name, image=image, tuning_ns=meta["namespace"], tuning_uid=meta.get("uid", ""),
                    trial_timeout=spec.tuning.trial_timeout_seconds, deadline=deadline)
        manifest = (bench.mpijob_manifest if multi else bench.job_manifest)(plan, spec, cfg, **args)
        try:
            await client.create(*api, manifest, ns)
        except ApiError as exc:
            if exc.status != 409:  # a concurrent pass (another tuning on this shape) started it
                raise
        raise NotYet("BenchmarkRunning", _running(plan, kind, ns, name), cfg.job_poll_seconds)
    state, why = _state(job, spec, cfg)
    if state == "running":
        raise NotYet("BenchmarkRunning", _running(plan, kind, ns, name), cfg.job_poll_seconds)
    text = await _launcher_log(client, ns, name, multi) or ""
    parsed = bench.parse_run(text, plan, f"{kind} {ns}/{name}")
    if state == "failed" and parsed.measured == 0:
        await client.delete(*api, name, ns)
        raise NotYet("BenchmarkFailed", f"{kind} {ns}/{name} failed ({why}); no point was measured; "
                     "it was deleted, the next pass starts a new run", cfg.retry_seconds * 12)
    outcome = {"succeeded": "succeeded", "timedOut": "timedOut"}.get(state, "failed")
    at = _finished_at(job)
    for unit in plan.units:
        cm = bench.profile_configmap(plan, unit, parsed, namespace=ns, job=f"{kind} {ns}/{name}", at=at,
                                     outcome=outcome)
        try:
            await client.create("v1", "configmaps", cm, ns)
        except ApiError as exc:
            if exc.status != 409:
                raise
    await client.delete(*api, name, ns)  # frees the GPUs now; a hung run is ended here


def _running(plan: bench.BenchPlan, kind: str, ns: str, name: str) -> str:
    return (f"benchmarking {len(plan.trials)} configuration(s) in {len(plan.launches)} launch(es) on "
            f"{', '.join(plan.nodes)} in {kind} {ns}/{name}")


async def _check_can_start(client: KubeClient, cfg: OperatorConfig, spec: CCLTuningSpec, tuning_ns: str,
                           plan: bench.BenchPlan, multi: bool) -> None:
    if multi:
        crd = await client.get("apiextensions.k8s.io/v1", "customresourcedefinitions", bench.MPI_CRD)
        served = any(v.get("name") == "v2beta1" and v.get("served", True)
                     for v in ((crd or {}).get("spec") or {}).get("versions") or [])
        if not served:
            raise NotYet("MPIJobUnavailable", f"MPIJob CRD {bench.MPI_GROUP_VERSION} not installed; "
                         f"{len(plan.nodes)} nodes need it (install the Kubeflow MPI Operator, or target one node "
                         "with spec.nodes)", cfg.retry_seconds * 12)
    sel = pod_selector(spec)
    if spec.tuning.benchmark_on_busy_nodes or selector_is_empty(sel):
        return
    busy = sorted({p["spec"].get("nodeName") for p in await client.list("v1", "pods", tuning_ns)
                   if matches(sel, (p["metadata"].get("labels") or {}))
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                   and (p.get("spec") or {}).get("nodeName") in plan.nodes})
    if busy:
        raise NotYet("BenchmarkNodesBusy", f"selected training pods run on {', '.join(busy)}; a benchmark needs "
                     "the GPUs to itself (spec.tuning.benchmarkOnBusyNodes: true runs it beside them)",
                     cfg.retry_seconds * 12)


def _state(job: dict[str, Any], spec: CCLTuningSpec, cfg: OperatorConfig) -> tuple[str, str]:
    """running / succeeded / timedOut / failed, from the conditions of a Job or an MPIJob (both
    end with a Complete|Succeeded or Failed condition), or our own clock past the deadline."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") in ("Complete", "Succeeded"):
            return "succeeded", ""
        if cond.get("type") == "Failed":
            reason = cond.get("reason") or "Failed"
            why = f"{reason}: {cond.get('message') or ''}".rstrip(": ")
            return ("timedOut" if "deadline" in reason.lower() else "failed"), why
    created = (job.get("metadata") or {}).get("creationTimestamp")
    if created:
        started = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
        limit = spec.tuning.benchmark_timeout_seconds + cfg.benchmark_grace_seconds
        if (datetime.now(UTC) - started).total_seconds() > limit:
            return "timedOut", f"still running {limit:.0f}s after it was created"
    return "running", ""


def _finished_at(job: dict[str, Any]) -> str:
    times = [c.get("lastTransitionTime") for c in (job.get("status") or {}).get("conditions") or []
             if c.get("lastTransitionTime")]
    return max(times) if times else _now()


async def _launcher_log(client: KubeClient, ns: str, name: str, multi: bool) -> str | None:
    """The log of the pod that ran the script (the MPIJob's launcher, or the Job's pod)."""
    want = ({bench.MPI_JOB_NAME_LABEL: name, bench.MPI_ROLE_LABEL: "launcher"} if multi
            else {"batch.kubernetes.io/job-name": name})
    selector = ",".join(f"{k}={v}" for k, v in want.items())
    pods = [p for p in await client.list("v1", "pods", ns, label_selector=selector)
            if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]
    pods.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
    for pod in reversed(pods):
        text = await client.pod_log(pod["metadata"]["name"], ns)
        if text:
            return text
    return None
