"""Pod injection logic: selected pods get mounts/env/annotation; user env wins; idempotent; packed
plans add the unpack init container and an emptyDir."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonpatch
import kubernetes_validate

from ccltune.api.ccltuning import LabelSelector
from ccltune.controller import webhook
from ccltune.controller.config import OperatorConfig
from ccltune.controller.selectors import matches
from ccltune.publish.unpack import read_configmaps

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


def test_plain_plans_get_only_the_projected_volume() -> None:
    p = pod()
    p["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    desired = webhook.injected_pod(p, MANIFEST, "t")
    assert set(desired["spec"]) == {"volumes", "containers"}  # no init container, no emptyDir
    assert [v["name"] for v in desired["spec"]["volumes"]] == [webhook.VOLUME]
    # A pod copied from one injected with a packed plan loses the stale unpack container.
    stale = _merge(p, webhook.injected_pod(p, _packed_manifest(), "t"))
    again = webhook.injected_pod(stale, MANIFEST, "t")["spec"]
    assert again["initContainers"] == [{"name": "fetch", "image": "busybox"}]
    assert [v["name"] for v in again["volumes"]] == [webhook.VOLUME] and "projected" in again["volumes"][0]


def _plan_files() -> dict[str, str]:
    return {"msccl/big.xml": "".join(f'<step s="{i}" srcoff="{i * 7919 % 1000003}"/>\n' for i in range(120_000)),
            "msccl/small.xml": "<algo/>\n", "nccl.conf": "NCCL_ALGO=ring\n", "nccl-topo.xml": "<system/>\n"}


def _published() -> list[dict]:
    from ccltune.api.plan import Plan
    from ccltune.publish.configmaps import render_configmaps
    from ccltune.publish.files import plan_file, with_files

    plan = with_files(Plan(name="p", cluster="c", world_size=16, nodes=2, tasks=[]),
                      [plan_file(k, v) for k, v in _plan_files().items()])
    return render_configmaps(plan, name="t-ccltune", namespace="ml")


def _packed_manifest() -> dict:
    return webhook.read_manifest(_published()[-1])


def test_packed_plans_are_unpacked_by_an_init_container() -> None:
    manifest = _packed_manifest()
    assert any(i.get("packing") for i in manifest["items"])
    p = pod()
    p["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    once = _merge(p, webhook.injected_pod(p, manifest, "t"))
    spec = once["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[webhook.VOLUME] == {"name": webhook.VOLUME, "emptyDir": {}}
    packed = volumes[webhook.PACKED_VOLUME]["projected"]["sources"]
    assert sorted(i["key"] for s in packed for i in s["configMap"]["items"]) == sorted(i["key"] for i in manifest["items"])
    init, fetch = spec["initContainers"]  # ours first: later init containers may read the files
    assert fetch == {"name": "fetch", "image": "busybox"}
    assert init["name"] == "ccltune-unpack" and init["command"][:2] == ["ccltune", "unpack"]
    assert {m["name"]: m.get("readOnly", False) for m in init["volumeMounts"]} == {
        webhook.PACKED_VOLUME: True, webhook.VOLUME: False}
    assert init["securityContext"] == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    assert init["resources"]["requests"] == init["resources"]["limits"]  # QoS class unchanged
    assert init["image"] == OperatorConfig().agent_image
    for c in spec["containers"]:  # the app sees plain files, read-only, where NCCL/MSCCL look
        assert {"name": webhook.VOLUME, "mountPath": "/etc/ccltune", "readOnly": True} in c["volumeMounts"]
        assert {"name": "MSCCL_ALGO_DIR", "value": "/etc/ccltune/msccl"} in c["env"]
        assert all(m["name"] != webhook.PACKED_VOLUME for m in c["volumeMounts"])
    # Idempotent, and a re-run neither duplicates ours nor drops the user's.
    assert webhook.changes(once, webhook.injected_pod(once, manifest, "t")) == {}
    assert [c["name"] for c in webhook.injected_pod(once, manifest, "t")["spec"]["initContainers"]] == [
        "ccltune-unpack", "fetch"]
    full = {"apiVersion": "v1", "kind": "Pod", **once}
    kubernetes_validate.validate(full, kubernetes_validate.latest_version(), strict=True)


def test_unpack_image_and_root_pods() -> None:
    cfg = OperatorConfig(unpack_image="reg/unpack:1", image_pull_policy="Always")
    p = pod()
    p["spec"]["securityContext"] = {"runAsUser": 0}
    (init,) = webhook.injected_pod(p, _packed_manifest(), "t", cfg)["spec"]["initContainers"]
    assert (init["image"], init["imagePullPolicy"]) == ("reg/unpack:1", "Always")
    assert init["securityContext"]["runAsUser"] == webhook.UNPACK_UID  # never root, as PSA wants


def test_the_pod_sees_every_plan_file(tmp_path: Path) -> None:
    """Play the kubelet: project the init container's volume as the pod spec says, run its
    command, and find each plan file where the app container's env points."""
    manifests = _published()
    p = pod()
    spec = _merge(p, webhook.injected_pod(p, webhook.read_manifest(manifests[-1]), "t"))["spec"]
    (init,) = spec["initContainers"]
    read = read_configmaps(manifests[:-1])
    src, dst = tmp_path / "packed", tmp_path / "plan"
    (volume,) = [v for v in spec["volumes"] if v["name"] == webhook.PACKED_VOLUME]
    for source in volume["projected"]["sources"]:
        for item in source["configMap"]["items"]:
            data = read(item["key"])
            assert data is not None and item["key"] in _keys(manifests, source["configMap"]["name"])
            (src / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (src / item["path"]).write_bytes(data)
    argv = [{webhook.PACKED_DIR: str(src), webhook.MOUNT_DIR: str(dst)}.get(a, a) for a in init["command"][1:]]
    proc = subprocess.run([sys.executable, "-m", "ccltune", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for path, text in _plan_files().items():
        assert (dst / path).read_text() == text
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert (dst / Path(env["NCCL_CONF_FILE"]).relative_to(webhook.MOUNT_DIR)).is_file()
    assert (dst / Path(env["MSCCL_ALGO_DIR"]).relative_to(webhook.MOUNT_DIR) / "big.xml").is_file()


def _keys(manifests: list[dict], name: str) -> set[str]:
    cm = next(m for m in manifests if m["metadata"]["name"] == name)
    return {*cm.get("data", {}), *cm.get("binaryData", {})}


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
