"""ConfigMaps: under the size limit, content-addressed, pointer last, every file mapped once."""

import base64
import gzip
import json

import pytest
import yaml

from ccltune.api.plan import Plan
from ccltune.publish.configmaps import MAX_CONFIGMAP_BYTES, config_key, render_configmaps
from ccltune.publish.files import injection_env, plan_file, render_nccl_conf, with_files


def _plan(files: dict[str, str]) -> Plan:
    base = Plan(name="p", cluster="c", world_size=8, nodes=1, tasks=[])
    return with_files(base, [plan_file(path, text) for path, text in files.items()])


def _restore(manifests: list[dict]) -> dict[str, str]:
    """What a pod sees after the projected volume is mounted, from the pointer's manifest."""
    by_name = {m["metadata"]["name"]: m for m in manifests}
    pointer = manifests[-1]
    manifest = json.loads(pointer["data"]["manifest.json"])
    out = {}
    for item in manifest["items"]:
        cm = by_name[item["configMap"]]
        if item["key"] in cm.get("data", {}):
            out[item["path"]] = cm["data"][item["key"]]
        else:
            out[item["path"]] = gzip.decompress(
                base64.b64decode(cm["binaryData"][item["key"]])
            ).decode()
    return out


def test_large_plans_split_under_the_limit_and_restore_exactly() -> None:
    files = {f"msccl/allgather-{i}.xml": ("<algo/>" + "x" * 1000) * 300 for i in range(8)}
    files["nccl.conf"] = "NCCL_ALGO=ring\n"
    files["report.md"] = "# report\n" + "row\n" * 100_000
    plan = _plan(files)
    manifests = render_configmaps(plan, name="job-ccltune", namespace="ml")
    assert len(manifests) > 3
    for m in manifests:
        assert len(yaml.safe_dump(m).encode()) < 1024 * 1024
        size = sum(len(v.encode()) for v in m.get("data", {}).values())
        size += sum(len(v) for v in m.get("binaryData", {}).values())
        assert size <= MAX_CONFIGMAP_BYTES
    assert [m["metadata"]["labels"]["ccltune.io/role"] for m in manifests][-1] == "pointer"
    assert all(m.get("immutable") for m in manifests[:-1])
    assert manifests[-1]["metadata"]["name"] == "job-ccltune"
    assert _restore(manifests) == files
    assert "report.md.gz" in str(manifests)  # large reports are compressed


def test_same_files_same_generation() -> None:
    a = _plan({"nccl.conf": "A=1\n", "report.md": "r"})
    b = _plan({"report.md": "r", "nccl.conf": "A=1\n"})
    c = _plan({"nccl.conf": "A=2\n", "report.md": "r"})
    assert a.digest == b.digest != c.digest
    assert render_configmaps(a, name="x", namespace="n") == render_configmaps(
        b, name="x", namespace="n"
    )


def test_oversized_file_and_bad_paths_are_rejected() -> None:
    with pytest.raises(ValueError, match="over the ConfigMap limit"):
        render_configmaps(
            _plan({"msccl/big.xml": "x" * (MAX_CONFIGMAP_BYTES + 1)}), name="x", namespace="n"
        )
    with pytest.raises(ValueError, match="cannot be a ConfigMap key"):
        config_key("msccl/a b.xml")
    with pytest.raises(ValueError, match="share a path"):
        with_files(
            Plan(name="p", cluster="c", world_size=1, nodes=1, tasks=[]),
            [plan_file("a", "1"), plan_file("a", "2")],
        )


def test_nccl_conf_and_injection_env() -> None:
    text = render_nccl_conf(
        {"NCCL_PROTO": "allreduce:LL128", "NCCL_ALGO": "ring"}, "plan p\nline two"
    )
    assert text.splitlines() == [
        "# plan p",
        "# line two",
        "NCCL_ALGO=ring",
        "NCCL_PROTO=allreduce:LL128",
    ]
    plan = _plan(
        {"nccl.conf": text, "nccl-topo.xml": "<system/>", "msccl/a.xml": "<algo/>", "tuner.csv": ""}
    )
    env = injection_env(plan.files, "/etc/ccltune")
    assert env == {
        "NCCL_CONF_FILE": "/etc/ccltune/nccl.conf",
        "NCCL_TOPO_FILE": "/etc/ccltune/nccl-topo.xml",
        "MSCCL_ALGO_DIR": "/etc/ccltune/msccl",
        "NCCL_TUNER_CONFIG_FILE": "/etc/ccltune/tuner.csv",
    }
