"""`ccltune unpack`: the init container restores every plan file from a kubelet-style projected
volume, atomically, and refuses a missing part or a wrong digest with one line."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ccltune.api.plan import Plan
from ccltune.publish.configmaps import MAX_CONFIGMAP_BYTES, render_configmaps
from ccltune.publish.files import plan_file, with_files
from ccltune.publish.unpack import (
    UnpackError,
    index_arg,
    parse_index,
    read_configmaps,
    restore,
    unpack,
)

FILES = {
    # Digits compress about 2x: three parts of gzip.
    "msccl/huge.xml": "".join(f"<s o=\"{(i * 7919) % 1000003}\"/>\n" for i in range(400_000)),
    "msccl/one.xml": "<step/>\n" * 150_000,  # one gzip entry
    "nccl.conf": "NCCL_ALGO=ring\n",
    "report.md": "# report\n" + "row\n" * 100_000,  # a compressed report comes back as text
}


@pytest.fixture(scope="module")
def published() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(content ConfigMaps, the pointer manifest's items)."""
    plan = with_files(Plan(name="p", cluster="c", world_size=16, nodes=2, tasks=[]),
                      [plan_file(p, t) for p, t in FILES.items()])  # fmt: skip
    manifests = render_configmaps(plan, name="job-ccltune", namespace="ml")
    items = json.loads(manifests[-1]["data"]["manifest.json"])["items"]
    assert max(i.get("parts", 1) for i in items) >= 3
    return manifests[:-1], items


def project(configmaps: list[dict[str, Any]], items: list[dict[str, Any]], to: Path) -> None:
    """Lay the entries out as the kubelet's atomic writer does: a timestamped directory, `..data`
    pointing at it, and a symlink per key."""
    read = read_configmaps(configmaps)
    stamp = to / "..2024_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for item in items:
        data = read(item["key"])
        assert data is not None
        (stamp / item["key"]).write_bytes(data)
        (to / item["key"]).symlink_to(Path("..data") / item["key"])
    (to / "..data").symlink_to(stamp.name)


def run_cli(src: Path, dst: Path, index: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ccltune", "unpack", "--from", str(src), "--to", str(dst),
                           "--items", index], capture_output=True, text=True, timeout=60)  # fmt: skip


def test_unpack_writes_every_file_exactly(published: Any, tmp_path: Path) -> None:
    configmaps, items = published
    src, dst = tmp_path / "packed", tmp_path / "plan"
    project(configmaps, items, src)
    assert sorted(unpack(parse_index(index_arg(items)), src, dst)) == sorted(FILES)
    for path, text in FILES.items():
        assert (dst / path).read_text() == text
        assert (dst / path).stat().st_mode & 0o777 == 0o444  # app containers read, nobody writes
    assert sorted(p.name for p in (dst / "msccl").iterdir()) == ["huge.xml", "one.xml"]  # no temp files
    # An init container restarted in the same pod overwrites what is there.
    (dst / "nccl.conf").chmod(0o644)
    (dst / "nccl.conf").write_text("stale\n")
    unpack(items, src, dst)
    assert (dst / "nccl.conf").read_text() == FILES["nccl.conf"]


def test_cli_restores_and_reports_in_one_line(published: Any, tmp_path: Path) -> None:
    configmaps, items = published
    src = tmp_path / "packed"
    project(configmaps, items, src)
    ok = run_cli(src, tmp_path / "plan", index_arg(items))
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "plan" / "msccl" / "huge.xml").read_text() == FILES["msccl/huge.xml"]

    part = next(i for i in items if i.get("part") == 1)
    os.unlink(src / part["key"])
    missing = run_cli(src, tmp_path / "again", index_arg(items))
    assert missing.returncode != 0
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in missing.stderr, missing.stderr
    assert f"msccl/huge.xml: part 1 of {part['parts']} ({part['key']}) is missing" in lines[0]
    assert not (tmp_path / "again" / "msccl" / "huge.xml").exists()

    bad = run_cli(src, tmp_path / "again", "not json")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1


def _broken(items: list[dict[str, Any]], where: str, **change: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(items)
    for item in out:
        if item["path"] == where:
            item.update(change)
    return out


def test_missing_parts_and_wrong_digests_are_refused(published: Any) -> None:
    configmaps, items = published
    read = read_configmaps(configmaps)
    assert restore(items, read) == {p: t.encode() for p, t in FILES.items()}
    huge = [i for i in items if i["path"] == "msccl/huge.xml"]

    n = len(huge)
    with pytest.raises(UnpackError, match=rf"msccl/huge\.xml: part 1 of {n} is missing from the index"):
        restore([i for i in items if i is not huge[1]], read)
    with pytest.raises(UnpackError, match=r"msccl/huge\.xml: sha256 .* does not match"):
        restore(_broken(items, "msccl/huge.xml", sha256="0" * 64), read)
    with pytest.raises(UnpackError, match=r"nccl\.conf: sha256 .* does not match"):
        restore(_broken(items, "nccl.conf", sha256="0" * 64), read)
    # Parts in the wrong order break the gzip stream (or its CRC) before the digest is reached.
    swapped = copy.deepcopy(items)
    for item in swapped:
        if item["path"] == "msccl/huge.xml" and item["part"] in (0, 1):
            item["part"] = 1 - item["part"]
    with pytest.raises(UnpackError, match=r"msccl/huge\.xml: packed data is corrupt"):
        restore(swapped, read)
    # A last part the index does not know about: truncated stream.
    short = _broken([i for i in items if i is not huge[-1]], "msccl/huge.xml", parts=n - 1)
    with pytest.raises(UnpackError, match="truncated"):
        restore(short, read)
    with pytest.raises(UnpackError, match="not a plain relative path"):
        restore(_broken(items, "nccl.conf", path="../etc/passwd"), read)
    with pytest.raises(UnpackError, match="unknown packing 'zstd'"):
        restore(_broken(items, "msccl/one.xml", packing="zstd"), read)
    with pytest.raises(UnpackError, match="needs string fields key and path"):
        parse_index('[{"key": 1}]')


def test_only_plain_entries_means_no_packing(tmp_path: Path) -> None:
    """A plan under the limit stays plain: the webhook keeps the projected volume (no unpack)."""
    plan = with_files(Plan(name="p", cluster="c", world_size=8, nodes=1, tasks=[]),
                      [plan_file("nccl.conf", "A=1\n"), plan_file("msccl/a.xml", "x" * MAX_CONFIGMAP_BYTES)])  # fmt: skip
    manifests = render_configmaps(plan, name="p", namespace="n")
    items = json.loads(manifests[-1]["data"]["manifest.json"])["items"]
    assert all(set(i) == {"configMap", "key", "path", "sha256"} for i in items)
    assert [m.get("binaryData") for m in manifests] == [None] * len(manifests)
