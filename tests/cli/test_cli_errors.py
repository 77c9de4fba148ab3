"""Errors by who must act: bad input exits 2 naming every field, a bug of ours exits 3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from ccltune import cli
from ccltune.cli import plan as plan_cli
from ccltune.cli import topology as topology_cli

GV = "ccltune.io/v1alpha1"

# Three GPUs per server: a shape NCCL runs, at a cost the plan must state.
THREE_GPU_CLUSTER: dict[str, Any] = {
    "kind": "ClusterSpec",
    "name": "three-gpu",
    "gpuModel": "H100-SXM5-80GB",
    "servers": 2,
    "gpusPerServer": 3,
    "intraNode": {"fabric": "nvswitch", "bandwidthGbps": 450, "latencyUs": 0.6},
    "nics": {"perServer": 3, "rateGbps": 400, "linkLayer": "InfiniBand"},
    "network": {"layout": "rail", "tiers": [{"name": "rail", "size": 2}]},
}


def app() -> typer.Typer:
    a = typer.Typer()
    a.callback()(cli._root)
    plan_cli.register(a)
    topology_cli.register(a)
    return a


def run(*args: str | Path) -> Any:
    return CliRunner().invoke(app(), [str(a) for a in args], env={"CCLTUNE_DEBUG": ""})


def write_spec(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "tuning.yaml"
    doc = {"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": "t"}, "spec": spec}
    path.write_text(yaml.safe_dump(doc))
    return path


def small_spec() -> dict[str, Any]:
    return {"collectives": [{"op": "allreduce", "minBytes": "1K", "maxBytes": "64K"}],
            "synthesis": {"enabled": False}, "tuning": {"enabled": False}}  # fmt: skip


def stderr_lines(result: Any) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_a_typo_suggests_the_field_the_user_meant(tmp_path: Path) -> None:
    spec = small_spec()
    spec["collectives"][0]["minByte"] = spec["collectives"][0].pop("minBytes")
    result = run("plan", write_spec(tmp_path, spec), "--cluster", "dgx-h100-1", "--out", tmp_path / "o")
    assert result.exit_code == 2, result.output
    lines = stderr_lines(result)
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "spec.collectives[0].minByte: unknown field (did you mean minBytes?)" in lines[0]
    assert not (tmp_path / "o").exists()


def test_every_problem_of_a_spec_is_named(tmp_path: Path) -> None:
    spec = small_spec()
    spec["collectives"][0]["minByte"] = "1K"  # unknown field
    spec["collectives"][0]["maxBytes"] = "lots"  # not a size
    spec["publsh"] = {}  # unknown field, at the top
    result = run("plan", write_spec(tmp_path, spec), "--cluster", "dgx-h100-1", "--out", tmp_path / "o")
    assert result.exit_code == 2, result.output
    lines = stderr_lines(result)
    assert lines[0].startswith("error: 3 problems, the first: spec.")
    assert "more)" not in result.stderr
    listed = lines[1:]
    assert len(listed) == 3
    assert any("spec.collectives[0].minByte: unknown field (did you mean minBytes?)" in x for x in listed)
    assert any("spec.collectives[0].maxBytes: 'lots' is not a positive size" in x for x in listed)
    assert any("spec.publsh: unknown field (did you mean publish?)" in x for x in listed)


def test_every_problem_of_a_cluster_file_is_named_with_its_line(tmp_path: Path) -> None:
    cluster = {**THREE_GPU_CLUSTER, "gpusPerServr": 4,
               "intraNode": {**THREE_GPU_CLUSTER["intraNode"], "latencyUs": -1}}  # fmt: skip
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    result = run("topology", "--cluster", path)
    assert result.exit_code == 2, result.output
    lines = stderr_lines(result)
    assert lines[0].startswith("error: 2 problems, the first: ")
    text = "\n".join(lines[1:])
    assert f"{path}:" in text and "intraNode.latencyUs" in text
    assert "gpusPerServr: unknown field (did you mean gpusPerServer?)" in text


def test_a_bug_inside_the_planner_is_not_blamed_on_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("operands could not be broadcast together")  # e.g. numpy, deep inside

    monkeypatch.setattr(plan_cli, "build_plan", broken)
    spec = write_spec(tmp_path, small_spec())
    result = run("plan", spec, "--cluster", "dgx-h100-1", "--out", tmp_path / "o")
    assert result.exit_code == 3, result.output
    lines = stderr_lines(result)
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "internal error (a ccltune bug): ValueError: operands could not" in lines[0]
    assert "report it" in lines[0] and "-v" in lines[0]
    verbose = run("-v", "plan", spec, "--cluster", "dgx-h100-1", "--out", tmp_path / "o")
    assert verbose.exit_code == 3
    assert "Traceback" in verbose.stderr and "in broken" in verbose.stderr


def test_three_gpus_per_node_plans_with_a_warning_that_says_the_cost(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(THREE_GPU_CLUSTER, sort_keys=False))
    shown = run("topology", "--cluster", cluster)
    assert shown.exit_code == 0, shown.output
    assert "warning: cluster three-gpu: 3 GPUs per node is not a power of two" in " ".join(shown.stdout.split())
    out = tmp_path / "plan"
    result = run("plan", write_spec(tmp_path, small_spec()), "--cluster", cluster, "--out", out)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert flat.count("3 GPUs per node is not a power of two") == 1  # said once, not again as a note
    assert "NCCL's own algorithms run" in flat
    notes = json.loads((out / "report.json").read_text())["notes"]
    assert any("3 GPUs per node is not a power of two" in n for n in notes)


def test_a_power_of_two_cluster_plans_without_a_warning(tmp_path: Path) -> None:
    result = run("plan", write_spec(tmp_path, small_spec()), "--cluster", "dgx-h100-1",
                 "--out", tmp_path / "o")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.stdout
