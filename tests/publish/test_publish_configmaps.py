"""ConfigMaps: under the size limit (large files packed and split), content-addressed, pointer
last, every file mapped once and restored exactly."""

import json
import random

import pytest
import yaml

from ccltune.api.plan import Plan
from ccltune.publish import configmaps
from ccltune.publish.configmaps import MAX_CONFIGMAP_BYTES, config_key, render_configmaps
from ccltune.publish.files import injection_env, plan_file, render_nccl_conf, sha256, with_files
from ccltune.publish.unpack import read_configmaps, restore


def _plan(files: dict[str, str]) -> Plan:
    base = Plan(name="p", cluster="c", world_size=8, nodes=1, tasks=[])
    return with_files(base, [plan_file(path, text) for path, text in files.items()])


def _restore(manifests: list[dict]) -> dict[str, str]:
    """What the pod sees: the init container's restore from the pointer manifest's items."""
    items = json.loads(manifests[-1]["data"]["manifest.json"])["items"]
    return {p: b.decode() for p, b in restore(items, read_configmaps(manifests[:-1])).items()}


def _under_the_limit(manifests: list[dict]) -> None:
    for m in manifests:
        assert len(yaml.safe_dump(m).encode()) < 1024 * 1024
        size = sum(len(v.encode()) for v in m.get("data", {}).values())
        size += sum(len(v) for v in m.get("binaryData", {}).values())
        assert size <= MAX_CONFIGMAP_BYTES


def test_large_plans_split_under_the_limit_and_restore_exactly() -> None:
    files = {f"msccl/allgather-{i}.xml": ("<algo/>" + "x" * 1000) * 300 for i in range(8)}
    files["nccl.conf"] = "NCCL_ALGO=ring\n"
    files["report.md"] = "# report\n" + "row\n" * 100_000
    plan = _plan(files)
    manifests = render_configmaps(plan, name="job-ccltune", namespace="ml")
    assert len(manifests) > 3
    _under_the_limit(manifests)
    assert [m["metadata"]["labels"]["ccltune.io/role"] for m in manifests][-1] == "pointer"
    assert all(m.get("immutable") for m in manifests[:-1])
    assert manifests[-1]["metadata"]["name"] == "job-ccltune"
    assert _restore(manifests) == files
    items = {i["path"]: i for i in json.loads(manifests[-1]["data"]["manifest.json"])["items"]}
    # Large reports are compressed, said so explicitly, and restored to text by the pod.
    assert items["report.md"]["key"] == "report.md.gz"
    assert (items["report.md"]["packing"], items["report.md"]["part"], items["report.md"]["parts"]) == ("gzip", 0, 1)
    # Plain items: as before, plus the file's digest.
    assert items["nccl.conf"] == {"configMap": items["nccl.conf"]["configMap"], "key": "nccl.conf",
                                  "path": "nccl.conf", "sha256": sha256("NCCL_ALGO=ring\n")}


def test_same_files_same_generation() -> None:
    a = _plan({"nccl.conf": "A=1\n", "report.md": "r"})
    b = _plan({"report.md": "r", "nccl.conf": "A=1\n"})
    c = _plan({"nccl.conf": "A=2\n", "report.md": "r"})
    assert a.digest == b.digest != c.digest
    assert render_configmaps(a, name="x", namespace="n") == render_configmaps(
        b, name="x", namespace="n"
    )


def _schedule(seed: int, size: int) -> str:
    """MSCCL-like XML that compresses about as badly as real text can (random step offsets)."""
    rng = random.Random(seed)
    lines, length = ['<algo name="big" proto="Simple" ngpus="16">'], 0
    while length < size:
        lines.append(f'<step s="{rng.randrange(10**6)}" type="s" srcoff="{rng.randrange(10**9)}" '
                     f'dstoff="{rng.randrange(10**9)}" cnt="{rng.randrange(64)}"/>')
        length += len(lines[-1]) + 1
    return "\n".join(lines) + "\n</algo>\n"


def test_oversized_files_are_packed_split_and_restored() -> None:
    files = {
        "msccl/huge.xml": _schedule(1, 4 * MAX_CONFIGMAP_BYTES),  # gzip still > 1 ConfigMap: parts
        "msccl/large.xml": "<step/>\n" * 200_000,  # 1.6 MB that gzips into a single entry
        "msccl/small.xml": "<algo/>\n",
        "nccl.conf": "NCCL_ALGO=ring\n",
    }
    plan = _plan(files)
    manifests = render_configmaps(plan, name="job-ccltune", namespace="ml")
    _under_the_limit(manifests)
    assert _restore(manifests) == files
    items = json.loads(manifests[-1]["data"]["manifest.json"])["items"]
    huge = [i for i in items if i["path"] == "msccl/huge.xml"]
    assert len(huge) > 1
    assert [i["key"] for i in huge] == [f"msccl__huge.xml.gz.part{n:03d}" for n in range(len(huge))]
    assert [(i["part"], i["parts"], i["packing"]) for i in huge] == [(n, len(huge), "gzip") for n in range(len(huge))]
    by_path = {i["path"]: i for i in items}
    assert by_path["msccl/large.xml"]["key"] == "msccl__large.xml.gz"
    assert "packing" not in by_path["msccl/small.xml"]
    assert {i["sha256"] for i in huge} == {plan_file("x", files["msccl/huge.xml"]).digest}
    # Every entry is in the ConfigMap its item names, each key once.
    by_name = {m["metadata"]["name"]: m for m in manifests[:-1]}
    for i in items:
        cm = by_name[i["configMap"]]
        assert i["key"] in ({**cm.get("data", {}), **cm.get("binaryData", {})})
    assert sorted(i["key"] for i in items) == sorted(
        k for m in manifests[:-1] for k in [*m.get("data", {}), *m.get("binaryData", {})])
    # Deterministic: the same plan renders byte for byte the same (gzip mtime 0).
    again = render_configmaps(_plan(dict(reversed(files.items()))), name="job-ccltune", namespace="ml")
    assert yaml.safe_dump_all(again) == yaml.safe_dump_all(manifests)


def test_what_cannot_be_represented_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="cannot be a ConfigMap key"):
        config_key("msccl/a b.xml")
    with pytest.raises(ValueError, match="share a path"):
        with_files(
            Plan(name="p", cluster="c", world_size=1, nodes=1, tasks=[]),
            [plan_file("a", "1"), plan_file("a", "2")],
        )
    with pytest.raises(ValueError, match=r"share ConfigMap key msccl__a\.xml"):
        render_configmaps(_plan({"msccl/a.xml": "1", "msccl__a.xml": "2"}), name="x", namespace="n")
    packed = _plan({"msccl/b.xml": "x" * (MAX_CONFIGMAP_BYTES + 1)})
    render_configmaps(packed, name="x", namespace="n")
    monkeypatch.setattr(configmaps, "MAX_INDEX_BYTES", 100)
    with pytest.raises(ValueError, match="too many for the unpack init container"):
        render_configmaps(packed, name="x", namespace="n")
    monkeypatch.setattr(configmaps, "MAX_PLAN_BYTES", 1000)
    with pytest.raises(ValueError, match="bytes as stored, over the 1000"):
        render_configmaps(_plan({"a": "x" * 600, "b": "y" * 600}), name="x", namespace="n")


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
