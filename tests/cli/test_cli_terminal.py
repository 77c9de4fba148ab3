"""What a user sees in an 80-column terminal: every table fits, no solver banner unless -v; and
`ccltune report DIR` re-renders what `ccltune plan` wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .terminal import ROOT, SOLVER_BANNERS, Screen, run_in_terminal

EXAMPLE = ROOT / "examples" / "ccltuning.yaml"
WIDTH = 80


def _fits(screen: Screen) -> None:
    assert screen.status == 0, screen.text[-3000:]
    assert not screen.too_wide(WIDTH), "\n".join(screen.too_wide(WIDTH))
    shown = [b for b in SOLVER_BANNERS if b in screen.text]
    assert not shown, f"solver output on the terminal: {shown}"
    # Transient progress lines may shorten their description; results may not.
    cut = [line for line in screen.lines if "…" in line and "━" not in line]
    assert not cut, f"cut short: {cut}"


def test_plan_fits_80_columns_and_report_re_renders_it(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    screen = run_in_terminal("plan", EXAMPLE, "--cluster", "dgx-h100-2", "--out", out)
    _fits(screen)
    assert "busbw" in screen.text and "simulated" in screen.text
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    plots = sorted(p for p in written if p.startswith("plots/"))
    assert len(plots) == 2 * 4  # three tasks and the summary, as SVG and PNG
    assert "report.html" in written and "report.md" in written
    for p in [*plots, "report.md", "report.html"]:
        (out / p).unlink()
    again = run_in_terminal("report", out)
    _fits(again)
    rewritten = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert rewritten == written  # byte for byte, PNGs included


def test_report_of_a_directory_without_report_json_is_one_line(tmp_path: Path) -> None:
    screen = run_in_terminal("report", tmp_path)
    assert screen.status == 2
    lines = [line for line in screen.lines if line.strip()]
    assert len(lines) == 1 and "report.json: no such file" in lines[0]


def test_synthesize_is_quiet_unless_verbose(tmp_path: Path) -> None:
    args = ("synthesize", "--cluster", "dgx-h100-1", "--collective", "allgather",
            "--sizes", "1K:1M", "--out", tmp_path)  # fmt: skip
    _fits(run_in_terminal(*args))
    # The check can fail: -v lets HiGHS print its banner, on the same terminal.
    verbose = run_in_terminal("-v", *args)
    assert verbose.status == 0 and "Running HiGHS" in verbose.text


def test_tune_fits_80_columns_and_wide_has_the_detail() -> None:
    args = ("tune", "--cluster", "dgx-h100-2", "--collective", "allreduce,allgather",
            "--sizes", "64K:1G", "--budget", "12")  # fmt: skip
    screen = run_in_terminal(*args)
    _fits(screen)
    assert "allgather · world · 16 ranks" in screen.text and "--wide" in screen.text
    wide = run_in_terminal(*args, "--wide", columns=200)
    assert wide.status == 0 and "NCCL default" in wide.text and "…" not in wide.text


@pytest.mark.parametrize("args", [("topology", "--cluster", "dgx-h100-2"), ("presets",)])
def test_topology_and_presets_fit_80_columns(args: tuple[str, ...]) -> None:
    _fits(run_in_terminal(*args))


def test_a_plan_that_synthesizes_fits_80_columns_without_a_banner(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "apiVersion": "ccltune.io/v1alpha1", "kind": "CCLTuning", "metadata": {"name": "s"},
        "spec": {"collectives": [{"op": "allgather", "minBytes": "64K", "maxBytes": "16M"}],
                 "synthesis": {"enabled": True}, "publish": {"runtime": "msccl"}},
    }))  # fmt: skip
    out = tmp_path / "plan"
    screen = run_in_terminal("plan", spec, "--cluster", "dgx-h100-1", "--out", out)
    _fits(screen)
    assert "msccl#1 = msccl/" in screen.text  # long labels in the legend, not the table
    svg = (out / "plots" / "01-allgather-world-8r1n.svg").read_text()
    assert 'id="curve-synthesized"' in svg and "synthesized MSCCL (simulated)" in svg
