"""Benchmark runs without a cluster: trials, the launch script run with the stand-in nccl-tests,
the manifests, and the parser on a finished and on a cut (hung) log."""

from __future__ import annotations

import copy
import csv
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.common import Collective, Source
from ccltune.controller import benchmark as bench
from ccltune.controller.config import OperatorConfig
from ccltune.controller.jobs import plan_with_profiles
from ccltune.topology.presets import load_preset

STANDIN = Path(__file__).parent / "standin"


def spec(**tuning: Any) -> CCLTuningSpec:
    return CCLTuningSpec.model_validate({
        "selector": {"matchLabels": {"app": "train"}},
        "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "256K"}],
        "tuning": {"enabled": True, "profiler": "live", "budget": 6, **tuning}})


def run_script(text: str, cluster_yaml: Path) -> str:
    env = {**os.environ, "PATH": f"{STANDIN}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "CCLTUNE_STANDIN_CLUSTER": str(cluster_yaml)}
    out = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True, timeout=600, check=True)
    return out.stdout


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, bench.BenchPlan, str]:
    cluster = load_preset("dgx-a100-1")
    path = tmp_path_factory.mktemp("bench") / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster.wire()))
    plan = bench.plan_trials(spec(), cluster)
    return cluster, path, plan, run_script(bench.script(plan, 60), path)


def test_one_node_runs_a_job_with_all_gpus_and_tunes_on_measured_numbers(one_node: Any) -> None:
    cluster, _path, plan, log = one_node
    assert len(plan.nodes) == 1 and plan.gpus_per_node == 8
    assert plan.trials[0].config is None and len(plan.trials) == 1 + 6  # NCCL's default + budget
    text = bench.script(plan, 60)
    assert "mpirun" not in text and text.count(" -g 8") == len(plan.trials)
    assert "NCCL_ALGO=" in text and "timeout 60 " in text

    parsed = bench.parse_run(log, plan, "job")
    assert parsed.missing == 0 and parsed.measured == 6 * 3  # 64K, 128K, 256K per configuration
    cm = bench.profile_configmap(plan, Collective.ALLREDUCE, parsed, namespace="ns", job="Job ns/b",
                                 at="2026-11-23T00:00:00Z", outcome="succeeded")
    files = {k: v for k, v in cm["data"].items() if k.endswith((".csv", ".log"))}
    assert set(files) == {"all_reduce_perf.csv", "all_reduce_perf.log"}
    tuned = plan_with_profiles(spec(), cluster, "t", files)
    (task,) = tuned.tasks
    assert {e.source for e in task.chosen_estimates} == {Source.MEASURED}
    assert {e.source for e in task.default_estimates} == {Source.MEASURED}


def test_job_manifest_is_a_valid_job_on_the_target_never_beside_training(one_node: Any) -> None:
    _cluster, _path, plan, _log = one_node
    cfg = OperatorConfig()
    job = bench.job_manifest(plan, spec(), cfg, name="ccltune-bench-x", image="img", tuning_ns="team",
                             tuning_uid="u", trial_timeout=60, deadline=900)
    kubernetes_validate.validate(copy.deepcopy(job), kubernetes_validate.latest_version(), strict=True)
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["activeDeadlineSeconds"] == 900
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    terms = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"labelSelector": {"matchLabels": {"app": "train"}}, "namespaces": ["team"],
            "topologyKey": "kubernetes.io/hostname"} in terms
    node_terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert node_terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == plan.nodes
    shared = bench.job_manifest(plan, spec(benchmarkOnBusyNodes=True), cfg, name="b", image="img",
                                tuning_ns="team", tuning_uid="u", trial_timeout=60, deadline=900)
    assert len(shared["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]) == 1  # only one benchmark pod per node


def test_mpijob_manifest_follows_v2beta1() -> None:
    cluster = load_preset("dgx-a100-2")
    plan = bench.plan_trials(spec(), cluster)
    job = bench.mpijob_manifest(plan, spec(), OperatorConfig(), name="b", image="img", tuning_ns="team",
                                tuning_uid="u", trial_timeout=60, deadline=900)
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    s = job["spec"]
    assert s["slotsPerWorker"] == 8 and s["runPolicy"]["activeDeadlineSeconds"] == 900
    assert s["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1 and s["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    launcher = s["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert "resources" not in launcher and "mpirun --allow-run-as-root -np 16" in launcher["command"][2]
    worker = s["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_cut_log_keeps_finished_rows_and_marks_the_rest_missing(one_node: Any) -> None:
    _cluster, _path, plan, log = one_node
    lines = log.splitlines()
    start = lines.index("trial-3:")
    first_row = next(i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i].startswith("#"))
    cut = "\n".join(lines[: first_row + 1]) + "\n" + lines[first_row + 1][:20]  # hung mid-line
    parsed = bench.parse_run(cut, plan, "run")
    rows = list(csv.DictReader(io.StringIO(parsed.csv[Collective.ALLREDUCE])))
    by_trial = [rows[i: i + 3] for i in range(0, len(rows), 3)]
    assert all(float(r["latency_us"]) > 0 for t in by_trial[:2] for r in t)  # trials 1-2 finished
    assert [r["latency_us"] == "timeout" for r in by_trial[2]] == [False, True, True]  # trial 3: one row
    assert all(r["latency_us"] == "timeout" and r["bandwidth_gbps"] == "" for t in by_trial[3:] for r in t)
    assert parsed.missing == 2 + 3 * 3 and parsed.measured == 3 * 2 + 1


def test_same_shape_same_profile_name_whatever_the_node_names() -> None:
    a = load_preset("dgx-a100-2")
    renamed = a.model_copy(update={"name": "other", "nodes": [n.model_copy(update={"name": f"x{i}"})
                                                               for i, n in enumerate(a.nodes)]})
    assert bench.node_shape(a) == bench.node_shape(renamed)
    assert bench.node_shape(a) != bench.node_shape(load_preset("dgx-a100-1"))
