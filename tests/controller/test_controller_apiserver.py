"""The emulator refuses what a real API server refuses (ctl_apiserver.py), with its status codes."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ctl_apiserver import Validator, check_labels, check_name
from ctl_harness import Cluster, cluster_at
from hypothesis import given, settings
from hypothesis import strategies as st

GV = "ccltune.io/v1alpha1"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster_at(tmp_path_factory.mktemp("kmock-api")) as c:
        c.load_crds()
        yield c


def configmap(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "api"}, **fields}


def post(c: Cluster, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    resp = c.http.post(path, json=body)
    return resp.status_code, resp.json()


def test_names_must_be_dns_subdomains() -> None:
    assert check_name("ConfigMap", "a.b-c") == []
    assert check_name("ConfigMap", "a" * 253) == []
    for bad in ("plän-ü", "Upper", "-dash", "dash-", "a" * 254, "under_score"):
        assert check_name("ConfigMap", bad), bad
    assert check_name("Job", "a" * 64)  # Job names are label-sized
    assert check_name("Job", "a" * 63) == []


def test_label_keys_and_values() -> None:
    assert check_labels({"ccltune.io/plan": "x" * 63, "app": "", "a.b/c_d": "v.1-2_3"}) == []
    assert check_labels({"ccltune.io/plan": "x" * 64})
    assert check_labels({"k": "-starts-with-dash"})
    assert check_labels({"Bad_Prefix/name": "v"})
    assert check_labels({"ok/" + "n" * 64: "v"})


def test_api_refuses_bad_names_and_labels_with_422(api: Cluster) -> None:
    code, body = post(api, "/api/v1/namespaces/api/configmaps", configmap("plän-ü"))
    assert code == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    cm = configmap("fine")
    cm["metadata"]["labels"] = {"ccltune.io/plan": "n" * 64}
    code, body = post(api, "/api/v1/namespaces/api/configmaps", cm)
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.labels"
    assert api.get("v1", "configmaps", "fine", "api") is None  # nothing was stored


def test_configmap_size_limit(api: Cluster) -> None:
    blob = base64.b64encode(b"\0" * (1024 * 1024)).decode()
    code, body = post(api, "/api/v1/namespaces/api/configmaps", configmap("big", binaryData={"b": blob}))
    assert code == 422 and "at most 1048576 bytes" in body["message"]
    code, _ = post(api, "/api/v1/namespaces/api/configmaps",
                   configmap("just-fits", binaryData={"b": base64.b64encode(b"\0" * (1024 * 1024 - 1)).decode()}))
    assert code == 201 or code == 200
    huge = "x" * (3 * 1024 * 1024 + 1)
    code, _ = post(api, "/api/v1/namespaces/api/configmaps", configmap("huge", data={"k": huge}))
    assert code == 413


def test_immutable_configmaps_cannot_change(api: Cluster) -> None:
    api.create(configmap("frozen", immutable=True, data={"k": "v"}))
    resp = api.http.patch("/api/v1/namespaces/api/configmaps/frozen", json={"data": {"k": "w"}},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status_code == 422 and resp.json()["details"]["causes"][0]["field"] == "data"
    resp = api.http.patch("/api/v1/namespaces/api/configmaps/frozen", json={"immutable": False},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status_code == 422
    # Metadata stays writable (owner references, labels).
    resp = api.http.patch("/api/v1/namespaces/api/configmaps/frozen", json={"metadata": {"labels": {"a": "b"}}},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status_code == 200
    assert (api.get("v1", "configmaps", "frozen", "api") or {})["data"] == {"k": "v"}


def tuning(name: str, **spec: Any) -> dict[str, Any]:
    body = {"collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "128K"}], **spec}
    return {"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": name, "namespace": "api"}, "spec": body}


@pytest.mark.parametrize(("spec", "field"), [
    ({"collectives": [{"op": "allreduce", "maxBytes": "1T"}]}, "spec.collectives[0].maxBytes"),
    ({"collectives": [{"op": "allreduce", "maxBytes": "999999999999999T"}]}, "spec.collectives[0].maxBytes"),
    ({"publish": {"configMapName": "plän-ü"}}, "spec.publish.configMapName"),
    ({"collectives": [{"op": "allreduce", "maxBytes": "1 gigabyte"}]}, "spec.collectives[0].maxBytes"),
    ({"collectives": []}, "spec"),  # CEL: nothing to plan
], ids=["1T", "999999999999999T", "configMapName", "pattern", "cel-nothing-to-plan"])
def test_crd_schema_and_cel_refuse_bad_specs(api: Cluster, spec: dict[str, Any], field: str) -> None:
    code, body = post(api, f"/apis/{GV}/namespaces/api/ccltunings", tuning("bad", **spec))
    assert code == 422, body
    assert field in [c["field"] for c in body["details"]["causes"]], body


def test_crd_accepts_the_limits_and_checks_updates(api: Cluster) -> None:
    api.create(tuning("edge", collectives=[{"op": "allreduce", "minBytes": "0.015625T", "maxBytes": "16G"}],
                      publish={"configMapName": "a.valid-name"}))
    resp = api.http.patch(f"/apis/{GV}/namespaces/api/ccltunings/edge",
                          json={"spec": {"collectives": [{"op": "allreduce", "maxBytes": "17G"}]}},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status_code == 422
    got = api.get(GV, "ccltunings", "edge", "api") or {}
    assert got["spec"]["collectives"][0]["maxBytes"] == "16G"


def test_validator_runs_transition_rules_only_on_updates(tmp_path: Path) -> None:
    from ctl_apiserver import load_crds
    from ctl_harness import CRDS

    v = Validator(load_crds(sorted(CRDS.glob("*.yaml"))))
    node: dict[str, Any] = {"apiVersion": GV, "kind": "NodeTopology", "metadata": {"name": "n1"},
            "spec": {"nodeName": "n1", "agentVersion": "0.1.0", "gpus": [], "nics": []}}
    assert v.check("NodeTopology", GV, "nodetopologies", node, None) == []
    moved = {**node, "spec": {**node["spec"], "nodeName": "n2"}}
    assert [c.field for c in v.check("NodeTopology", GV, "nodetopologies", moved, node)] == ["spec.nodeName"]


# -- derived names fit whatever the CCLTuning is called ----------------------------------------

_DNS = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", fullmatch=True).filter(
    lambda s: ".." not in s and ".-" not in s and "-." not in s)


@settings(max_examples=300, deadline=None)
@given(name=_DNS, index=st.integers(0, 99))
def test_derived_names_and_labels_pass_the_api_server(name: str, index: int) -> None:
    from ccltune.publish.configmaps import content_name, plan_label, pointer_name

    assert check_name("ConfigMap", name) == []  # the strategy makes only valid CCLTuning names
    pointer = pointer_name(name)
    content = content_name(pointer, "0123456789", index)
    label = plan_label(pointer)
    assert check_name("ConfigMap", pointer) == [] and check_name("ConfigMap", content) == []
    assert check_labels({"ccltune.io/plan": label}) == []
    assert (pointer, content, label) == (pointer_name(name), content_name(pointer, "0123456789", index),
                                         plan_label(pointer))  # deterministic
    if len(name) <= 63 - len("-ccltune"):
        assert pointer == f"{name}-ccltune" and label == pointer  # short names are kept as they are


def test_long_names_stay_apart() -> None:
    from ccltune.publish.configmaps import plan_label, pointer_name

    a, b = "x" * 60 + "a", "x" * 60 + "b"
    assert plan_label(pointer_name(a)) != plan_label(pointer_name(b))
