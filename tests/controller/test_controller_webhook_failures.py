"""The webhook never denies a pod for its own failure (issue 17): a connection reset while reading
the pointer, a corrupt manifest, a damaged generation and malformed reviews all admit the pod
untuned, with a warning, an Event and a metric; `failurePolicy: Fail` denies instead, as asked."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ctl_harness import Cluster, Process, free_port, operator_env
from ctl_world import Operator

pytestmark = pytest.mark.slow
GV = "ccltune.io/v1alpha1"
NS = "wh"
TUNING = "trainer"
POINTER = f"{TUNING}-ccltune"


@pytest.fixture(scope="module")
def operator(cluster: Cluster, agents: list[Process]) -> Iterator[Operator]:
    op = Operator(cluster, operator_env(cluster, CCLTUNE_METRICS_PORT=str(free_port()),
                                        CCLTUNE_HEAL_INTERVAL_SECONDS="3600",
                                        CCLTUNE_TOPOLOGY_TIMEOUT_SECONDS="3"))
    try:
        yield op
    finally:
        op.proc.stop()


@pytest.fixture(scope="module")
def ready(cluster: Cluster, operator: Operator) -> Operator:
    cluster.create({"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": TUNING, "namespace": NS},
                    "spec": {"selector": {"matchLabels": {"app": TUNING}},
                             "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "128K"}]}})
    wait_injected(cluster, operator)
    return operator


def pod(name: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name or f"p-{uuid.uuid4().hex[:6]}", "namespace": NS, "labels": {"app": TUNING},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                              "uid": "job-uid", "controller": True}]},
            "spec": {"containers": [{"name": "train", "image": "pytorch"}]}}


def review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": obj["metadata"]["name"], "namespace": NS, "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
        "object": obj, "oldObject": None, "dryRun": False, "options": {}}}


def post(op: Operator, body: Any) -> dict[str, Any]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = httpx.post(op.webhook_url, content=content, headers={"Content-Type": "application/json"}, timeout=15)
    assert resp.status_code == 200, (resp.status_code, resp.text)  # any HTTP error is a non-answer
    answer: dict[str, Any] = resp.json()["response"]
    return answer


def patched_configmaps(answer: dict[str, Any]) -> list[str] | None:
    if "patch" not in answer:
        return None
    ops = json.loads(base64.b64decode(answer["patch"]))
    volumes = [v for o in ops if o["path"] in ("/spec/volumes", "/spec/volumes/-") for v in
               (o["value"] if isinstance(o["value"], list) else [o["value"]])]
    return [s["configMap"]["name"] for v in volumes if "projected" in v for s in v["projected"]["sources"]]


def wait_injected(cluster: Cluster, op: Operator, timeout: float = 120) -> list[str]:
    """Admit pods until one is injected (the index sees the status only after a watch event)."""
    def injected() -> list[str] | None:
        try:
            answer = post(op, review(pod()))
        except httpx.TransportError:
            return None  # the operator is still starting its webhook server
        assert answer["allowed"] is True
        return patched_configmaps(answer)
    try:
        names: list[str] = cluster.wait("a pod injected", injected, timeout=timeout, every=0.5)
    except AssertionError:
        print(op.logs())
        raise
    return names


def untuned(answer: dict[str, Any], needle: str) -> str:
    assert answer["allowed"] is True
    assert "patch" not in answer, "a pod admitted after a failure must not be patched"
    warning = " ".join(answer.get("warnings") or [])
    assert "admitted untuned" in warning and needle in warning, warning
    return warning


def failures(op: Operator) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{op.env['CCLTUNE_METRICS_PORT']}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("ccltune_webhook_failures_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('reason="')[1].split('"')[0]] = float(value)
    return out


def wait_event(cluster: Cluster, needle: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((e for e in cluster.list("v1", "events", NS)
                     if e.get("reason") == "PodNotInjected" and needle in e.get("message", "")), None)
    event: dict[str, Any] = cluster.wait(f"PodNotInjected event with {needle!r}", found, timeout=30)
    return event


def test_connection_reset_reading_the_pointer_admits_untuned(cluster: Cluster, ready: Operator) -> None:
    assert cluster.server is not None
    name = f"reset-{uuid.uuid4().hex[:6]}"
    resets: list[dict[str, Any]] = []

    def reset(record: dict[str, Any]) -> bool:
        hit = (record["identity"] == "operator" and record["verb"] == "get"
               and record["resource"] == "configmaps" and record["name"] == POINTER)
        if hit:
            resets.append(record)
        return hit
    cluster.server.reset_if.append(reset)
    try:
        answer = post(ready, review(pod(name)))
    finally:
        cluster.server.reset_if.remove(reset)
    assert resets, "the fault was not injected"
    untuned(answer, name)
    assert failures(ready).get("api-unreachable", 0) >= 1
    event = wait_event(cluster, name)
    assert event["involvedObject"]["kind"] == "CCLTuning" and event["involvedObject"]["name"] == TUNING
    assert event["type"] == "Warning"
    wait_injected(cluster, ready)  # the next pod, with the API back, is injected


def test_corrupt_pointer_admits_untuned_and_is_republished(cluster: Cluster, ready: Operator) -> None:
    good = cluster.get("v1", "configmaps", POINTER, NS)
    assert good is not None
    cluster.patch("v1", "configmaps", POINTER, {"data": {"manifest.json": "{not json"}}, NS)
    name = f"corrupt-{uuid.uuid4().hex[:6]}"
    untuned(post(ready, review(pod(name))), "not valid JSON")
    assert failures(ready).get("corrupt-pointer", 0) >= 1
    wait_event(cluster, name)
    # The webhook asked for a re-plan: the pointer is rewritten from the plan, pods get it again.
    cluster.wait("pointer repaired", lambda: (cluster.get("v1", "configmaps", POINTER, NS) or {}).get("data")
                 == good["data"], timeout=90)
    names = wait_injected(cluster, ready)
    assert all(cluster.get("v1", "configmaps", n, NS) is not None for n in names)


def test_damaged_generation_is_not_mounted(cluster: Cluster, ready: Operator) -> None:
    names = wait_injected(cluster, ready)
    original = cluster.get("v1", "configmaps", names[0], NS)
    assert original is not None
    cluster.delete("v1", "configmaps", names[0], NS)
    name = f"damaged-{uuid.uuid4().hex[:6]}"
    untuned(post(ready, review(pod(name))), names[0])  # mounting it would hang the pod
    assert failures(ready).get("plan-damaged", 0) >= 1
    cluster.wait("content ConfigMap republished", lambda: (cluster.get("v1", "configmaps", names[0], NS) or {})
                 .get("data") == original.get("data") and (cluster.get("v1", "configmaps", names[0], NS) or {})
                 .get("binaryData") == original.get("binaryData"), timeout=90)
    again = wait_injected(cluster, ready)
    assert again == names


@pytest.mark.parametrize(("body", "reason"), [
    (b"this is not json", "malformed-review"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "malformed-review"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "object": {"metadata": {"name": "x"}}}}, "malformed-review"),  # no userInfo
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u2", "resource": {"group": "", "version": "v1", "resource": "secrets"}, "operation": "CREATE",
        "userInfo": {}, "object": {"metadata": {"name": "x"}}}}, "malformed-review"),  # not ours
])
def test_malformed_reviews_are_admitted(ready: Operator, body: Any, reason: str) -> None:
    before = failures(ready).get(reason, 0)
    answer = post(ready, body)
    assert answer["allowed"] is True and "patch" not in answer
    assert "not served" in " ".join(answer["warnings"])
    if isinstance(body, dict) and "request" in body:
        assert answer["uid"] == body["request"]["uid"]
    assert failures(ready)[reason] == before + 1


def test_failure_policy_fail_denies(cluster: Cluster, ready: Operator) -> None:
    """Last: restarts the operator with the policy the user chose explicitly."""
    assert cluster.server is not None
    ready.proc.stop()
    ready.env["CCLTUNE_WEBHOOK_FAILURE_POLICY"] = "Fail"
    ready.start()
    wait_injected(cluster, ready)

    def reset(record: dict[str, Any]) -> bool:
        return record["identity"] == "operator" and record["verb"] == "get" and record["name"] == POINTER
    cluster.server.reset_if.append(reset)
    try:
        answer = post(ready, review(pod()))
    finally:
        cluster.server.reset_if.remove(reset)
    assert answer["allowed"] is False and answer["status"]["code"] == 500
    assert "failurePolicy Fail" in answer["status"]["message"]
    malformed = post(ready, b"{")
    assert malformed["allowed"] is False and "warnings" not in malformed
