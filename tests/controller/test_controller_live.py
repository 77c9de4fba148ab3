"""profiler: live end to end on KMock: the operator benchmarks the target nodes (an MPIJob across
2 nodes, a Job with -g 8 on one, played by the harness with the stand-in nccl-tests of
tests/controller/standin, whose times come from ccltune's simulator), stores the measured profile
per node shape, tunes on it and says the numbers are measured. The configurations are measured in
trial mode: the harness copies the real libccltune-tuner.so into the rank pods the way their init
container does, and the stand-in drives it through NCCL's tuner ABI on every call. Without the
MPIJob CRD the operator names the missing piece; a hung run is deleted and its points are missing."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ctl_harness import Cluster
from ctl_world import GPU_NODES, Operator
from test_controller_e2e import GV, OPERATOR_NS, condition, wait_condition

from ccltune.api.nodetopology import NodeTopology
from ccltune.controller.benchmark import LABEL_SHAPE, MPI_GROUP_VERSION
from ccltune.controller.webhook import IMAGE_PLUGIN
from ccltune.topology.from_nodes import from_nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin"))
from tuner_plugin_abi import build

pytestmark = pytest.mark.slow
NS = "live"


def live_tuning(name: str, image: str = "registry.example/nccl-tests:2.30", nodes: dict[str, Any] | None = None,
                **tuning: Any) -> dict[str, Any]:
    return {"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": name, "namespace": NS}, "spec": {
        "selector": {"matchLabels": {"app": name}}, **({"nodes": nodes} if nodes else {}),
        "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "256K"}],
        "tuning": {"enabled": True, "profiler": "live", "budget": 8, "benchmarkImage": image,
                   "trialTimeoutSeconds": 60, **tuning}}}


@pytest.fixture(scope="module")
def standin(cluster: Cluster, agents: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in nccl-tests measure the cluster the agents reported (same ClusterTopology)."""
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in cluster.list("v1", "nodes")}
    reports = [NodeTopology.model_validate({"spec": r["spec"]}) for r in cluster.list(GV, "nodetopologies")
               if r["spec"]["nodeName"] in GPU_NODES]
    path = tmp_path_factory.mktemp("standin") / "cluster.yaml"
    path.write_text(yaml.safe_dump(from_nodes(reports, labels, name="standin").wire()))
    cluster.kubelet.standin_env["CCLTUNE_STANDIN_CLUSTER"] = str(path)
    so, shim = build(tmp_path_factory.mktemp("plugin"))
    cluster.kubelet.image_files[IMAGE_PLUGIN] = so  # what the ccltune image holds there
    cluster.kubelet.standin_env["CCLTUNE_STANDIN_LOGSHIM"] = str(shim)
    return path


def profiles(c: Cluster) -> list[dict[str, Any]]:
    return [cm for cm in c.list("v1", "configmaps", OPERATOR_NS)
            if LABEL_SHAPE in (cm["metadata"].get("labels") or {})]


def mpijobs(c: Cluster) -> list[dict[str, Any]]:
    return c.list(MPI_GROUP_VERSION, "mpijobs", OPERATOR_NS)


def test_without_mpijob_crd_names_the_missing_piece(cluster: Cluster, operator: Operator, standin: Path) -> None:
    cluster.create(live_tuning("nocrd"))
    cond = wait_condition(cluster, operator, NS, "nocrd", "Ready", "False", "MPIJobUnavailable")
    assert cond["message"].startswith("MPIJob CRD kubeflow.org/v2beta1 not installed; 2 nodes need it")
    assert condition(cluster, NS, "nocrd", "Tuned")["reason"] == "MPIJobUnavailable"  # type: ignore[index]
    assert cluster.kubelet.benchmarks == []
    cluster.delete(GV, "ccltunings", "nocrd", NS)


def test_live_tuning_measures_stores_and_reuses(cluster: Cluster, operator: Operator, standin: Path) -> None:
    cluster.install_mpijob_crd()
    cluster.create(live_tuning("measured"))
    wait_condition(cluster, operator, NS, "measured", "Ready", "True", timeout=240)
    assert len(cluster.kubelet.benchmarks) == 1
    run = cluster.kubelet.benchmarks[0].split("/")[1]
    status = cluster.get(GV, "ccltunings", "measured", NS)["status"]  # type: ignore[index]
    m = status["measurement"]
    assert m["source"] == "measured" and m["job"] == f"MPIJob {OPERATOR_NS}/{run}" and m["measuredAt"]
    assert m["missingPoints"] == 0
    assert {r["source"] for r in status["results"]} == {"measured"}
    assert "(measured)" in status["speedup"]
    tuned = condition(cluster, NS, "measured", "Tuned")
    assert tuned is not None and f"measured by MPIJob {OPERATOR_NS}/{run}" in tuned["message"]
    # The report published with the plan says so too.
    published = [v for cm in cluster.list("v1", "configmaps", NS) for v in (cm.get("data") or {}).values()]
    assert any(f"source measured: profiles {m['configMap']}, measured by MPIJob {OPERATOR_NS}/{run}" in v
               for v in published)

    (cm,) = profiles(cluster)
    assert cm["data"]["source"] == "measured"
    assert cm["metadata"]["annotations"]["ccltune.io/measured-by"] == f"MPIJob {OPERATOR_NS}/{run}"
    # NCCL's default in one launch, the 8 configurations in one more (trial mode, -N 8).
    assert cm["metadata"]["annotations"]["ccltune.io/launches"] == "2 launch(es) for 8 configuration(s) and NCCL's default"
    assert any("2 launch(es) for 8 configuration(s)" in v for v in published)
    rows = list(csv.DictReader(io.StringIO(cm["data"]["all_reduce_perf.csv"])))
    assert rows and all(float(r["latency_us"]) > 0 for r in rows)
    assert {r["ranks"] for r in rows} == {"16"} and {r["nodes"] for r in rows} == {"2"}
    assert "#  Rank" in cm["data"]["all_reduce_perf.log"]  # NCCL's own choice, as nccl-tests printed it
    assert mpijobs(cluster) == []  # the finished run was removed (its GPUs freed)

    # Same node shape: a later tuning reuses the stored profile, no new run.
    cluster.create(live_tuning("reuser"))
    wait_condition(cluster, operator, NS, "reuser", "Ready", "True", timeout=240)
    assert len(cluster.kubelet.benchmarks) == 1
    again = cluster.get(GV, "ccltunings", "reuser", NS)["status"]["measurement"]  # type: ignore[index]
    assert again["job"] == m["job"] and again["configMap"] == cm["metadata"]["name"]
    for name in ("measured", "reuser"):
        cluster.delete(GV, "ccltunings", name, NS)


def test_hung_benchmark_is_deleted_and_its_points_missing(cluster: Cluster, operator: Operator,
                                                          standin: Path, tmp_path: Path) -> None:
    for cm in profiles(cluster):  # measure again
        cluster.delete("v1", "configmaps", cm["metadata"]["name"], OPERATOR_NS)
    hung = tmp_path / "hung"
    cluster.kubelet.standin_env.update({"CCLTUNE_STANDIN_HANG_PROTO": "LL128", "CCLTUNE_STANDIN_HANG_MARK": str(hung)})
    try:
        cluster.create(live_tuning("hangs", image="registry.example/nccl-tests:hangs"))
        wait_condition(cluster, operator, NS, "hangs", "Ready", "False", "BenchmarkRunning")
        cluster.wait("the stand-in to hang", hung.exists, timeout=120)
        run = cluster.kubelet.benchmarks[-1].split("/")[1]
        cluster.kubelet.expire(OPERATOR_NS, run)
        wait_condition(cluster, operator, NS, "hangs", "Ready", "True", timeout=240)
    finally:
        for key in ("CCLTUNE_STANDIN_HANG_PROTO", "CCLTUNE_STANDIN_HANG_MARK"):
            cluster.kubelet.standin_env.pop(key, None)
    cluster.wait("the hung MPIJob deleted", lambda: mpijobs(cluster) == [], timeout=30)
    status = cluster.get(GV, "ccltunings", "hangs", NS)["status"]  # type: ignore[index]
    assert status["measurement"]["missingPoints"] > 0
    assert status["measurement"]["job"] == f"MPIJob {OPERATOR_NS}/{run}"
    tuned = condition(cluster, NS, "hangs", "Tuned")
    assert tuned is not None and "timed out or failed (missing, not zero)" in tuned["message"]
    (cm,) = profiles(cluster)
    assert cm["metadata"]["annotations"]["ccltune.io/benchmark-outcome"] == "timedOut"
    rows = list(csv.DictReader(io.StringIO(cm["data"]["all_reduce_perf.csv"])))
    missing = [r for r in rows if r["latency_us"] == "timeout"]
    assert missing and all(r["bandwidth_gbps"] == "" for r in missing)  # missing, never 0
    assert all(float(r["latency_us"]) > 0 for r in rows if r not in missing)
    hung_rows = [r for r in rows if r["protocol"] == "LL128"]
    # The hung launch printed its first size before hanging: that point is kept.
    assert any(r["latency_us"] != "timeout" for r in hung_rows) and any(r["latency_us"] == "timeout" for r in hung_rows)


def test_one_node_runs_a_job_with_all_gpus_end_to_end(cluster: Cluster, operator: Operator, standin: Path) -> None:
    for cm in profiles(cluster):  # another shape anyway; start from none
        cluster.delete("v1", "configmaps", cm["metadata"]["name"], OPERATOR_NS)
    started = len(cluster.kubelet.benchmarks)
    cluster.create(live_tuning("single", nodes={"names": ["gpu-1"]}))
    wait_condition(cluster, operator, NS, "single", "Ready", "True", timeout=240)
    (run,) = cluster.kubelet.benchmarks[started:]
    ns, name = run.split("/")
    status = cluster.get(GV, "ccltunings", "single", NS)["status"]  # type: ignore[index]
    assert status["measurement"]["job"] == f"Job {ns}/{name}" and status["measurement"]["missingPoints"] == 0
    assert {r["source"] for r in status["results"]} == {"measured"}
    (cm,) = profiles(cluster)
    rows = list(csv.DictReader(io.StringIO(cm["data"]["all_reduce_perf.csv"])))
    assert len(rows) == 8 * 3 and all(float(r["latency_us"]) > 0 for r in rows)
    assert {r["ranks"] for r in rows} == {"8"} and {r["nodes"] for r in rows} == {"1"}
    assert "ccltune.io/launches" in cm["metadata"]["annotations"]
    assert all(j["metadata"]["name"] != name for j in cluster.list("batch/v1", "jobs", OPERATOR_NS))  # GPUs freed
    assert mpijobs(cluster) == []
    cluster.delete(GV, "ccltunings", "single", NS)


def test_tp_and_dp_groups_are_measured_as_splits(cluster: Cluster, operator: Operator, standin: Path) -> None:
    for cm in profiles(cluster):  # a world-only profile of this shape would be reused as is
        cluster.delete("v1", "configmaps", cm["metadata"]["name"], OPERATOR_NS)
    body = live_tuning("groups", budget=3)
    body["spec"]["parallelism"] = {"tp": 8, "dp": 2}
    body["spec"]["collectives"] = [{"op": "allreduce", "minBytes": "64K", "maxBytes": "128K", "role": role}
                                   for role in ("tp", "dp")]
    cluster.create(body)
    wait_condition(cluster, operator, NS, "groups", "Ready", "True", timeout=240)
    status = cluster.get(GV, "ccltunings", "groups", NS)["status"]  # type: ignore[index]
    assert status["measurement"]["missingPoints"] == 0
    assert {r["source"] for r in status["results"]} == {"measured"}  # both groups, on their own numbers
    cms = profiles(cluster)  # one per communicator: each reused on its own by later tunings
    assert sorted(cm["metadata"]["labels"]["ccltune.io/communicator"] for cm in cms) == ["2r2n", "8r1n"]
    rows = [r for cm in cms for k, v in cm["data"].items() if k.endswith(".csv") for r in csv.DictReader(io.StringIO(v))]
    assert {(r["ranks"], r["nodes"]) for r in rows} == {("8", "1"), ("2", "2")}
    assert sum(k.endswith(".log") for cm in cms for k in cm["data"]) == 2  # NCCL's default of each group

    # A later tuning of the world communicator on the same shape measures that one only.
    started = len(cluster.kubelet.benchmarks)
    cluster.create(live_tuning("world-after-groups", budget=3))
    wait_condition(cluster, operator, NS, "world-after-groups", "Ready", "True", timeout=240)
    assert len(cluster.kubelet.benchmarks) == started + 1
    assert len(profiles(cluster)) == 3
    for name in ("groups", "world-after-groups"):
        cluster.delete(GV, "ccltunings", name, NS)
