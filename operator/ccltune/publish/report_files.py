"""Which report renderings a plan publishes, and which only land on disk (docs/report.md).

Published (plan files, so the report ConfigMaps carry them): report.md, report.json and the SVG
plots, all text and deterministic. Local only (`ccltune plan --out`, `ccltune report`):
report.html, which repeats every SVG inline, and the PNGs, which are binary.
"""

from __future__ import annotations

from ..api.plan import Plan, PlanFile
from .files import REPORT_JSON, REPORT_MD, plan_file
from .html import render_html
from .plots import png_plots, svg_plots
from .report import PLOTS_DIR, Report, build_report, render_md, report_json

REPORT_HTML = "report.html"


def published_report_files(plan: Plan, topology_line: str) -> list[PlanFile]:
    report = build_report(plan, topology_line)
    return [
        plan_file(REPORT_MD, render_md(report)),
        plan_file(REPORT_JSON, report_json(report)),
        *(plan_file(path, svg) for path, svg in svg_plots(report).items()),
    ]


def published_svgs(plan: Plan) -> dict[str, str]:
    return {f.path: f.content for f in plan.files if f.path.startswith(PLOTS_DIR + "/")}


def local_report_files(report: Report, svgs: dict[str, str]) -> dict[str, bytes]:
    """report.html (around the given SVGs) and the PNG plots, by plan-relative path."""
    return {REPORT_HTML: render_html(report, svgs).encode(), **png_plots(report)}


def all_report_files(report: Report) -> dict[str, bytes]:
    """Every rendering of a report, published and local, by plan-relative path."""
    svgs = svg_plots(report)
    return {
        REPORT_MD: render_md(report).encode(),
        **{path: svg.encode() for path, svg in svgs.items()},
        **local_report_files(report, svgs),
    }
