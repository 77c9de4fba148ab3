"""Benchmark runs for `profiler: live`: which configurations, the launch script, the manifests,
and the parser that turns the run's log into a measured profile (pure functions; benchmarkrun.py
drives them against the API).

One run holds every trial. NCCL's own choice is one launch without the plugin. The configurations
go through ccltune's tuner plugin in trial mode (nccl-plugin/trial.c): one nccl-tests launch with
`-N K` measures K configurations, the plugin switching configuration per run cycle along
nccl-tests' call sequence (CCLTUNE_TRIALS). Configurations whose process-wide environment
(threads, buffer size, transport) conflicts go to separate launches; ones the trial table cannot
express (collectives NCCL's tuner never sees) are pinned by NCCL's environment, one per launch
(tune/profilers/nccltests.trial_env). Every launch is bounded by `timeout`; a section line
`launch-<i>:` precedes its output and `# ccltune-launch <i> exit <code>` follows it. A point that
timed out, failed, or ran on a configuration NCCL could not run (the plugin's WARN line) is missing
(`timeout` in the profile CSV), never zero. Rows a launch printed before it hung are kept: each is
a finished measurement. Sub-communicators (tp/dp/pp groups) are launches that split the ranks
(NCCL_TESTS_SPLIT), every group at once; each (collective, communicator) is one stored profile.
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
from ..publish.files import TUNER_PLUGIN_DIR, TUNER_PLUGIN_PATH
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
from ..tune.table import ALGORITHMS, COLLECTIVES, PROTOCOLS
from .config import OperatorConfig
from .selectors import pod_selector, selector_is_empty
from .webhook import IMAGE_PLUGIN, PLUGIN_VOLUME

MPI_GROUP_VERSION = "kubeflow.org/v2beta1"
MPI_CRD = "mpijobs.kubeflow.org"
LABEL_SHAPE = f"{API_GROUP}/node-shape"
LABEL_BENCH = f"{API_GROUP}/benchmark"
LABEL_SOURCE = f"{API_GROUP}/source"
ANN_JOB = f"{API_GROUP}/measured-by"
ANN_AT = f"{API_GROUP}/measured-at"
ANN_MISSING = f"{API_GROUP}/missing-points"
ANN_OUTCOME = f"{API_GROUP}/benchmark-outcome"
ANN_LAUNCHES = f"{API_GROUP}/launches"
ANN_NOTES = f"{API_GROUP}/benchmark-notes"  # why points are missing, beyond timeouts
# kubeflow/mpi-operator v2beta1 labels its pods with these (pkg/apis/kubeflow/v2beta1 constants).
MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MPI_ROLE_LABEL = "training.kubeflow.org/job-role"
CHANNEL_STEPS = (2, 8, 32)  # few, far apart: the replay profiler interpolates nothing across configs
ITERS, WARMUP = 20, 5
# Trial-mode launches run no warm-up calls: nccl-tests changed how many it makes (d2d40cc: w at the
# largest and w at the smallest size; since f2015cb, 2025-08: w at every size), and without them
# the plugin's call count lines up on every release that has -N (v2.13.10+). Each cycle's untimed
# sync call (BenchTime's first call) absorbs the configuration's first-use cost.
TRIAL_WARMUP = 0
MAX_CYCLES = 256  # CCLT_MAX_TRIALS, nccl-plugin/trial.h
PLUGIN_ENV = "CCLTUNE_PLUGIN"  # the plugin's path in the pods that run the ranks
PLUGIN_INIT = "ccltune-plugin"
PLUGIN_UID = 65532  # the ccltune image's USER
_LAUNCH = re.compile(r"^launch-(\d+):\s*$")
_EXIT = re.compile(r"^#\s*ccltune-launch\s+(\d+)\s+exit\s+(-?\d+)\s*$")
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_LOADED = re.compile(r"\bNCCL INFO ccltune tuner: trial mode, (\d+) entries\b")
_UNUSABLE = re.compile(r"\bNCCL WARN ccltune trial (\d+) unusable at (\d+) bytes\b")
# What the plugin decides per call; the rest of trial_env is process-wide.
_PER_CALL = frozenset({"NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"})
# Process-wide knobs that reach only some protocols, so configurations of other protocols may share
# a launch with them: NCCL src/graph/tuning.cc ncclTopoTuneModel (NCCL_NTHREADS: Simple and LL;
# NCCL_LL128_NTHREADS: LL128), src/init.cc computeBuffSizes (NCCL_BUFFSIZE: Simple).
_PROTOCOL_KNOBS = {"NCCL_NTHREADS": ("Simple", "LL"), "NCCL_LL128_NTHREADS": ("LL128",),
                   "NCCL_BUFFSIZE": ("Simple",)}


@dataclass(frozen=True)
class Group:
    """A sub-communicator measured with all its groups at once: nccl-tests splits the world
    (NCCL_TESTS_SPLIT_MASK / NCCL_TESTS_SPLIT: color = rank op value, src/common.cu) and every
    group runs the collective concurrently, as a job's tp/dp/pp groups do."""

    ranks: int
    nodes: int
    split: tuple[str, str]  # (env var, value)

    def label(self) -> str:
        return f"{self.ranks}r{self.nodes}n"

    def ident(self) -> str:
        """Unique among a plan's groups (two splits may give groups of one shape)."""
        return f"{self.label()}-{hashlib.sha256('='.join(self.split).encode()).hexdigest()[:6]}"


Unit = tuple[Collective, Group | None]  # what one profile ConfigMap holds: a collective on a communicator


def _unit_order(unit: Unit) -> tuple[str, bool, str]:
    return (str(unit[0]), unit[1] is not None, unit[1].ident() if unit[1] else "")


@dataclass(frozen=True)
class Trial:
    index: int
    collective: Collective
    min_bytes: int
    max_bytes: int
    config: Config | None  # None: NCCL's own choice (no overrides)
    group: Group | None = None  # None: the world communicator

    def sizes(self) -> list[int]:
        out, size = [], self.min_bytes
        while size <= self.max_bytes:
            out.append(size)
            size *= 2
        return out


@dataclass(frozen=True)
class Launch:
    """One nccl-tests process. Trial mode: cycle k of `-N len(trials)` measures trials[k], chosen
    per call by the plugin; otherwise one trial, NCCL's own choice or pinned by `env`."""

    index: int
    trials: tuple[Trial, ...]
    env: tuple[tuple[str, str], ...]  # process-wide NCCL environment, sorted
    trial_mode: bool

    @property
    def collective(self) -> Collective:
        return self.trials[0].collective

    @property
    def cycles(self) -> int:
        return len(self.trials)

    @property
    def group(self) -> Group | None:
        return self.trials[0].group

    def sizes(self) -> list[int]:
        return self.trials[0].sizes()

    def calls_per_cycle(self) -> int:
        """nccl-tests' NCCL calls per run cycle (src/common.cu TimeTest/BenchTime with -c 0 -m 1):
        per size, out-of-place then in-place, each one sync call and ITERS timed calls."""
        return len(self.sizes()) * 2 * (1 + ITERS)

    def trials_value(self) -> str:
        """CCLTUNE_TRIALS for this launch (format: nccl-plugin/trial.h)."""
        entries = ",".join(trial_entry(t.config) or "" for t in self.trials if t.config is not None)
        return f"warmup={TRIAL_WARMUP};period={self.calls_per_cycle()};{entries}"


@dataclass
class BenchPlan:
    shape: str  # digest of what the numbers depend on: GPU model, nodes, GPUs per node, fabric
    nodes: list[str]
    gpus_per_node: int
    trials: list[Trial]
    notes: list[str] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    @property
    def collectives(self) -> list[Collective]:
        return sorted({t.collective for t in self.trials})

    @property
    def units(self) -> list[Unit]:
        return sorted({(t.collective, t.group) for t in self.trials}, key=_unit_order)

    @property
    def uses_plugin(self) -> bool:
        return any(launch.trial_mode for launch in self.launches)


def trial_entry(config: Config) -> str | None:
    """The plugin's `algo/proto/channels` for a configuration, or None when it cannot express it."""
    impl = config.impl
    proto = impl.protocol.lower()
    if impl.algorithm not in ALGORITHMS or proto not in PROTOCOLS or not 1 <= config.channels <= 64:
        return None
    return f"{impl.algorithm}/{proto}/{config.channels}"


def _process_env(config: Config) -> dict[str, str]:
    return {k: v for k, v in trial_env(config).items() if k not in _PER_CALL}


def _reaches(knob: str, protocol: str) -> bool:
    return protocol in _PROTOCOL_KNOBS.get(knob, (protocol,))


def _compatible(a: Config, b: Config) -> bool:
    """a and b measure as in their own launches when they share one process environment."""
    ea, eb = _process_env(a), _process_env(b)
    pa, pb = a.impl.protocol, b.impl.protocol
    return all(ea.get(k) == eb.get(k) for k in ea.keys() | eb.keys() if _reaches(k, pa) and _reaches(k, pb))


def plan_launches(trials: list[Trial]) -> list[Launch]:
    """NCCL's own choice and env-pinned configurations one per launch; the others in trial-mode
    launches of compatible process environments (first fit, at most MAX_CYCLES each)."""
    single: list[tuple[tuple[Trial, ...], dict[str, str], bool]] = []
    groups: dict[tuple[Collective, int, int, Group | None], list[list[Trial]]] = {}
    for t in trials:
        if t.config is None:
            single.append(((t,), {}, False))
        elif str(t.collective) not in COLLECTIVES or trial_entry(t.config) is None:
            single.append(((t,), trial_env(t.config), False))
        else:
            bins = groups.setdefault((t.collective, t.min_bytes, t.max_bytes, t.group), [])
            fit_in = next((b for b in bins if len(b) < MAX_CYCLES
                           and all(_compatible(t.config, m.config) for m in b if m.config)), None)
            if fit_in is None:
                bins.append([t])
            else:
                fit_in.append(t)
    grouped = [(tuple(b), {k: v for m in b if m.config for k, v in _process_env(m.config).items()}, True)
               for bins in groups.values() for b in bins]
    return [Launch(i, ts, tuple(sorted(env.items())), mode) for i, (ts, env, mode) in enumerate(single + grouped)]


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


def profile_name(shape: str, collective: Collective, group: Group | None = None) -> str:
    """One profile per node shape, collective and communicator (world, or a split's groups)."""
    return fit(f"ccltune-profile-{shape}-{collective}" + (f"-{group.ident()}" if group else ""), MAX_NAME)


def run_name(shape: str, trials: list[Trial], image: str) -> str:
    text = shape + image + "|".join(f"{t.collective}{t.min_bytes}{t.max_bytes}{t.config}" for t in trials)
    return f"ccltune-bench-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def split_for(ranks: tuple[int, ...], world: int) -> tuple[str, str] | None:
    """The nccl-tests split whose group of rank 0 is `ranks` (Megatron's first group of a role:
    consecutive or strided) and whose groups are all that size, or None. A mask (AND, nccl-tests
    v2.13.4+) where sizes are powers of two, else DIV / MOD (NCCL_TESTS_SPLIT, v2.18.5+)."""
    size, stride = len(ranks), ranks[1] - ranks[0]
    candidates: list[tuple[tuple[str, str], Any]] = []
    if size & (size - 1) == 0 and stride & (stride - 1) == 0:
        mask = ((1 << world.bit_length()) - 1) & ~((size - 1) * stride)
        candidates.append((("NCCL_TESTS_SPLIT_MASK", f"0x{mask:x}"), lambda r: r & mask))
    candidates += [(("NCCL_TESTS_SPLIT", f"DIV {size}"), lambda r: r // size),
                   (("NCCL_TESTS_SPLIT", f"MOD {stride}"), lambda r: r % stride)]
    for split, color in candidates:
        groups: dict[int, list[int]] = {}
        for r in range(world):
            groups.setdefault(color(r), []).append(r)
        if tuple(groups[color(0)]) == ranks and all(len(g) == size for g in groups.values()):
            return split
    return None


def plan_trials(spec: CCLTuningSpec, cluster: ClusterTopology, wanted: set[Unit] | None = None) -> BenchPlan:
    """NCCL's default and a grid of (algorithm, protocol, channels) per collective and
    communicator the spec tunes, at most `budget` configurations each. Sub-communicators (tp, dp,
    pp groups) run as nccl-tests splits of the target, all groups at once."""
    world, nodes = cluster.world_size, cluster.node_count
    ranges: dict[tuple[Collective, Group | None], tuple[int, int]] = {}
    notes = []
    for key, comm in task_keys(spec, cluster):
        coll = Collective(key.collective)
        group = None
        if key.ranks != world:
            split = split_for(comm.ranks, world)
            if split is None:
                notes.append(f"{key.label()}: its {key.ranks}-rank groups are not a split nccl-tests can make "
                             "(NCCL_TESTS_SPLIT: one AND/DIV/MOD of the rank); not benchmarked, NCCL's default is kept")
                continue
            group = Group(key.ranks, key.nodes, split)
        if wanted is not None and (coll, group) not in wanted:
            continue
        lo, hi = ranges.get((coll, group), (key.min_bytes, key.max_bytes))
        ranges[(coll, group)] = (min(lo, key.min_bytes), max(hi, key.max_bytes))
    version = parse_version(nccl_version(spec.publish))
    trials: list[Trial] = []
    for (coll, group), (lo, hi) in sorted(ranges.items(), key=lambda kv: _unit_order(kv[0])):
        facts = facts_for(cluster, group.ranks, group.nodes) if group else facts_for(cluster, world, nodes)
        trials.append(Trial(len(trials), coll, lo, hi, None, group))
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
            where = f" ({group.label()} groups)" if group else ""
            notes.append(f"{coll}{where}: {len(configs) - len(kept)} configuration(s) over spec.tuning.budget not run")
        trials += [Trial(len(trials) + i, coll, lo, hi, c, group) for i, c in enumerate(kept)]
    gpus = cluster.world_size // max(1, nodes)
    node_names = sorted(n.name for n in cluster.nodes)
    return BenchPlan(node_shape(cluster), node_names, gpus, trials, notes, plan_launches(trials))


def _launch_argv(launch: Launch) -> tuple[dict[str, str], list[str]]:
    env = dict(launch.env)
    args = ["-b", str(launch.trials[0].min_bytes), "-e", str(launch.trials[0].max_bytes), "-f", "2",
            "-n", str(ITERS), "-c", "0", "-d", "float"]
    if launch.collective in (Collective.ALLREDUCE, Collective.REDUCESCATTER):
        args += ["-o", "sum"]
    if launch.group is not None:
        env[launch.group.split[0]] = launch.group.split[1]
    if launch.trial_mode:
        # INFO for the plugin's "trial mode" line (proof it was loaded), TUNING only: its lines.
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "TUNING", "CCLTUNE_TRIALS": launch.trials_value(),
                    "NCCL_MIN_NCHANNELS": str(max(t.config.channels for t in launch.trials if t.config))})
        args += ["-w", str(TRIAL_WARMUP), "-N", str(launch.cycles)]
    else:
        args += ["-w", str(WARMUP)]
    return env, [BINARIES[launch.collective], *args]


def script(plan: BenchPlan, trial_timeout: int) -> str:
    """The launcher's shell script: the launches in turn, mpirun across nodes; a launch may run
    trial_timeout seconds per configuration it measures."""
    multi = len(plan.nodes) > 1
    plugin = f'NCCL_TUNER_PLUGIN="${PLUGIN_ENV}"'  # expanded by the shell: the path in the rank pods
    lines = ["set -u", f"echo '# ccltune benchmark: {len(plan.trials)} trial(s) in {len(plan.launches)} "
             f"launch(es) on {plan.ranks} GPU(s)'"]
    for launch in plan.launches:
        env, argv = _launch_argv(launch)
        pairs = shlex.join(f"{k}={v}" for k, v in sorted(env.items())) + (f" {plugin}" if launch.trial_mode else "")
        prefix = f"env {pairs.strip()} " if pairs.strip() else ""  # NCCL's own choice: nothing set
        # One process per GPU under mpirun across nodes, and for splits (nccl-tests splits MPI ranks).
        if multi or launch.group is not None:  # OpenMPI's `-x NAME` forwards the launcher's value
            names = sorted(env) + (["NCCL_TUNER_PLUGIN"] if launch.trial_mode else [])
            exports = "".join(f" -x {n}" for n in names)
            command = (f"{prefix}mpirun --allow-run-as-root -np {plan.ranks} --bind-to none{exports} "
                       f"{shlex.join([*argv, '-g', '1'])}")
        else:
            command = f"{prefix}{shlex.join([*argv, '-g', str(plan.gpus_per_node)])}"
        lines += [f"echo 'launch-{launch.index}:'",
                  f"timeout {trial_timeout * launch.cycles} {command}",
                  f"echo \"# ccltune-launch {launch.index} exit $?\""]
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


def _with_plugin(pod: dict[str, Any], cfg: OperatorConfig, container: dict[str, Any]) -> None:
    """The plugin for the ranks of this pod: the ccltune image's build copied into an emptyDir by
    an init container (as the webhook does for training pods); the container mounts it read-only."""
    pod["initContainers"] = [{
        "name": PLUGIN_INIT, "image": cfg.unpack_image or cfg.agent_image,
        "imagePullPolicy": cfg.image_pull_policy, "command": ["cp", IMAGE_PLUGIN, TUNER_PLUGIN_PATH],
        "securityContext": {"runAsUser": PLUGIN_UID, "runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": PLUGIN_VOLUME, "mountPath": TUNER_PLUGIN_DIR}]}]
    pod["volumes"] = [{"name": PLUGIN_VOLUME, "emptyDir": {}}]
    container["volumeMounts"] = [{"name": PLUGIN_VOLUME, "mountPath": TUNER_PLUGIN_DIR, "readOnly": True}]


def _plugin_env(container: dict[str, Any]) -> None:
    container["env"] = [{"name": PLUGIN_ENV, "value": TUNER_PLUGIN_PATH}]


def mpijob_manifest(plan: BenchPlan, spec: CCLTuningSpec, cfg: OperatorConfig, *, name: str, image: str,
                    tuning_ns: str, tuning_uid: str, trial_timeout: int, deadline: int) -> dict[str, Any]:
    """kubeflow.org/v2beta1 MPIJob (kubeflow/mpi-operator pkg/apis/kubeflow/v2beta1/types.go):
    workers hold the GPUs, run sshd and the ranks (so they get the plugin); the launcher runs the
    script with mpirun."""
    labels = _labels(plan, name, tuning_uid)
    worker = _container("worker", image, cfg, ["/usr/sbin/sshd", "-De"], plan.gpus_per_node)
    launcher = _container("launcher", image, cfg, ["bash", "-c", script(plan, trial_timeout)], 0)
    pod_meta = {"labels": labels}
    launcher_pod: dict[str, Any] = {"containers": [launcher], "tolerations": cfg.agent_tolerations}
    worker_pod: dict[str, Any] = {"containers": [worker], "tolerations": cfg.agent_tolerations,
                                  "affinity": placement(plan, spec, tuning_ns, name)}
    if plan.uses_plugin:
        _plugin_env(launcher)
        _with_plugin(worker_pod, cfg, worker)
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
                    "metadata": pod_meta, "spec": launcher_pod}},
                "Worker": {"replicas": len(plan.nodes), "restartPolicy": "Never", "template": {
                    "metadata": pod_meta, "spec": worker_pod}},
            },
        },
    }


def job_manifest(plan: BenchPlan, spec: CCLTuningSpec, cfg: OperatorConfig, *, name: str, image: str,
                 tuning_ns: str, tuning_uid: str, trial_timeout: int, deadline: int) -> dict[str, Any]:
    """One node: a plain batch/v1 Job running nccl-tests with -g <GPUs per node>."""
    labels = _labels(plan, name, tuning_uid)
    container = _container("bench", image, cfg, ["bash", "-c", script(plan, trial_timeout)], plan.gpus_per_node)
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container],
                           "tolerations": cfg.agent_tolerations,
                           "affinity": placement(plan, spec, tuning_ns, name)}
    if plan.uses_plugin:
        _plugin_env(container)
        _with_plugin(pod, cfg, container)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels},
        "spec": {"backoffLimit": 0, "activeDeadlineSeconds": deadline,
                 "ttlSecondsAfterFinished": cfg.job_ttl_seconds,
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


@dataclass
class Parsed:
    csv: dict[Unit, str]  # sweep CSV per collective and communicator (tune/profilers/replay.py schema)
    default_logs: dict[Unit, str]  # NCCL's own choice, as nccl-tests printed it
    measured: int = 0
    missing: int = 0
    notes: dict[Unit, list[str]] = field(default_factory=dict)  # why points are missing, beyond timeouts


def _clean(raw: str) -> str:
    return _MPI_TAG.sub("", raw.strip(), count=1).strip()


def _chunks(text: str) -> tuple[dict[int, list[str]], dict[int, int]]:
    chunks: dict[int, list[str]] = {}
    exits: dict[int, int] = {}
    current: list[str] | None = None
    for raw in text.splitlines():
        line = _clean(raw)
        if m := _LAUNCH.match(line):
            current = chunks.setdefault(int(m.group(1)), [])
            continue
        if m := _EXIT.match(line):
            exits[int(m.group(1))] = int(m.group(2))
            current = None
            continue
        if current is not None:
            current.append(raw)
    return chunks, exits


def _rows(lines: list[str], where: str, finished: bool) -> list[tuple[int, float]]:
    """(size, out-of-place time) of the rows a launch printed, in order; a cut last line is dropped."""
    text = "\n".join(lines)
    try:
        log = parse_log(text, where)
    except InputError:
        if finished or not lines:
            if not lines or "no nccl-tests result rows" in text:
                return []
            raise
        return _rows(lines[:-1], where, finished)
    return [(r.size, r.time_us) for rows in log.sections.values() for r in rows]


def _cycle_points(launch: Launch, lines: list[str], finished: bool, where: str,
                  notes: list[str]) -> dict[tuple[int, int], float]:
    """(cycle, size) -> time. Row j of a trial-mode launch is cycle j // sizes; a launch whose rows
    do not follow that order, which finished with a row count other than cycles x sizes, or whose
    plugin never said it was loaded, measured nothing we can attribute: all its points are missing."""
    try:
        rows = _rows(lines, where, finished)
    except InputError as exc:
        notes.append(f"{where}: unreadable, its points are missing ({exc})")
        return {}
    sizes = launch.sizes()
    if not launch.trial_mode:
        return {(0, size): t for size, t in rows}
    cleaned = [_clean(line) for line in lines]
    if rows and not any(_LOADED.search(line) for line in cleaned):
        notes.append(f"{where}: the tuner plugin never reported trial mode (not loaded?); its points are missing")
        return {}
    if any(size != sizes[j % len(sizes)] for j, (size, _t) in enumerate(rows)) or len(rows) > launch.cycles * len(sizes) \
            or (finished and len(rows) != launch.cycles * len(sizes)):
        notes.append(f"{where}: {len(rows)} row(s) do not line up with {launch.cycles} cycle(s) x {len(sizes)} "
                     "size(s); its points are missing")
        return {}
    unusable = {(int(m.group(1)), int(m.group(2))) for line in cleaned if (m := _UNUSABLE.search(line))}
    return {(j // len(sizes), size): t for j, (size, t) in enumerate(rows) if (j // len(sizes), size) not in unusable}


def parse_run(text: str, plan: BenchPlan, where: str) -> Parsed:
    """The run's log -> measured profile files; unfinished points are written as `timeout`."""
    chunks, exits = _chunks(text)
    out = Parsed({}, {})
    writers: dict[Unit, tuple[io.StringIO, Any]] = {}
    for launch in plan.launches:
        lines = chunks.get(launch.index, [])
        points = _cycle_points(launch, lines, exits.get(launch.index) == 0, f"{where} launch-{launch.index}",
                               out.notes.setdefault((launch.collective, launch.group), []))
        for cycle, t in enumerate(launch.trials):
            if t.config is None:
                if points:
                    out.default_logs[(t.collective, t.group)] = "\n".join(lines) + "\n"
                continue
            unit = (t.collective, t.group)
            if unit not in writers:
                buf = io.StringIO()
                w = csv.writer(buf, lineterminator="\n")
                w.writerow(SWEEP_COLUMNS)
                writers[unit] = (buf, w)
            _buf, w = writers[unit]
            impl, cfgc = t.config.impl, t.config
            for size in t.sizes():
                time_us = points.get((cycle, size))
                if time_us is None:
                    out.missing += 1
                else:
                    out.measured += 1
                bw = "" if time_us is None else f"{size / time_us / 1e3:.4f}"
                nodes, ranks = (t.group.nodes, t.group.ranks) if t.group else (len(plan.nodes), plan.ranks)
                w.writerow([t.collective, size, impl.algorithm, impl.protocol, cfgc.channels, nodes, ranks, "time",
                            bw, "timeout" if time_us is None else f"{time_us:.3f}"])
    out.csv = {c: buf.getvalue() for c, (buf, _w) in writers.items()}
    return out


def profile_configmap(plan: BenchPlan, unit: Unit, parsed: Parsed, *, namespace: str,
                      job: str, at: str, outcome: str) -> dict[str, Any]:
    """The measured profile of one collective on one communicator of this node shape, reused by
    later tunings. Group files carry the group in their name, so the profiles of one shape can be
    read together (replay reads a log's shape from its "# Rank ... Group" lines)."""
    collective, group = unit
    stem = BINARIES[collective] + (f"-{group.ident()}" if group else "")
    data = {}
    if unit in parsed.csv:
        data[f"{stem}.csv"] = parsed.csv[unit]
    if unit in parsed.default_logs:
        data[f"{stem}.log"] = parsed.default_logs[unit]
    data["source"] = "measured"
    missing = sum(1 for line in parsed.csv.get(unit, "").splitlines() if line.endswith(",timeout"))
    launches = [launch for launch in plan.launches if (launch.collective, launch.group) == unit]
    configs = sum(1 for t in plan.trials if (t.collective, t.group) == unit and t.config is not None)
    labels = {"app.kubernetes.io/managed-by": "ccltune-operator", LABEL_SHAPE: plan.shape,
              LABEL_SOURCE: "measured", f"{API_GROUP}/collective": str(collective),
              f"{API_GROUP}/communicator": group.label() if group else "world"}
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": profile_name(plan.shape, collective, group), "namespace": namespace,
                     "labels": labels,
                     "annotations": {ANN_JOB: fit(job, MAX_LABEL_VALUE * 4), ANN_AT: at,
                                     ANN_MISSING: str(missing), ANN_OUTCOME: outcome,
                                     ANN_LAUNCHES: f"{len(launches)} launch(es) for {configs} configuration(s) "
                                                   "and NCCL's default",
                                     **({ANN_NOTES: "; ".join(parsed.notes[unit])[:4096]}
                                        if parsed.notes.get(unit) else {})}},
        "data": data,
    }


__all__ = ["MPI_CRD", "MPI_GROUP_VERSION", "BenchPlan", "Group", "Launch", "Parsed", "Trial", "Unit", "job_manifest",
           "mpijob_manifest", "node_shape", "parse_run", "plan_launches", "plan_trials", "profile_configmap",
           "profile_name", "run_name", "script", "split_for", "trial_entry"]
