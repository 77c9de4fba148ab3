"""What the report renderings cost: plan report.json -> report.md, SVG, PNG, report.html.

Run: .venv/bin/python benchmarks/report_render.py PLAN_DIR
(PLAN_DIR from `ccltune plan examples/ccltuning.yaml --cluster dgx-h100-2 --out PLAN_DIR`).
Prints a Markdown table: median of 5 renderings each, wall time, and the bytes produced.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ccltune.publish.html import render_html
from ccltune.publish.plots import png_plots, svg_plots
from ccltune.publish.report import Report, parse_report_json, render_md
from machine import cpu_model

REPEATS = 5


def _time(render: Callable[[], object]) -> tuple[float, object]:
    times, out = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        out = render()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _size(out: object) -> int:
    if isinstance(out, str):
        return len(out.encode())
    if isinstance(out, dict):
        return sum(len(v.encode()) if isinstance(v, str) else len(v) for v in out.values())
    raise TypeError(type(out))


def main(plan_dir: Path) -> None:
    report: Report = parse_report_json((plan_dir / "report.json").read_text())
    svgs = svg_plots(report)
    rows = [
        ("report.md", lambda: render_md(report)),
        (f"SVG plots ({len(svgs)})", lambda: svg_plots(report)),
        (f"PNG plots ({len(svgs)})", lambda: png_plots(report)),
        ("report.html (SVGs given)", lambda: render_html(report, svgs)),
    ]
    print(f"report of plan {report.plan} on {report.cluster}: {len(report.tasks)} tasks, "
          f"{sum(len(t.rows) for t in report.tasks)} rows; {cpu_model()}, median of {REPEATS}")  # fmt: skip
    print()
    print("| rendering | ms | bytes |")
    print("|---|---:|---:|")
    for name, render in rows:
        seconds, out = _time(render)
        print(f"| {name} | {seconds * 1e3:.0f} | {_size(out)} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
