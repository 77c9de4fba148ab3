"""Pod injection logic: selected pods get mounts/env/annotation; user env wins; idempotent."""

from __future__ import annotations

import copy
import json

import jsonpatch

from ccltune.api.ccltuning import LabelSelector
from ccltune.controller import webhook
from ccltune.controller.selectors import matches

MANIFEST = {
    "plan": "t-ccltune", "digest": "d" * 64, "configMaps": ["t-ccltune-dddddddddd-0"],
    "items": [
        {"configMap": "t-ccltune-dddddddddd-0", "key": "nccl.conf", "path": "nccl.conf"},
        {"configMap": "t-ccltune-dddddddddd-0", "key": "msccl__ar.xml", "path": "msccl/ar.xml"},
        {"configMap": "t-ccltune-dddddddddd-0", "key": "nccl-topo.xml", "path": "nccl-topo.xml"},
    ],
    "env": {},
}


def pod(env: list[dict[str, str]] | None = None) -> dict:
    return {"metadata": {"name": "p", "labels": {"app": "llm"}},
            "spec": {"containers": [{"name": "train", "image": "x", "env": env or []}, {"name": "side", "image": "y"}]}}


def test_injection_mounts_and_env() -> None:
    p = pod()
    desired = webhook.injected_pod(p, MANIFEST, "t")
    after = jsonpatch.apply_patch(p, jsonpatch.make_patch(p, {**p, **_merge(p, desired)}).patch)
    vol = after["spec"]["volumes"][0]
    assert vol["name"] == webhook.VOLUME
    items = vol["projected"]["sources"][0]["configMap"]["items"]
    assert {"key": "msccl__ar.xml", "path": "msccl/ar.xml"} in items
    for c in after["spec"]["containers"]:
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["NCCL_CONF_FILE"] == "/etc/ccltune/nccl.conf"
        assert env["MSCCL_ALGO_DIR"] == "/etc/ccltune/msccl"
        assert env["NCCL_TOPO_FILE"] == "/etc/ccltune/nccl-topo.xml"
        assert {"name": webhook.VOLUME, "mountPath": "/etc/ccltune", "readOnly": True} in c["volumeMounts"]
    assert after["metadata"]["annotations"][webhook.ANNOTATION_DIGEST] == "d" * 64


def test_user_env_wins_and_idempotent() -> None:
    p = pod(env=[{"name": "NCCL_TOPO_FILE", "value": "/mine.xml"}])
    once = _merge(p, webhook.injected_pod(p, MANIFEST, "t"))
    train = once["spec"]["containers"][0]
    assert [e for e in train["env"] if e["name"] == "NCCL_TOPO_FILE"] == [{"name": "NCCL_TOPO_FILE", "value": "/mine.xml"}]
    assert webhook.changes(once, webhook.injected_pod(once, MANIFEST, "t")) == {}


def test_selection() -> None:
    sel = LabelSelector.model_validate({"matchLabels": {"app": "llm"},
                                        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]})
    entries = [webhook.Entry("b", sel, True, "b-ccltune", True, None),
               webhook.Entry("a", sel, True, "a-ccltune", True, None),
               webhook.Entry("c", sel, False, "c-ccltune", True, None)]
    assert webhook.select({"app": "llm"}, entries).name == "a"  # type: ignore[union-attr]
    assert webhook.select({"app": "llm", "tier": "cpu"}, entries) is None
    assert webhook.select({"app": "other"}, entries) is None
    assert not matches(LabelSelector(), {"app": "llm"})  # empty selector selects nothing


def test_entry_reads_status() -> None:
    spec = {"selector": {"matchLabels": {"app": "llm"}}, "collectives": [{"op": "allreduce"}],
            "workloadRef": {"kind": "PyTorchJob", "name": "run1"}}
    e = webhook.entry("t", spec, {"conditions": [{"type": "Published", "status": "True"}], "planDigest": "x"})
    assert e is not None and e.published and e.pointer == "t-ccltune"
    assert e.selector.match_labels == {"app": "llm", "training.kubeflow.org/job-name": "run1"}
    assert webhook.entry("t", {"collectives": []}, {}) is None  # invalid spec: never injects


def _merge(pod: dict, desired: dict) -> dict:
    out = copy.deepcopy(pod)
    out.setdefault("metadata", {}).setdefault("annotations", {}).update(desired["metadata"]["annotations"])
    out["spec"].update(desired["spec"])
    return json.loads(json.dumps(out))


def test_pytorchjob_example_selects_the_jobs_pods() -> None:
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "ccltuning-pytorchjob.yaml").read_text())
    e = webhook.entry(doc["metadata"]["name"], doc["spec"], {})
    assert e is not None and e.pointer == "gpt-13b-nccl"
    assert webhook.select({"training.kubeflow.org/job-name": "gpt-13b", "role": "worker"}, [e]) is e
    assert webhook.select({"training.kubeflow.org/job-name": "other"}, [e]) is None
