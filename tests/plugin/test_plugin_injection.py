"""The webhook delivers the plugin: the init container copies it from the image into an emptyDir
the training containers mount read-only, and NCCL is pointed at it and at the table."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest

from ccltune.api.plan import Plan
from ccltune.controller import webhook
from ccltune.publish.configmaps import render_configmaps
from ccltune.publish.files import TUNER_PLUGIN_PATH, plan_file, with_files
from ccltune.tune.table import PLUGIN_LIBRARY, TABLE_FILE, TableRow, render_table

REPO = Path(__file__).resolve().parents[2]
TABLE = render_table([TableRow("allreduce", 0, 1023, 16, 2, "ring", "ll", 4)])


def _manifest(files: dict[str, str]) -> dict:
    plan = with_files(Plan(name="p", cluster="c", world_size=16, nodes=2, tasks=[]),
                      [plan_file(k, v) for k, v in files.items()])
    return webhook.read_manifest(render_configmaps(plan, name="t-ccltune", namespace="ml")[-1])


def _pod() -> dict:
    return {"metadata": {"name": "p", "labels": {"app": "llm"}},
            "spec": {"containers": [{"name": "train", "image": "x"}, {"name": "side", "image": "y"}]}}


def _merge(pod: dict, desired: dict) -> dict:
    out = copy.deepcopy(pod)
    out.setdefault("metadata", {}).setdefault("annotations", {}).update(desired["metadata"]["annotations"])
    out["spec"].update(desired["spec"])
    return json.loads(json.dumps(out))


PLAIN = {"nccl.conf": "NCCL_BUFFSIZE=1048576\n", TABLE_FILE: TABLE}
PACKED = {**PLAIN, "msccl/big.xml": "".join(f'<step s="{i}" srcoff="{i * 7919 % 1000003}"/>\n'
                                            for i in range(120_000))}


@pytest.mark.parametrize("files", [PLAIN, PACKED], ids=["plain", "packed"])
def test_plugin_is_copied_mounted_and_named(files, tmp_path) -> None:
    manifest = _manifest(files)
    once = _merge(_pod(), webhook.injected_pod(_pod(), manifest, "t"))
    spec = once["spec"]
    (init,) = spec["initContainers"]
    assert webhook.IMAGE_PLUGIN in init["command"] and TUNER_PLUGIN_PATH in init["command"]
    if "msccl/big.xml" in files:  # packed: unpack still runs, after the copy
        assert init["command"][:2] == ["sh", "-c"] and init["command"][6:8] == ["ccltune", "unpack"]
        # Run it with stand-ins: the copy happens, then the unpack command runs with its arguments.
        src, dst = tmp_path / "in.so", tmp_path / "out.so"
        src.write_bytes(b"ELF")
        stand_in = {webhook.IMAGE_PLUGIN: str(src), TUNER_PLUGIN_PATH: str(dst)}
        cmd = [stand_in.get(a, a) for a in init["command"][:6]] + ["echo", *init["command"][6:9]]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        assert dst.read_bytes() == b"ELF" and out.startswith("ccltune unpack --from")
    else:
        assert init["command"] == ["cp", webhook.IMAGE_PLUGIN, TUNER_PLUGIN_PATH]
    assert {"name": webhook.PLUGIN_VOLUME, "mountPath": "/var/run/ccltune/plugin"} in init["volumeMounts"]
    assert {"name": webhook.PLUGIN_VOLUME, "emptyDir": {}} in spec["volumes"]
    for c in spec["containers"]:
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["NCCL_TUNER_PLUGIN"] == f"/var/run/ccltune/plugin/{PLUGIN_LIBRARY}"
        assert env["CCLTUNE_TUNER_TABLE"] == f"{webhook.MOUNT_DIR}/{TABLE_FILE}"
        assert {"name": webhook.PLUGIN_VOLUME, "mountPath": "/var/run/ccltune/plugin", "readOnly": True} in c["volumeMounts"]
    assert webhook.changes(once, webhook.injected_pod(once, manifest, "t")) == {}  # idempotent
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", **once},
                                 kubernetes_validate.latest_version(), strict=True)


def test_plans_without_a_table_get_no_plugin() -> None:
    desired = webhook.injected_pod(_pod(), _manifest({"nccl.conf": "NCCL_BUFFSIZE=1048576\n"}), "t")
    assert "initContainers" not in desired["spec"]
    assert all(v["name"] != webhook.PLUGIN_VOLUME for v in desired["spec"]["volumes"])
    assert all("NCCL_TUNER_PLUGIN" not in {e["name"] for e in c.get("env", [])} for c in desired["spec"]["containers"])


def test_the_image_builds_the_plugin_where_the_webhook_copies_it_from() -> None:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    assert re.search(r"RUN make -C nccl-plugin OUT=(\S+)", text)
    out = re.search(r"RUN make -C nccl-plugin OUT=(\S+)", text).group(1)  # type: ignore[union-attr]
    assert f"COPY --from=plugin {out}/{PLUGIN_LIBRARY} {webhook.IMAGE_PLUGIN}" in text
    assert "!nccl-plugin/" in (REPO / ".dockerignore").read_text().splitlines()
