"""`ccltune report DIR`: re-render report.md, report.html and the plots from DIR/report.json."""

from __future__ import annotations

from pathlib import Path

import typer

from ..api.errors import InputError
from ..publish.files import REPORT_JSON
from ..publish.report import Report, parse_report_json
from ..publish.report_files import all_report_files
from .common import console, user_errors


def write_report_files(out: Path, report: Report) -> list[str]:
    """Write every rendering next to report.json; the paths written, relative to out."""
    files = all_report_files(report)
    for path, content in files.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return sorted(files)


def report(
    plan_dir: Path = typer.Argument(..., help="A plan directory (`ccltune plan --out`)."),
) -> None:
    """Re-render report.md, report.html and the plots (SVG, PNG) from a plan's report.json."""
    with user_errors():
        source = plan_dir / REPORT_JSON
        if not source.is_file():
            raise InputError(f"{source}: no such file (give the directory `ccltune plan --out` wrote)")
        written = write_report_files(plan_dir, parse_report_json(source.read_text(), str(source)))
    plots = sum(1 for p in written if p.startswith("plots/"))
    console.print(f"wrote {plan_dir}/ (report.md, report.html, {plots} plot files)", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
