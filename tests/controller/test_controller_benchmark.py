"""Benchmark runs without a cluster: trials and launches, the launch script run with the stand-in
nccl-tests (which drives the real tuner plugin in trial mode through NCCL's ABI), the manifests, and
the parser on a finished, a cut (hung) and a misaligned log."""

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
from ccltune.api.plan import TaskKey
from ccltune.controller import benchmark as bench
from ccltune.controller.config import OperatorConfig
from ccltune.controller.jobs import plan_with_profiles
from ccltune.controller.webhook import IMAGE_PLUGIN
from ccltune.publish.files import TUNER_PLUGIN_PATH
from ccltune.topology.presets import load_preset
from ccltune.tune.profilers.simulated import SimulatedProfiler
from ccltune.tune.space import DEFAULT_BUFFSIZE, DEFAULT_THREADS, LL128_THREADS, Config, Impl

STANDIN = Path(__file__).parent / "standin"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin"))
from tuner_plugin_abi import build  # noqa: E402


def spec(**tuning: Any) -> CCLTuningSpec:
    return CCLTuningSpec.model_validate({
        "selector": {"matchLabels": {"app": "train"}},
        "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "256K"}],
        "tuning": {"enabled": True, "profiler": "live", "budget": 6, **tuning}})


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(libccltune-tuner.so, the log shim the stand-in prints the plugin's NCCL log lines through)."""
    return build(tmp_path_factory.mktemp("plugin"))


def run_script(text: str, cluster_yaml: Path, plugin: tuple[Path, Path], **extra: str) -> str:
    env = {**os.environ, "PATH": f"{STANDIN}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "CCLTUNE_STANDIN_CLUSTER": str(cluster_yaml), bench.PLUGIN_ENV: str(plugin[0]),
           "CCLTUNE_STANDIN_LOGSHIM": str(plugin[1]), **extra}
    out = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True, timeout=600, check=True)
    return out.stdout


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory, plugin: tuple[Path, Path]) -> tuple[Any, Path, bench.BenchPlan, str]:
    cluster = load_preset("dgx-a100-1")
    path = tmp_path_factory.mktemp("bench") / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster.wire()))
    plan = bench.plan_trials(spec(), cluster)
    return cluster, path, plan, run_script(bench.script(plan, 60), path, plugin)


def expected_us(cluster: Any, plan: bench.BenchPlan, config: Any, size: int) -> float:
    """What the stand-in's simulator gives for this configuration: what a correct mapping reads."""
    key = TaskKey(collective=Collective.ALLREDUCE, min_bytes=size, max_bytes=size, ranks=plan.ranks,
                  nodes=len(plan.nodes))
    return SimulatedProfiler(cluster, noise=0.0).true_time_us(key, size, config)


def csv_rows(parsed: bench.Parsed) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(parsed.csv[(Collective.ALLREDUCE, None)])))


def test_one_node_measures_every_configuration_in_one_trial_mode_launch(one_node: Any) -> None:
    cluster, _path, plan, log = one_node
    assert len(plan.nodes) == 1 and plan.gpus_per_node == 8
    assert plan.trials[0].config is None and len(plan.trials) == 1 + 6  # NCCL's default + budget
    default, trials = plan.launches
    assert not default.trial_mode and default.trials == (plan.trials[0],)
    assert trials.trial_mode and trials.trials == tuple(plan.trials[1:])  # 6 configurations, one launch
    text = bench.script(plan, 60)
    assert "mpirun" not in text and text.count(" -g 8") == 2
    assert "-N 6 " in text and "-w 0 " in text and "timeout 360 " in text  # 60 s per configuration
    assert f"CCLTUNE_TRIALS={trials.trials_value()}" in text and 'NCCL_TUNER_PLUGIN="$CCLTUNE_PLUGIN"' in text
    assert trials.trials_value().startswith("warmup=0;period=126;")  # 3 sizes x 2 x (1 sync + 20 timed)
    assert "NCCL_ALGO" not in text  # the plugin chooses per call; nothing pins the launch

    parsed = bench.parse_run(log, plan, "job")
    assert parsed.missing == 0 and parsed.measured == 6 * 3 and not any(parsed.notes.values())  # 64K..256K
    by_config = {(r["algorithm"], r["protocol"], int(r["channels"]), int(r["size_bytes"])): float(r["latency_us"])
                 for r in csv_rows(parsed)}
    for t in plan.trials[1:]:  # cycle k is configuration k: the numbers are that configuration's own
        assert t.config is not None
        for size in t.sizes():
            got = by_config[(t.config.impl.algorithm, t.config.impl.protocol, t.config.channels, size)]
            assert got == pytest.approx(expected_us(cluster, plan, t.config, size), abs=0.006)
    cm = bench.profile_configmap(plan, (Collective.ALLREDUCE, None), parsed, namespace="ns", job="Job ns/b",
                                 at="2026-11-23T00:00:00Z", outcome="succeeded")
    assert cm["metadata"]["annotations"]["ccltune.io/launches"] == "2 launch(es) for 6 configuration(s) and NCCL's default"
    files = {k: v for k, v in cm["data"].items() if k.endswith((".csv", ".log"))}
    assert set(files) == {"all_reduce_perf.csv", "all_reduce_perf.log"}
    tuned = plan_with_profiles(spec(), cluster, "t", files)
    (task,) = tuned.tasks
    assert {e.source for e in task.chosen_estimates} == {Source.MEASURED}
    assert {e.source for e in task.default_estimates} == {Source.MEASURED}


def test_a_configuration_nccl_cannot_run_is_missing_at_its_sizes(one_node: Any, plugin: tuple[Path, Path]) -> None:
    _cluster, path, plan, _log = one_node
    log = run_script(bench.script(plan, 60), path, plugin, CCLTUNE_STANDIN_IGNORE_PROTO="LL128")
    assert "NCCL WARN ccltune trial 3 unusable at 65536 bytes" in log  # trial 3 is ring/LL128/2
    parsed = bench.parse_run(log, plan, "job")
    rows = csv_rows(parsed)
    assert {r["protocol"] for r in rows if r["latency_us"] == "timeout"} == {"LL128"}
    assert all(float(r["latency_us"]) > 0 for r in rows if r["protocol"] != "LL128")
    assert parsed.missing == 3 * sum(1 for t in plan.trials if t.config and t.config.impl.protocol == "LL128")


def test_a_launch_whose_plugin_never_loaded_measured_nothing(one_node: Any, plugin: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    _cluster, path, plan, _log = one_node
    missing_so = (tmp_path / "absent.so", plugin[1])  # NCCL then runs its own choice on every call
    parsed = bench.parse_run(run_script(bench.script(plan, 60), path, missing_so), plan, "job")
    assert parsed.measured == 0 and parsed.missing == 6 * 3
    assert parsed.notes[(Collective.ALLREDUCE, None)] == [
        "job launch-1: the tuner plugin never reported trial mode (not loaded?); its points are missing"]
    cm = bench.profile_configmap(plan, (Collective.ALLREDUCE, None), parsed, namespace="ns", job="Job ns/b",
                                 at="2026-11-23T00:00:00Z", outcome="succeeded")
    assert "never reported trial mode" in cm["metadata"]["annotations"]["ccltune.io/benchmark-notes"]


def test_rows_that_do_not_line_up_with_the_cycles_are_not_attributed(one_node: Any, plugin: tuple[Path, Path]) -> None:
    _cluster, path, plan, _log = one_node
    short = bench.script(plan, 60).replace("-N 6 ", "-N 5 ")  # a finished launch with a cycle fewer
    parsed = bench.parse_run(run_script(short, path, plugin), plan, "job")
    assert parsed.measured == 0 and parsed.missing == 6 * 3
    assert "15 row(s) do not line up with 6 cycle(s) x 3 size(s)" in parsed.notes[(Collective.ALLREDUCE, None)][0]


def test_job_manifest_is_a_valid_job_on_the_target_never_beside_training(one_node: Any) -> None:
    _cluster, _path, plan, _log = one_node
    cfg = OperatorConfig()
    job = bench.job_manifest(plan, spec(), cfg, name="ccltune-bench-x", image="img", tuning_ns="team",
                             tuning_uid="u", trial_timeout=60, deadline=900)
    kubernetes_validate.validate(copy.deepcopy(job), kubernetes_validate.latest_version(), strict=True)
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["activeDeadlineSeconds"] == 900
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    # The plugin: copied from the ccltune image into an emptyDir the benchmark mounts read-only.
    (init,) = pod["initContainers"]
    assert init["image"] == cfg.agent_image and init["command"] == ["cp", IMAGE_PLUGIN, TUNER_PLUGIN_PATH]
    assert pod["volumes"] == [{"name": "ccltune-plugin", "emptyDir": {}}]
    assert pod["containers"][0]["env"] == [{"name": bench.PLUGIN_ENV, "value": TUNER_PLUGIN_PATH}]
    assert pod["containers"][0]["volumeMounts"][0]["readOnly"] is True
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
    # The ranks run in the workers: they get the plugin; the launcher only names its path there.
    assert s["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["initContainers"][0]["name"] == "ccltune-plugin"
    assert worker["volumeMounts"] == [{"name": "ccltune-plugin", "mountPath": "/var/run/ccltune/plugin",
                                       "readOnly": True}]
    assert "initContainers" not in s["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert launcher["env"] == [{"name": bench.PLUGIN_ENV, "value": TUNER_PLUGIN_PATH}]
    assert " -x CCLTUNE_TRIALS " in launcher["command"][2] and " -x NCCL_TUNER_PLUGIN " in launcher["command"][2]


def test_cut_log_keeps_finished_rows_and_marks_the_rest_missing(one_node: Any) -> None:
    _cluster, _path, plan, log = one_node
    lines = log.splitlines()
    start = lines.index("launch-1:")
    rows = [i for i in range(start + 1, len(lines)) if lines[i].strip() and lines[i].split()[0].isdigit()]
    cut_at = rows[2 * 3]  # cycle 2's first row printed, then the launch hung mid-line
    cut = "\n".join(lines[: cut_at + 1]) + "\n" + lines[cut_at + 1][:20]
    parsed = bench.parse_run(cut, plan, "run")
    by_trial = [csv_rows(parsed)[i: i + 3] for i in range(0, 6 * 3, 3)]
    assert all(float(r["latency_us"]) > 0 for t in by_trial[:2] for r in t)  # cycles 0-1 finished
    assert [r["latency_us"] == "timeout" for r in by_trial[2]] == [False, True, True]  # cycle 2: one row
    assert all(r["latency_us"] == "timeout" and r["bandwidth_gbps"] == "" for t in by_trial[3:] for r in t)
    assert parsed.missing == 2 + 3 * 3 and parsed.measured == 3 * 2 + 1


def config(algorithm: str, protocol: str, channels: int = 8, buffsize: int = DEFAULT_BUFFSIZE,
        transport: str = "p2p") -> Config:
    threads = LL128_THREADS if protocol == "LL128" else DEFAULT_THREADS
    return Config(Impl(algorithm, protocol, transport), channels, threads, buffsize)


def test_launches_share_a_process_environment_only_where_it_cannot_change_a_measurement() -> None:
    def trials(*configs: Config, coll: Collective = Collective.ALLREDUCE) -> list[bench.Trial]:
        return [bench.Trial(0, coll, 1024, 4096, None)] + [bench.Trial(i + 1, coll, 1024, 4096, c)
                                                           for i, c in enumerate(configs)]

    # NCCL_BUFFSIZE reaches Simple only, NCCL_LL128_NTHREADS LL128 only: LL, LL128 and Simple share.
    same = bench.plan_launches(trials(config("ring", "LL"), config("tree", "LL128"), config("ring", "Simple", buffsize=8 << 20)))
    assert [(launch.trial_mode, launch.cycles) for launch in same] == [(False, 1), (True, 3)]
    assert dict(same[1].env)["NCCL_BUFFSIZE"] == str(8 << 20)
    # Two Simple buffer sizes, or two transports, cannot share a process.
    split = bench.plan_launches(trials(config("ring", "Simple"), config("tree", "Simple", buffsize=8 << 20),
                                       config("ring", "LL"), config("ring", "LL", transport="shm")))
    assert [[t.index for t in launch.trials] for launch in split] == [[0], [1, 3], [2], [4]]
    # What the trial table cannot express is pinned by NCCL's environment, one launch each.
    (_default, pinned) = bench.plan_launches(trials(config("p2p", "Simple"), coll=Collective.ALLTOALL))
    assert not pinned.trial_mode and dict(pinned.env)["NCCL_P2P_LEVEL"] == "SYS"
    # The plugin holds at most 256 entries (CCLT_MAX_TRIALS).
    many = bench.plan_launches(trials(*[config("ring", "LL", channels=1 + i % 64) for i in range(300)]))
    assert [launch.cycles for launch in many] == [1, 256, 44]


def test_same_shape_same_profile_name_whatever_the_node_names() -> None:
    a = load_preset("dgx-a100-2")
    renamed = a.model_copy(update={"name": "other", "nodes": [n.model_copy(update={"name": f"x{i}"})
                                                               for i, n in enumerate(a.nodes)]})
    assert bench.node_shape(a) == bench.node_shape(renamed)
    assert bench.node_shape(a) != bench.node_shape(load_preset("dgx-a100-1"))


@pytest.mark.parametrize(("ranks", "world", "split"), [
    ((0, 1, 2, 3, 4, 5, 6, 7), 16, ("NCCL_TESTS_SPLIT_MASK", "0x18")),  # tp 8: one group per node
    ((0, 8), 16, ("NCCL_TESTS_SPLIT_MASK", "0x17")),  # dp 2 across the nodes, stride tp
    ((0, 1, 2), 12, ("NCCL_TESTS_SPLIT", "DIV 3")),  # tp 3
    ((0, 3, 6, 9), 12, ("NCCL_TESTS_SPLIT", "MOD 3")),  # dp 4 over tp 3
    ((0, 3), 12, None),  # dp 2 over tp 3 with pp 2: no single AND/DIV/MOD makes these groups
])
def test_a_split_makes_exactly_the_groups_of_the_role(ranks: tuple[int, ...], world: int, split: Any) -> None:
    assert bench.split_for(ranks, world) == split


def test_sub_communicators_are_measured_as_splits_all_groups_at_once(tmp_path: Path, plugin: tuple[Path, Path]) -> None:
    cluster = load_preset("dgx-a100-2")
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster.wire()))
    roles = CCLTuningSpec.model_validate({
        "selector": {"matchLabels": {"app": "train"}}, "parallelism": {"tp": 8, "dp": 2},
        "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "128K", "role": role} for role in ("tp", "dp")],
        "tuning": {"enabled": True, "profiler": "live", "budget": 3}})
    plan = bench.plan_trials(roles, cluster)
    assert plan.notes == [n for n in plan.notes if "over spec.tuning.budget" in n]  # nothing left out
    groups = {launch.group for launch in plan.launches}
    assert {(g.ranks, g.nodes) for g in groups if g} == {(8, 1), (2, 2)} and None not in groups
    log = run_script(bench.script(plan, 60), path, plugin)
    parsed = bench.parse_run(log, plan, "run")
    assert parsed.missing == 0 and parsed.measured == 2 * 3 * 2  # 2 groups x 3 configurations x 2 sizes
    rows = [r for text in parsed.csv.values() for r in csv.DictReader(io.StringIO(text))]
    for r in rows:  # each group's numbers are that group's own (ranks, nodes) times
        config = next(t.config for t in plan.trials if t.config and t.group and t.group.ranks == int(r["ranks"])
                      and (t.config.impl.algorithm, t.config.impl.protocol, t.config.channels)
                      == (r["algorithm"], r["protocol"], int(r["channels"])))
        key = TaskKey(collective=Collective.ALLREDUCE, min_bytes=int(r["size_bytes"]), max_bytes=int(r["size_bytes"]),
                      ranks=int(r["ranks"]), nodes=int(r["nodes"]))
        want = SimulatedProfiler(cluster, noise=0.0).true_time_us(key, int(r["size_bytes"]), config)
        assert float(r["latency_us"]) == pytest.approx(want, abs=0.006)
    cms = [bench.profile_configmap(plan, unit, parsed, namespace="ns", job="MPIJob ns/b", at="2026-11-23T00:00:00Z",
                                   outcome="succeeded") for unit in plan.units]
    assert len({cm["metadata"]["name"] for cm in cms}) == 2  # one profile per communicator
    files = {k: v for cm in cms for k, v in cm["data"].items() if k.endswith((".csv", ".log"))}
    assert {k.split("-")[1] for k in files} == {"8r1n", "2r2n"} and len(files) == 4  # CSV + NCCL's log each
    tuned = plan_with_profiles(roles, cluster, "t", files)
    assert {(t.key.ranks, t.key.nodes) for t in tuned.tasks} == {(8, 1), (2, 2)}
    for task in tuned.tasks:  # both groups tuned on their own measurements, NCCL's default too
        assert {e.source for e in task.chosen_estimates} == {Source.MEASURED}
        assert {e.source for e in task.default_estimates} == {Source.MEASURED}
