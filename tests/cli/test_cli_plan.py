"""`ccltune plan` end to end, as a user runs it: files, manifests, reports, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ccltuning.yaml"


def ccltune(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("CCLTUNE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "ccltune", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=env,
        timeout=600,
    )


def test_plan_on_a_preset_writes_files_manifests_and_reports(tmp_path: Path) -> None:
    # The example targets msccl-executor-nccl; on stock NCCL the same spec plans without MSCCL.
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["publish"]["runtime"] = "nccl"
    spec = tmp_path / "ccltuning-nccl.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "plan"
    result = ccltune("plan", spec, "--cluster", "dgx-h100-2", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "simulated" in result.stdout and "busbw" in result.stdout
    assert "runtime stock NCCL" in result.stdout and " via" in result.stdout
    for name in (
        "nccl.conf",
        "report.md",
        "report.json",
        "manifests/configmaps.yaml",
    ):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    assert report["worldSize"] == 16 and len(report["tasks"]) == 3
    assert report["runtime"] == "nccl" and not (out / "msccl").exists()
    for task in report["tasks"]:
        assert task["rows"], task["key"]
        for row in task["rows"]:
            assert row["source"] == "simulated"
            assert not row["realized_by"].startswith("msccl/")  # stock NCCL runs no MSCCL file
            assert row["busbw_gbps"] > 0 and 0 < row["pct_of_bound"] <= 100.0 + 1e-9
    manifests = list(yaml.safe_load_all((out / "manifests" / "configmaps.yaml").read_text()))
    assert manifests[-1]["metadata"]["name"] == "llama-pretrain-ccltune"
    assert all(m["metadata"]["namespace"] == "default" for m in manifests)


def _spec(tmp_path: Path, spec: object, text: str | None = None) -> Path:
    path = tmp_path / "spec.yaml"
    doc = {
        "apiVersion": "ccltune.io/v1alpha1",
        "kind": "CCLTuning",
        "metadata": {"name": "t"},
        "spec": spec,
    }
    path.write_text(text if text is not None else yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("spec", "text", "cluster", "expected"),
    [
        (None, "kind: CCLTuning\nspec: [unclosed\n", "dgx-h100-1", "malformed YAML at line"),
        ({"collectives": [{"op": "allreduce"}]}, None, "no-such-preset", "no-such-preset"),
        (
            {"collectives": [{"op": "allreduce", "minBytes": "0"}]},
            None,
            "dgx-h100-1",
            "spec.collectives[0]",
        ),
        (
            {"collectives": [{"op": "allreduce", "minBytes": "-4K"}]},
            None,
            "dgx-h100-1",
            "spec.collectives[0].minBytes",
        ),
        ({"collectives": [{"op": "allfoo"}]}, None, "dgx-h100-1", "spec.collectives[0].op"),
        (
            {"collectives": [{"op": "allreduce", "ranks": 64}]},
            None,
            "dgx-h100-1",
            "spec.collectives[0]",
        ),
        (None, "kind: Deployment\n", "dgx-h100-1", "no document with kind: CCLTuning"),
        (
            {"collectives": [{"op": "allreduce"}],
             "publish": {"runtime": "msccl", "ncclVersion": "2.24"}},
            None,
            "dgx-h100-1",
            "spec.publish.ncclVersion: 2.24 contradicts runtime msccl",
        ),
        (
            {"collectives": [{"op": "allreduce"}], "publish": {"runtime": "rccl"}},
            None,
            "dgx-h100-1",
            "spec.publish.runtime: rccl runs on AMD GPUs",
        ),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_non_zero(
    tmp_path: Path, spec: object, text: str | None, cluster: str, expected: str
) -> None:
    result = ccltune(
        "plan", _spec(tmp_path, spec, text), "--cluster", cluster, "--out", tmp_path / "o"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0] and "Traceback" not in result.stderr


def test_inconsistent_cluster_file_names_the_node(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {
                "name": "bad",
                "gpusPerNode": 8,
                "nodes": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 4}],
            }
        )
    )
    result = ccltune("plan", EXAMPLE, "--cluster", cluster, "--out", tmp_path / "o")
    assert result.returncode == 2
    assert "'b'" in result.stderr and "Traceback" not in result.stderr


def test_missing_spec_file(tmp_path: Path) -> None:
    result = ccltune("plan", tmp_path / "nope.yaml", "--cluster", "dgx-h100-1")
    assert result.returncode == 2 and "no such file" in result.stderr
