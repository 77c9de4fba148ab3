"""Self-healing publication, no leak at a crash point, quiet logs (issue 17).

The operator is SIGKILLed at chosen writes (the harness's `after_served` hook runs once the write
took effect, before the operator sees the reply) and restarted; the harness plays the garbage
collector, so "nothing leaks" means nothing is left after the CCLTuning is deleted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from ctl_harness import Cluster, Process, free_port, operator_env
from ctl_world import Operator

from ccltune.controller.jobs import LABEL_ROLE, LABEL_TUNING_UID

pytestmark = pytest.mark.slow
GV = "ccltune.io/v1alpha1"
OPERATOR_NS = "ccltune-system"


@pytest.fixture(scope="module")
def operator(cluster: Cluster, agents: list[Process]) -> Iterator[Operator]:
    # Tunings with tuning enabled plan in Jobs (budget x tasks > 50). Healing runs at startup
    # only (and when the webhook reports damage) unless a test restarts with a short interval.
    op = Operator(cluster, operator_env(cluster, CCLTUNE_INPROCESS_MAX_TRIALS="50",
                                        CCLTUNE_HEAL_INTERVAL_SECONDS="3600",
                                        CCLTUNE_METRICS_PORT=str(free_port())))
    try:
        yield op
    finally:
        op.proc.stop()


def tuning(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    body = {"selector": {"matchLabels": {"app": name}},
            "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "128K"}], **spec}
    return {"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": name, "namespace": ns}, "spec": body}


def condition(cluster: Cluster, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
    obj = cluster.get(GV, "ccltunings", name, ns) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def wait_ready(cluster: Cluster, op: Operator, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        cond = condition(cluster, ns, name, "Ready")
        obj = cluster.get(GV, "ccltunings", name, ns) or {}
        if cond and cond["status"] == "True" and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]:
            return obj
        return None
    try:
        obj: dict[str, Any] = cluster.wait(f"{ns}/{name} Ready", ready, timeout=timeout)
    except AssertionError:
        print(json.dumps((cluster.get(GV, "ccltunings", name, ns) or {}).get("status"), indent=1))
        print(op.logs())
        raise
    return obj


def content(cm: dict[str, Any] | None) -> tuple[Any, Any] | None:
    return None if cm is None else (cm.get("data"), cm.get("binaryData"))


def restart(op: Operator, **env: str) -> None:
    op.proc.kill()
    op.env.update(env)
    op.start()


def admit(cluster: Cluster, op: Operator, ns: str, app: str) -> list[str]:
    """Admits pods until one is injected; returns the ConfigMaps its volume projects."""
    import base64

    def once() -> list[str] | None:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{uuid.uuid4().hex[:6]}",
               "namespace": ns, "labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "resource": {"group": "", "version": "v1", "resource": "pods"},
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": ns, "operation": "CREATE",
            "userInfo": {"username": "u"}, "object": pod, "oldObject": None, "dryRun": False}}
        try:
            answer = httpx.post(op.webhook_url, json=review, timeout=15).json()["response"]
        except httpx.TransportError:
            return None
        assert answer["allowed"] is True
        if "patch" not in answer:
            return None
        ops = json.loads(base64.b64decode(answer["patch"]))
        return [s["configMap"]["name"] for o in ops if o["path"].startswith("/spec/volumes")
                for v in (o["value"] if isinstance(o["value"], list) else [o["value"]]) if "projected" in v
                for s in v["projected"]["sources"]]
    names: list[str] = cluster.wait("an injected pod", once, timeout=60, every=0.5)
    return names


def test_deleted_content_configmap_is_repaired_after_restart(cluster: Cluster, operator: Operator) -> None:
    ns, name = "heal", "healme"
    cluster.create(tuning(name, ns))
    obj = wait_ready(cluster, operator, ns, name)
    names = [m["name"] for m in obj["status"]["configMaps"][:-1]]
    original = {n: content(cluster.get("v1", "configmaps", n, ns)) for n in names}
    operator.proc.kill()
    cluster.delete("v1", "configmaps", names[0], ns)
    assert cluster.get("v1", "configmaps", names[0], ns) is None
    operator.start()
    cluster.wait("content ConfigMap recreated", lambda: content(cluster.get("v1", "configmaps", names[0], ns))
                 == original[names[0]], timeout=120)
    obj = wait_ready(cluster, operator, ns, name)
    assert [m["name"] for m in obj["status"]["configMaps"][:-1]] == names  # the same generation
    assert condition(cluster, ns, name, "Published")["status"] == "True"  # type: ignore[index]
    reasons = {e.get("reason") for e in cluster.list("v1", "events", ns)}
    assert "PublicationDamaged" in reasons  # the repair was said, not silent
    mounted = admit(cluster, operator, ns, name)  # pods admitted afterwards mount what exists
    assert mounted and all(cluster.get("v1", "configmaps", n, ns) is not None for n in mounted)


def test_periodic_check_repairs_edited_content(cluster: Cluster, operator: Operator) -> None:
    ns, name = "heal", "edited"
    restart(operator, CCLTUNE_HEAL_INTERVAL_SECONDS="1")
    cluster.create(tuning(name, ns))
    obj = wait_ready(cluster, operator, ns, name)
    target = obj["status"]["configMaps"][0]["name"]
    live = cluster.get("v1", "configmaps", target, ns)
    assert live is not None
    # Someone replaced the (immutable) ConfigMap with other bytes under the same name.
    cluster.delete("v1", "configmaps", target, ns)
    forged = {k: v for k, v in live.items() if k != "metadata"}
    forged["metadata"] = {k: v for k, v in live["metadata"].items() if k in ("name", "namespace", "labels")}
    forged["data"] = {k: v + "# edited\n" for k, v in (live.get("data") or {}).items()}
    cluster.create(forged)
    cluster.wait("edited content replaced by the plan's", lambda: content(cluster.get("v1", "configmaps", target, ns))
                 == content(live), timeout=60)
    wait_ready(cluster, operator, ns, name)
    text = httpx.get(f"http://127.0.0.1:{operator.env['CCLTUNE_METRICS_PORT']}/metrics", timeout=10).text
    assert 'ccltune_publication_repairs_total{reason="content-corrupt"}' in text
    restart(operator, CCLTUNE_HEAL_INTERVAL_SECONDS="3600")


def _kill_at(cluster: Cluster, op: Operator, match: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """SIGKILL the operator right after the first request `match` accepts took effect."""
    assert cluster.server is not None
    hits: list[dict[str, Any]] = []

    def hook(record: dict[str, Any]) -> None:
        if not hits and record["identity"] == "operator" and match(record):
            hits.append(record)
            op.proc.kill()
    cluster.server.after_served.append(hook)
    return hits


def _leftovers(cluster: Cluster, uid: str) -> list[str]:
    objs = cluster.list("v1", "configmaps", OPERATOR_NS) + cluster.list("batch/v1", "jobs", OPERATOR_NS)
    return [f"{o.get('kind', '?')}/{o['metadata']['name']}" for o in objs
            if (o["metadata"].get("labels") or {}).get(LABEL_TUNING_UID) == uid]


def _plan_objects(cluster: Cluster, uid: str, role: str) -> list[dict[str, Any]]:
    return [o for o in cluster.list("v1", "configmaps", OPERATOR_NS) + cluster.list("batch/v1", "jobs", OPERATOR_NS)
            if (o["metadata"].get("labels") or {}).get(LABEL_TUNING_UID) == uid
            and (o["metadata"].get("labels") or {}).get(LABEL_ROLE) == role]


def test_no_leak_when_killed_right_after_the_job_is_created(cluster: Cluster, operator: Operator) -> None:
    assert cluster.server is not None
    ns, name = "leak", "killed-after-job"
    cluster.kubelet.hold = True  # the plan stays "in the middle"
    hits = _kill_at(cluster, operator, lambda r: r["verb"] == "create" and r["resource"] == "jobs")
    try:
        cluster.create(tuning(name, ns, tuning={"enabled": True, "budget": 100}))
        cluster.wait("the operator killed after creating the plan Job", lambda: hits, timeout=60)
    finally:
        cluster.server.after_served.clear()
    uid = cluster.get(GV, "ccltunings", name, ns)["metadata"]["uid"]  # type: ignore[index]
    [job] = _plan_objects(cluster, uid, "job")
    [cm] = _plan_objects(cluster, uid, "input")
    assert not cm["metadata"].get("ownerReferences")  # the crash point of issue 17
    operator.start()
    cluster.wait("the input adopted by its Job", lambda: [o.get("uid") for o in (cluster.get(
        "v1", "configmaps", cm["metadata"]["name"], OPERATOR_NS) or {"metadata": {}})["metadata"].get(
        "ownerReferences") or []] == [job["metadata"]["uid"]], timeout=60)
    cluster.delete(GV, "ccltunings", name, ns)
    try:
        cluster.wait("no plan Job or ConfigMap left", lambda: not _leftovers(cluster, uid), timeout=60)
    finally:
        cluster.kubelet.hold = False


def test_no_leak_when_killed_before_the_job_and_deleted_while_down(cluster: Cluster, operator: Operator) -> None:
    assert cluster.server is not None
    ns, name = "leak", "killed-before-job"
    cluster.kubelet.hold = True
    hits = _kill_at(cluster, operator, lambda r: r["verb"] == "create" and r["resource"] == "configmaps"
                    and r["namespace"] == OPERATOR_NS)
    try:
        cluster.create(tuning(name, ns, tuning={"enabled": True, "budget": 101}))
        cluster.wait("the operator killed after writing the plan input", lambda: hits, timeout=60)
    finally:
        cluster.server.after_served.clear()
    uid = cluster.get(GV, "ccltunings", name, ns)["metadata"]["uid"]  # type: ignore[index]
    assert [o["metadata"]["name"] for o in _plan_objects(cluster, uid, "input")]
    assert not _plan_objects(cluster, uid, "job")
    cluster.delete(GV, "ccltunings", name, ns)  # while the operator is down: no DELETED event for it
    operator.start()
    try:
        cluster.wait("the orphaned input swept", lambda: not _leftovers(cluster, uid), timeout=60)
    finally:
        cluster.kubelet.hold = False


def test_waiting_on_a_plan_job_logs_no_error(cluster: Cluster, operator: Operator) -> None:
    assert cluster.server is not None
    ns, name = "quiet", "patient"
    restart(operator)  # a log of its own
    cluster.kubelet.hold = True
    cluster.create(tuning(name, ns, tuning={"enabled": True, "budget": 102}))
    def polls() -> int:
        log: list[dict[str, Any]] = cluster.api_log()
        return len([r for r in log if r["identity"] == "operator" and r["resource"] == "jobs"
                    and r["verb"] == "get" and r["namespace"] == OPERATOR_NS])
    start = polls()
    cluster.wait("several polls of the running Job", lambda: polls() - start >= 5, timeout=60)
    cluster.kubelet.hold = False
    wait_ready(cluster, operator, ns, name)
    lines = [json.loads(line) for line in operator.proc.log_path.read_text().splitlines() if line.startswith("{")]
    errors = [line for line in lines if line.get("severity") in ("error", "fatal", "critical")]
    assert not errors, errors
    about = [line for line in lines if (line.get("object") or {}).get("name") == name]
    assert any("waits: planning in Job" in line["message"] for line in about)
    assert all(line.get("tuning") == {"namespace": ns, "name": name} for line in about)
