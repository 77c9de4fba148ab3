"""End to end on KMock: a real `kopf run` of the operator, agent processes, the harness as cluster."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from ctl_harness import REPO, Cluster
from ctl_world import GPU_NODES, LEAF, Operator, node, start_agent

from ccltune.api.nodetopology import NodeTopology
from ccltune.controller import daemonset
from ccltune.controller.jobs import LABEL_TUNING_UID
from ccltune.topology.from_nodes import from_nodes

pytestmark = pytest.mark.slow
GV = "ccltune.io/v1alpha1"
OPERATOR_NS = "ccltune-system"
EXAMPLE = REPO / "examples" / "ccltuning.yaml"
SERVER_FIELDS = ("uid", "creationTimestamp", "generation", "resourceVersion", "ownerReferences")


def tuning(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    body = {"selector": {"matchLabels": {"app": name}},
            "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "128K"}], **spec}
    return {"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": name, "namespace": ns}, "spec": body}


def condition(c: Cluster, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
    obj = c.get(GV, "ccltunings", name, ns)
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return dict(cond)
    return None


def wait_condition(c: Cluster, op: Operator, ns: str, name: str, ctype: str, status: str,
                   reason: str | None = None, timeout: float = 90) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = condition(c, ns, name, ctype)
        if cond and cond["status"] == status and (reason is None or cond["reason"] == reason):
            return cond
        return None
    try:
        return c.wait(f"{ns}/{name} {ctype}={status} {reason or ''}", check, timeout=timeout)  # type: ignore[no-any-return]
    except AssertionError:
        print(json.dumps((c.get(GV, "ccltunings", name, ns) or {}).get("status"), indent=1))
        print(op.logs())
        raise


def start_offline_plan(c: Cluster, doc: dict[str, Any], tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Run `ccltune plan` for the same spec on the cluster the agents reported (in the background:
    the pipeline is CPU-bound and the operator plans at the same time)."""
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in c.list("v1", "nodes")}
    targets = (doc["spec"].get("nodes") or {}).get("names") or [
        n for n, lab in labels.items() if lab.get("nvidia.com/gpu.present") == "true"]
    reports = [NodeTopology.model_validate({"spec": r["spec"]}) for r in c.list(GV, "nodetopologies")
               if r["spec"]["nodeName"] in targets]
    assert len(reports) == len(targets)
    cluster = from_nodes(reports, labels, name=doc["metadata"]["name"])
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(cluster.wire(), sort_keys=False))
    (tmp / "tuning.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp / "plan"
    proc = subprocess.Popen([sys.executable, "-m", "ccltune", "plan", str(tmp / "tuning.yaml"), "--cluster",
                             str(tmp / "cluster.yaml"), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, out


def offline_manifests(started: tuple[subprocess.Popen[bytes], Path]) -> list[dict[str, Any]]:
    proc, out = started
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output.decode(errors="replace")[-2000:]
    return list(yaml.safe_load_all((out / "manifests" / "configmaps.yaml").read_text()))


def published(c: Cluster, ns: str, expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    got = []
    for m in expected:
        live = c.get("v1", "configmaps", m["metadata"]["name"], ns)
        assert live is not None, f"ConfigMap {ns}/{m['metadata']['name']} was not published"
        live = copy.deepcopy(live)
        for key in SERVER_FIELDS:
            live["metadata"].pop(key, None)
        # The operator's only addition: which plan inputs produced this generation.
        annotations = live["metadata"].get("annotations") or {}
        if annotations.pop("ccltune.io/plan-input", None) is not None and not annotations:
            live["metadata"].pop("annotations")
        got.append(live)
    return got


def test_example_reaches_ready_and_matches_offline(cluster: Cluster, operator: Operator, tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    # MSCCL files are published only for a runtime that runs them (docs/runtimes.md).
    doc["spec"]["publish"] = {"inject": True, "runtime": "msccl"}
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    cluster.create(doc)
    offline = start_offline_plan(cluster, doc, tmp_path)
    wait_condition(cluster, operator, ns, name, "Ready", "True", timeout=180)
    obj = cluster.get(GV, "ccltunings", name, ns)
    assert obj is not None
    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["topology"]["gpus"] == 8 * len(GPU_NODES)  # every GPU node, not cpu-0
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["TopologyReady"]["status"] == "True"
    assert conds["Published"]["status"] == "True"
    # The example asks for synthesis and tuning; 16 GPUs with 600 trials plan in a Job.
    assert conds["Synthesized"]["reason"] == "Done" and conds["Tuned"]["reason"] == "Done"
    assert "(" in status["speedup"] and status["results"][0]["source"]

    expected = offline_manifests(offline)
    assert published(cluster, ns, expected) == expected
    assert [m["name"] for m in status["configMaps"]] == [m["metadata"]["name"] for m in expected]
    owner = cluster.get("v1", "configmaps", expected[-1]["metadata"]["name"], ns)["metadata"]["ownerReferences"]  # type: ignore[index]
    assert owner[0]["uid"] == obj["metadata"]["uid"]

    reasons = {e.get("reason") for e in cluster.list("v1", "events", ns)}
    assert {"NodeReportsComplete", "ConfigMapsPublished", "PlanPublished"} <= reasons

    # The synthesized MSCCL files (MBs) were published packed: a training pod gets them
    # through the unpack init container.
    time.sleep(1)  # let the webhook's index see the status
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "train-0", "namespace": ns, "labels": dict(doc["spec"]["selector"]["matchLabels"])},
           "spec": {"containers": [{"name": "train", "image": "pytorch"}]}}
    import jsonpatch

    mutated = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(admit(operator, pod, ns)["patch"])))
    assert [c["name"] for c in mutated["spec"]["initContainers"]] == ["ccltune-unpack"]
    env = {e["name"]: e["value"] for e in mutated["spec"]["containers"][0]["env"]}
    assert env["MSCCL_ALGO_DIR"] == "/etc/ccltune/msccl"

    ds = cluster.get("apps/v1", "daemonsets", daemonset.NAME, OPERATOR_NS)
    assert ds is not None
    clean = copy.deepcopy(ds)
    for key in SERVER_FIELDS:
        clean["metadata"].pop(key, None)
    kubernetes_validate.validate(clean, kubernetes_validate.latest_version(), strict=True)


def _review(pod: dict[str, Any], ns: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"].get("name"), "namespace": ns, "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
        "object": pod, "oldObject": None, "dryRun": False, "options": {}}}


def admit(op: Operator, pod: dict[str, Any], ns: str) -> dict[str, Any]:
    resp = httpx.post(op.webhook_url, json=_review(pod, ns), timeout=10)
    resp.raise_for_status()
    body: dict[str, Any] = resp.json()["response"]
    assert body["allowed"] is True
    return body


def test_webhook_admission(cluster: Cluster, operator: Operator) -> None:
    ns = "web"
    # always: the agents' file (real bus ids) is published although NCCL would detect the same.
    cluster.create(tuning("trainer", ns, publish={"topologyFile": "always"}))
    cluster.create(tuning("later", ns, nodes={"names": ["gpu-0", "gpu-404"]}))
    wait_condition(cluster, operator, ns, "trainer", "Ready", "True")
    wait_condition(cluster, operator, ns, "later", "TopologyReady", "False")
    time.sleep(1)  # let the webhook's index see the status
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w-0", "namespace": ns, "labels": {"app": "trainer"}},
           "spec": {"containers": [{"name": "train", "image": "pytorch",
                                    "env": [{"name": "NCCL_CONF_FILE", "value": "/mine.conf"}]}]}}
    answer = admit(operator, pod, ns)
    assert answer.get("patchType") == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    import jsonpatch

    mutated = jsonpatch.apply_patch(pod, ops)
    status = cluster.get(GV, "ccltunings", "trainer", ns)["status"]  # type: ignore[index]
    assert mutated["metadata"]["annotations"]["ccltune.io/plan-digest"] == status["planDigest"].removeprefix("sha256:")
    env = {e["name"]: e["value"] for e in mutated["spec"]["containers"][0]["env"]}
    assert env["NCCL_CONF_FILE"] == "/mine.conf"  # user env wins
    assert env["NCCL_TOPO_FILE"] == "/etc/ccltune/nccl-topo.xml"
    sources = mutated["spec"]["volumes"][0]["projected"]["sources"]
    assert [s["configMap"]["name"] for s in sources] == [m["name"] for m in status["configMaps"][:-1]]
    again = admit(operator, mutated, ns)  # idempotent
    assert "patch" not in again or json.loads(base64.b64decode(again["patch"])) == []

    other = copy.deepcopy(pod)
    other["metadata"]["labels"] = {"app": "unrelated"}
    assert "patch" not in admit(operator, other, ns)

    waiting = copy.deepcopy(pod)
    waiting["metadata"] = {"name": "l-0", "namespace": ns, "labels": {"app": "later"}}
    assert "patch" not in admit(operator, waiting, ns)
    cluster.wait("PodNotInjected event", lambda: any(
        e.get("reason") == "PodNotInjected" and e["involvedObject"]["name"] == "later"
        for e in cluster.list("v1", "events", ns)), timeout=15)


def test_missing_node_report(cluster: Cluster, operator: Operator) -> None:
    ns = "missing"
    cluster.create(tuning("partial", ns, nodes={"names": ["gpu-1", "gpu-7"]}))
    cond = wait_condition(cluster, operator, ns, "partial", "TopologyReady", "False", "NodeReportsMissing")
    assert "gpu-7" in cond["message"] and "gpu-1" not in cond["message"]
    assert condition(cluster, ns, "partial", "Ready")["status"] == "False"  # type: ignore[index]
    # The node's agent comes up late: its first report restarts the plan (no retry loop meanwhile).
    cluster.create(node("gpu-7", 8, **{"nvidia.com/gpu.present": "true", LEAF: "t0"}))
    late = start_agent(cluster, "gpu-7")
    try:
        wait_condition(cluster, operator, ns, "partial", "Ready", "True")
    finally:
        late.stop()
    assert cluster.get(GV, "ccltunings", "partial", ns)["status"]["topology"]["nodes"] == 2  # type: ignore[index]


def test_invalid_spec_stops_without_retrying(cluster: Cluster, operator: Operator) -> None:
    ns = "invalid"
    bad = tuning("bad", ns)
    bad["spec"]["collectives"][0].update(minBytes="2G", maxBytes="1K")  # no CRD rule relates the two
    cluster.create(bad)
    cond = wait_condition(cluster, operator, ns, "bad", "Ready", "False", "InvalidSpec")
    assert cond["message"].startswith("spec.collectives[0]")
    count = lambda: sum(1 for r in cluster.api_log() if r["namespace"] == ns and r["method"] == "PATCH")  # noqa: E731
    cluster.wait("kopf's bookkeeping after the status", lambda: count() >= 2)  # status, then kopf's annotations
    before = count()
    time.sleep(2.5)
    assert count() == before  # no retry loop


def test_plan_job_survives_restart_and_failure(cluster: Cluster, operator: Operator, tmp_path: Path) -> None:
    ns = "jobs"
    doc = tuning("big", ns, tuning={"enabled": True, "budget": 100})
    cluster.kubelet.hold = True  # Jobs stay pending: the plan is "in the middle"
    cluster.create(doc)
    offline = start_offline_plan(cluster, doc, tmp_path)
    uid = cluster.get(GV, "ccltunings", "big", ns)["metadata"]["uid"]  # type: ignore[index]

    def ours() -> list[dict[str, Any]]:
        return [j for j in cluster.list("batch/v1", "jobs", OPERATOR_NS)
                if j["metadata"]["labels"].get(LABEL_TUNING_UID) == uid]
    cluster.wait("the plan Job", ours, timeout=60)
    wait_condition(cluster, operator, ns, "big", "Ready", "False", "PlanJobRunning")
    job_name = ours()[0]["metadata"]["name"]
    mark = len(cluster.api_log())
    operator.kill_and_restart()
    time.sleep(4)  # the new operator resumes the CCLTuning while the Job is still pending
    assert [j["metadata"]["name"] for j in ours()] == [job_name]
    # Tunings that were Ready before the restart are recognised as up to date, not re-published.
    assert not [r for r in cluster.api_log()[mark:] if r["identity"] == "operator" and r["resource"] == "configmaps"
                and r["verb"] in ("create", "patch") and r["namespace"] == "default"]
    cluster.kubelet.hold = False
    wait_condition(cluster, operator, ns, "big", "Ready", "True", timeout=120)
    assert [j["metadata"]["name"] for j in ours()] == [job_name]
    assert [p for p in cluster.kubelet.started if p.endswith(job_name)] == [f"{OPERATOR_NS}/{job_name}"]
    expected = offline_manifests(offline)
    assert published(cluster, ns, expected) == expected
    tuned = condition(cluster, ns, "big", "Tuned")
    assert tuned is not None and tuned["reason"] in ("Done", "NotAvailable", "DefaultKept"), tuned

    cluster.kubelet.fail_with = ("DeadlineExceeded", "Job was active longer than specified deadline")
    try:
        cluster.create(tuning("doomed", ns, tuning={"enabled": True, "budget": 99}))
        cond = wait_condition(cluster, operator, ns, "doomed", "Ready", "False", "PlanJobFailed")
    finally:
        cluster.kubelet.fail_with = None
    assert "DeadlineExceeded" in cond["message"]
    assert condition(cluster, ns, "doomed", "Tuned")["reason"] == "PlanJobFailed"  # type: ignore[index]


def test_rediscovery_asks_the_agents(cluster: Cluster, operator: Operator) -> None:
    ns = "fresh"
    cluster.create(tuning("fresh", ns, rediscover=True, nodes={"names": list(GPU_NODES)}))
    wait_condition(cluster, operator, ns, "fresh", "Ready", "True", timeout=90)
    for name in GPU_NODES:
        ann = cluster.get(GV, "nodetopologies", name)["metadata"].get("annotations") or {}  # type: ignore[index]
        assert ann.get("ccltune.io/reprobe-request")
        assert ann.get("ccltune.io/reprobe-served") == ann["ccltune.io/reprobe-request"]


def test_report_change_replans(cluster: Cluster, operator: Operator) -> None:
    ns = "replan"
    cluster.create(tuning("watcher", ns, nodes={"names": ["gpu-0"]}))
    wait_condition(cluster, operator, ns, "watcher", "Ready", "True")
    report = cluster.get(GV, "nodetopologies", "gpu-0")
    assert report is not None
    # Plays a re-probe that found different hardware facts (a new content hash).
    cluster.patch(GV, "nodetopologies", "gpu-0", {"spec": {"contentHash": "sha256:changed",
                                                            "notes": [*report["spec"].get("notes", []), "changed"]}})
    cluster.wait("re-plan request", lambda: (cluster.get(GV, "ccltunings", "watcher", ns)["metadata"]  # type: ignore[index]
                                             .get("annotations") or {}).get("ccltune.io/replan") == "gpu-0@sha256:changed")
    wait_condition(cluster, operator, ns, "watcher", "Ready", "True")


def test_daemonset_follows_targets_and_is_repaired(cluster: Cluster, operator: Operator) -> None:
    ns = "targets"
    def terms() -> list[dict[str, Any]]:
        ds = cluster.get("apps/v1", "daemonsets", daemonset.NAME, OPERATOR_NS)
        return [] if ds is None else ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    cluster.create(tuning("pinned", ns, nodes={"names": ["gpu-1"]}))
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}
    cluster.wait("affinity for gpu-1", lambda: by_name in terms(), timeout=30)
    cluster.create(tuning("pool", ns, nodes={"selector": {"pool": "a"}}))
    by_label = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
    cluster.wait("affinity for pool=a", lambda: by_label in terms(), timeout=30)
    cluster.delete(GV, "ccltunings", "pool", ns)
    cluster.wait("affinity without pool=a", lambda: by_label not in terms() and by_name in terms(), timeout=30)
    cluster.delete("apps/v1", "daemonsets", daemonset.NAME, OPERATOR_NS)
    cluster.wait("DaemonSet recreated", lambda: by_name in terms(), timeout=30)


def test_spec_change_switches_generation_and_prunes(cluster: Cluster, operator: Operator) -> None:
    ns, name = "gens", "gen"
    cluster.create(tuning(name, ns))
    wait_condition(cluster, operator, ns, name, "Ready", "True")

    def status() -> dict[str, Any]:
        return cluster.get(GV, "ccltunings", name, ns)["status"]  # type: ignore[index]
    generations = [[m["name"] for m in status()["configMaps"][:-1]]]
    for generation, max_bytes in ((2, "256K"), (3, "512K")):
        spec = tuning(name, ns)["spec"]
        spec["collectives"][0]["maxBytes"] = max_bytes
        cluster.patch(GV, "ccltunings", name, {"spec": spec}, ns)
        cluster.wait(f"generation {generation} published", lambda g=generation: status().get("observedGeneration") == g
                     and any(c["type"] == "Ready" and c["status"] == "True" for c in status()["conditions"]))
        generations.append([m["name"] for m in status()["configMaps"][:-1]])
    assert len({tuple(g) for g in generations}) == 3  # each spec gave a new content generation
    pointer = cluster.get("v1", "configmaps", f"{name}-ccltune", ns)
    assert json.loads(pointer["data"]["manifest.json"])["configMaps"] == generations[-1]  # type: ignore[index]
    live = {m["metadata"]["name"] for m in cluster.list("v1", "configmaps", ns)}
    assert set(generations[2]) <= live and set(generations[1]) <= live  # the previous one stays a while
    assert not set(generations[0]) & live  # older ones are pruned


def test_metrics(cluster: Cluster, operator: Operator) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m", "labels": {"app": "none"}},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    admit(operator, pod, "default")
    text = httpx.get(f"http://127.0.0.1:{operator.env['CCLTUNE_METRICS_PORT']}/metrics", timeout=10).text
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples['ccltune_reconciles_total{outcome="ready"}'] >= 1
    assert samples['ccltune_plan_jobs_total{outcome="failed"}'] >= 1
    assert samples['ccltune_webhook_pods_total{outcome="unselected"}'] >= 1
    assert samples["ccltune_tunings_ready"] >= 1


def test_delete_removes_what_it_created(cluster: Cluster, operator: Operator) -> None:
    for obj in cluster.list(GV, "ccltunings"):
        cluster.delete(GV, "ccltunings", obj["metadata"]["name"], obj["metadata"]["namespace"])

    def leftovers() -> list[str]:
        cms = [f"{m['metadata']['namespace']}/{m['metadata']['name']}" for m in cluster.list("v1", "configmaps")
               if (m["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") == "ccltune"
               or (m["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "ccltune-operator"]
        jobs = [j["metadata"]["name"] for j in cluster.list("batch/v1", "jobs", OPERATOR_NS)]
        ds = cluster.get("apps/v1", "daemonsets", daemonset.NAME, OPERATOR_NS)
        return cms + jobs + ([daemonset.NAME] if ds else [])
    try:
        cluster.wait("cleanup", lambda: not leftovers(), timeout=30)
    except AssertionError:
        print(leftovers())
        raise
