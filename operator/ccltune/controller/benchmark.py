"""Benchmark runs for `profiler: live`: which configurations, the launch script, the manifests,
and the parser that turns the run's log into a measured profile (pure functions; benchmarkrun.py
drives them against the API).

One run holds every trial: the launcher executes nccl-tests once per configuration, each launch
pinned by NCCL's environment (NCCL_ALGO/PROTO/MIN_NCHANNELS/MAX_NCHANNELS, tune/profilers/nccltests
.trial_env) and bounded by `timeout`. A section line `trial-<i>:` precedes each launch's output and
`# ccltune-trial <i> exit <code>` follows it, so the log says which rows belong to which
configuration and which launches did not finish. A trial that times out or fails keeps its
points missing (`timeout` in the profile CSV), never zero. Sizes a launch printed before it hung
are kept: each row is a finished measurement.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from ..api.ccltuning import CCLTuningSpec
from ..api.cluster import ClusterTopology
from ..api.common import API_GROUP, Collective
from ..api.errors import InputError
from ..pipeline import task_keys
from ..publish.configmaps import MAX_LABEL_VALUE, MAX_NAME, fit
from ..publish.runtime import nccl_version
from ..tune.fabric import facts_for
from ..tune.profilers.nccltests import BINARIES, parse_log, trial_env
from ..tune.profilers.replay import SWEEP_COLUMNS
from ..tune.space import (
    DEFAULT_BUFFSIZE,
    DEFAULT_THREADS,
    LL128_THREADS,
    NCCL_ALGO_NAME,
    Config,
    build_space,
    parse_version,
)
from .config import OperatorConfig
from .selectors import pod_selector, selector_is_empty

MPI_GROUP_VERSION = "kubeflow.org/v2beta1"
MPI_CRD = "mpijobs.kubeflow.org"
LABEL_SHAPE = f"{API_GROUP}/node-shape"
LABEL_BENCH = f"{API_GROUP}/benchmark"
LABEL_SOURCE = f"{API_GROUP}/source"
ANN_JOB = f"{API_GROUP}/measured-by"
ANN_AT = f"{API_GROUP}/measured-at"
ANN_MISSING = f"{API_GROUP}/missing-points"
ANN_OUTCOME = f"{API_GROUP}/benchmark-outcome"
# kubeflow/mpi-operator v2beta1 labels its pods with these (pkg/apis/kubeflow/v2beta1 constants).
MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MPI_ROLE_LABEL = "training.kubeflow.org/job-role"
CHANNEL_STEPS = (2, 8, 32)  # few, far apart: the replay profiler interpolates nothing across configs
ITERS, WARMUP = 20, 5
_TRIAL = re.compile(r"^trial-(\d+):\s*$")
_EXIT = re.compile(r"^#\s*ccltune-trial\s+(\d+)\s+exit\s+(-?\d+)\s*$")


@dataclass(frozen=True)
class Trial:
    index: int
    collective: Collective
    min_bytes: int
    max_bytes: int
    config: Config | None  # None: NCCL's own choice (no overrides)

    def sizes(self) -> list[int]:
        out, size = [], self.min_bytes
        while size <= self.max_bytes:
            out.append(size)
            size *= 2
        return out


@dataclass
class BenchPlan:
    shape: str  # digest of what the numbers depend on: GPU model, nodes, GPUs per node, fabric
    nodes: list[str]
    gpus_per_node: int
    trials: list[Trial]
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    @property
    def collectives(self) -> list[Collective]:
        return sorted({t.collective for t in self.trials})


def node_shape(cluster: ClusterTopology) -> str:
    """Clusters of the same shape measure alike: the ClusterTopology without names (node names,
    the tuning's name), so another CCLTuning on equal nodes finds the same profile."""
    wire = cluster.wire()
    order = {n.name: f"node{i}" for i, n in enumerate(cluster.nodes)}
    wire.pop("name", None)
    wire.pop("description", None)
    text = json.dumps(wire, sort_keys=True)
    for real, anon in order.items():
        text = text.replace(json.dumps(real), json.dumps(anon))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile_name(shape: str, collective: Collective) -> str:
    return fit(f"ccltune-profile-{shape}-{collective}", MAX_NAME)


def run_name(shape: str, trials: list[Trial], image: str) -> str:
    text = shape + image + "|".join(f"{t.collective}{t.min_bytes}{t.max_bytes}{t.config}" for t in trials)
    return f"ccltune-bench-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def plan_trials(spec: CCLTuningSpec, cluster: ClusterTopology, wanted: set[Collective] | None = None) -> BenchPlan:
    """NCCL's default and a grid of (algorithm, protocol, channels) per collective the spec
    tunes on the whole target (world communicator), at most `budget` launches per collective."""
    world, nodes = cluster.world_size, cluster.node_count
    ranges: dict[Collective, tuple[int, int]] = {}
    notes = []
    for key, _comm in task_keys(spec, cluster):
        coll = Collective(key.collective)
        if key.ranks != world or (wanted is not None and coll not in wanted):
            if key.ranks != world:
                notes.append(f"{key.label()}: a {key.ranks}-rank communicator is not benchmarked "
                             "(runs cover all target GPUs); NCCL's default is kept")
            continue
        lo, hi = ranges.get(coll, (key.min_bytes, key.max_bytes))
        ranges[coll] = (min(lo, key.min_bytes), max(hi, key.max_bytes))
    facts = facts_for(cluster, world, nodes)
    version = parse_version(nccl_version(spec.publish))
    trials: list[Trial] = []
    for coll, (lo, hi) in sorted(ranges.items()):
        trials.append(Trial(len(trials), coll, lo, hi, None))
        configs = []
        for sub in build_space(coll, facts, version).subspaces:
            impl = sub.impl
            if impl.transport != "p2p" or impl.algorithm not in NCCL_ALGO_NAME:
                continue
            threads = LL128_THREADS if impl.protocol == "LL128" else DEFAULT_THREADS
            for channels in sorted({c for c in CHANNEL_STEPS if c in sub.values[0]} or {sub.values[0][0]}):
                configs.append(Config(impl, channels, threads, DEFAULT_BUFFSIZE))
        kept = configs[: max(1, spec.tuning.budget)]
        if len(kept) < len(configs):
            notes.append(f"{coll}: {len(configs) - len(kept)} configuration(s) over spec.tuning.budget not run")
        trials += [Trial(len(trials) + i, coll, lo, hi, c) for i, c in enumerate(kept)]
    gpus = cluster.world_size // max(1, nodes)
    node_names = sorted(n.name for n in cluster.nodes)
    return BenchPlan(node_shape(cluster), node_names, gpus, trials, notes)


def script(plan: BenchPlan, trial_timeout: int) -> str:
    """The launcher's shell script: one nccl-tests launch per trial, mpirun across nodes."""
    multi = len(plan.nodes) > 1
    lines = ["set -u", f"echo '# ccltune benchmark: {len(plan.trials)} trial(s) on {plan.ranks} GPU(s)'"]
    for t in plan.trials:
        env = {} if t.config is None else trial_env(t.config)
        binary = BINARIES[t.collective]
        args = ["-b", str(t.min_bytes), "-e", str(t.max_bytes), "-f", "2", "-n", str(ITERS),
                "-w", str(WARMUP), "-c", "0", "-d", "float"]
        if t.collective in (Collective.ALLREDUCE, Collective.REDUCESCATTER):
            args += ["-o", "sum"]
        if multi:  # OpenMPI: -x NAME=VALUE exports to every rank
            exports = [a for k, v in sorted(env.items()) for a in ("-x", f"{k}={v}")]
            argv = ["mpirun", "--allow-run-as-root", "-np", str(plan.ranks), "--bind-to", "none",
                    *exports, binary, *args, "-g", "1"]
        else:
            argv = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), binary, *args,
                    "-g", str(plan.gpus_per_node)]
        lines += [f"echo 'trial-{t.index}:'",
                  f"timeout {trial_timeout} {shlex.join(argv)}",
                  f"echo \"# ccltune-trial {t.index} exit $?\""]
    return "\n".join(lines) + "\n"


def _labels(plan: BenchPlan, name: str, tuning_uid: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "ccltune-operator", "app.kubernetes.io/component": "benchmark",
            LABEL_BENCH: name, LABEL_SHAPE: plan.shape, f"{API_GROUP}/tuning-uid": tuning_uid}


def placement(plan: BenchPlan, spec: CCLTuningSpec, tuning_ns: str, bench_name: str) -> dict[str, Any]:
    """On the target nodes, one pod per node, never beside the selected training pods (unless
    spec.tuning.benchmarkOnBusyNodes)."""
    hostname = "kubernetes.io/hostname"
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": hostname, "operator": "In", "values": plan.nodes}]}]}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {LABEL_BENCH: bench_name}}, "topologyKey": hostname}]},
    }
    sel = pod_selector(spec)
    selector = {k: v for k, v in sel.wire().items() if v}  # empty lists are noise in the manifest
    if not spec.tuning.benchmark_on_busy_nodes and not selector_is_empty(sel):
        affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].append(
            {"labelSelector": selector, "namespaces": [tuning_ns], "topologyKey": hostname})
    return affinity


def _container(name: str, image: str, cfg: OperatorConfig, command: list[str], gpus: int) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": image, "imagePullPolicy": cfg.image_pull_policy,
                           "command": command}
    if gpus:
        out["resources"] = {"limits": {cfg.benchmark_gpu_resource: str(gpus)}}
    return out


def mpijob_manifest(plan: BenchPlan, spec: CCLTuningSpec, cfg: OperatorConfig, *, name: str, image: str,
                    tuning_ns: str, tuning_uid: str, trial_timeout: int, deadline: int) -> dict[str, Any]:
    """kubeflow.org/v2beta1 MPIJob (kubeflow/mpi-operator pkg/apis/kubeflow/v2beta1/types.go):
    workers hold the GPUs and run sshd; the launcher runs the script with mpirun."""
    labels = _labels(plan, name, tuning_uid)
    worker = _container("worker", image, cfg, ["/usr/sbin/sshd", "-De"], plan.gpus_per_node)
    launcher = _container("launcher", image, cfg, ["bash", "-c", script(plan, trial_timeout)], 0)
    pod_meta = {"labels": labels}
    return {
        "apiVersion": MPI_GROUP_VERSION, "kind": "MPIJob",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels},
        "spec": {
            "slotsPerWorker": plan.gpus_per_node,
            "mpiImplementation": "OpenMPI",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0,
                          "activeDeadlineSeconds": deadline, "ttlSecondsAfterFinished": cfg.job_ttl_seconds},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": {
                    "metadata": pod_meta, "spec": {"containers": [launcher],
                                                   "tolerations": cfg.agent_tolerations}}},
                "Worker": {"replicas": len(plan.nodes), "restartPolicy": "Never", "template": {
                    "metadata": pod_meta, "spec": {
                        "containers": [worker], "tolerations": cfg.agent_tolerations,
                        "affinity": placement(plan, spec, tuning_ns, name)}}},
            },
        },
    }


def job_manifest(plan: BenchPlan, spec: CCLTuningSpec, cfg: OperatorConfig, *, name: str, image: str,
                 tuning_ns: str, tuning_uid: str, trial_timeout: int, deadline: int) -> dict[str, Any]:
    """One node: a plain batch/v1 Job running nccl-tests with -g <GPUs per node>."""
    labels = _labels(plan, name, tuning_uid)
    container = _container("bench", image, cfg, ["bash", "-c", script(plan, trial_timeout)], plan.gpus_per_node)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels},
        "spec": {"backoffLimit": 0, "activeDeadlineSeconds": deadline,
                 "ttlSecondsAfterFinished": cfg.job_ttl_seconds,
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "restartPolicy": "Never", "containers": [container],
                     "tolerations": cfg.agent_tolerations,
                     "affinity": placement(plan, spec, tuning_ns, name)}}},
    }


@dataclass
class Parsed:
    csv: dict[Collective, str]  # sweep CSV per collective (tune/profilers/replay.py schema)
    default_logs: dict[Collective, str]  # NCCL's own choice, as nccl-tests printed it
    measured: int = 0
    missing: int = 0


def _chunks(text: str) -> tuple[dict[int, list[str]], dict[int, int]]:
    chunks: dict[int, list[str]] = {}
    exits: dict[int, int] = {}
    current: list[str] | None = None
    for raw in text.splitlines():
        line = re.sub(r"^\[\d+,\d+\]<std(?:out|err)>:", "", raw.strip()).strip()
        if m := _TRIAL.match(line):
            current = chunks.setdefault(int(m.group(1)), [])
            continue
        if m := _EXIT.match(line):
            exits[int(m.group(1))] = int(m.group(2))
            current = None
            continue
        if current is not None:
            current.append(raw)
    return chunks, exits


def _rows(lines: list[str], where: str, finished: bool) -> dict[int, float]:
    """size -> out-of-place time of the rows a launch printed; a cut last line is dropped."""
    text = "\n".join(lines)
    try:
        log = parse_log(text, where)
    except InputError:
        if finished or not lines:
            if not lines or "no nccl-tests result rows" in text:
                return {}
            raise
        return _rows(lines[:-1], where, finished)
    return {r.size: r.time_us for rows in log.sections.values() for r in rows}


def parse_run(text: str, plan: BenchPlan, where: str) -> Parsed:
    """The run's log -> measured profile files; unfinished points are written as `timeout`."""
    chunks, exits = _chunks(text)
    out = Parsed({}, {})
    writers: dict[Collective, tuple[io.StringIO, Any]] = {}
    for t in plan.trials:
        lines = chunks.get(t.index, [])
        finished = exits.get(t.index) == 0
        try:
            rows = _rows(lines, f"{where} trial-{t.index}", finished)
        except InputError:
            rows = {}  # an unreadable launch is a failed trial: its points are missing
        if t.config is None:
            if rows:
                out.default_logs[t.collective] = "\n".join(lines) + "\n"
            continue
        if t.collective not in writers:
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(SWEEP_COLUMNS)
            writers[t.collective] = (buf, w)
        _buf, w = writers[t.collective]
        impl, cfgc = t.config.impl, t.config
        for size in t.sizes():
            time_us = rows.get(size)
            if time_us is None:
                out.missing += 1
            else:
                out.measured += 1
            bw = "" if time_us is None else f"{size / time_us / 1e3:.4f}"
            w.writerow([t.collective, size, impl.algorithm, impl.protocol,
                        cfgc.channels, len(plan.nodes), plan.ranks, "time",
                        bw, "timeout" if time_us is None else f"{time_us:.3f}"])
    out.csv = {c: buf.getvalue() for c, (buf, _w) in writers.items()}
    return out


def profile_configmap(plan: BenchPlan, collective: Collective, parsed: Parsed, *, namespace: str,
                      job: str, at: str, outcome: str) -> dict[str, Any]:
    """The measured profile of one collective on this node shape, reused by later tunings."""
    binary = BINARIES[collective]
    data = {}
    if collective in parsed.csv:
        data[f"{binary}.csv"] = parsed.csv[collective]
    if collective in parsed.default_logs:
        data[f"{binary}.log"] = parsed.default_logs[collective]
    data["source"] = "measured"
    missing = sum(1 for line in parsed.csv.get(collective, "").splitlines() if line.endswith(",timeout"))
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": profile_name(plan.shape, collective), "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "ccltune-operator",
                                LABEL_SHAPE: plan.shape, LABEL_SOURCE: "measured",
                                f"{API_GROUP}/collective": str(collective)},
                     "annotations": {ANN_JOB: fit(job, MAX_LABEL_VALUE * 4), ANN_AT: at,
                                     ANN_MISSING: str(missing), ANN_OUTCOME: outcome}},
        "data": data,
    }


__all__ = ["MPI_CRD", "MPI_GROUP_VERSION", "BenchPlan", "Parsed", "Trial", "job_manifest", "mpijob_manifest",
           "node_shape", "parse_run", "plan_trials", "profile_configmap", "profile_name", "run_name", "script"]
