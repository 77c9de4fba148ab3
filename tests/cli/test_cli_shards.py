"""`plan --workers` and `solve-shard`: bad input exits 2 with one line naming the option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from ccltune import cli
from ccltune.cli import plan as plan_cli
from ccltune.cli import solve_shard as solve_shard_cli

from .test_cli_errors import small_spec, write_spec


def run(*args: str | Path, env: dict[str, str] | None = None) -> Any:
    a = typer.Typer()
    a.callback()(cli._root)
    plan_cli.register(a)
    solve_shard_cli.register(a)
    return CliRunner().invoke(a, [str(x) for x in args], env={"CCLTUNE_DEBUG": "", **(env or {})})


def test_plan_workers_must_be_positive(tmp_path: Path) -> None:
    res = run("plan", write_spec(tmp_path, small_spec()), "--cluster", "dgx-h100-1", "--workers", "0",
              "--out", tmp_path / "out")  # fmt: skip
    assert res.exit_code == 2
    assert res.stderr.strip() == "error: --workers 0: give at least 1"
    assert not (tmp_path / "out").exists()


def test_solve_shard_outside_an_indexed_job_needs_an_index() -> None:
    res = run("solve-shard", "--namespace", "ns", "--input", "in", "--output", "out",
              env={"JOB_COMPLETION_INDEX": ""})  # fmt: skip
    assert res.exit_code == 2
    assert "JOB_COMPLETION_INDEX" in res.stderr and "--index" in res.stderr
