"""Plots of a report: busbw against message size per task, and speedup per task.

Pure functions from a Report to bytes. SVG output is byte-for-byte reproducible (fixed hash salt,
no date, text kept as text), because the SVGs are plan files and enter the plan digest.
"""

from __future__ import annotations

import io
import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Before the import: matplotlib warns on stderr about its font cache (building it, or a temporary
# directory when HOME is read-only); neither is the user's business.
logging.getLogger("matplotlib").setLevel(logging.ERROR)

import matplotlib  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ..api.common import format_size  # noqa: E402
from .report import (  # noqa: E402
    DEFAULT,
    SUMMARY_PLOT,
    SYNTHESIZED,
    TUNED,
    Report,
    ReportTask,
    Row,
    plot_path,
)

# Reproducible SVG: ids hashed with a fixed salt; text as <text> (no glyph paths from local fonts).
_RC: dict[Any, Any] = {
    "svg.hashsalt": "ccltune",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_SVG_METADATA = {"Date": None, "Creator": "ccltune"}
_PNG_DPI = 110

# Curve styles: NCCL grey, tuned blue, synthesized orange, the bound dashed black.
_STYLE = {  # (colour, marker, name)
    DEFAULT: ("#7f7f7f", "o", "NCCL default"),
    TUNED: ("#1f77b4", "s", "tuned NCCL"),
    SYNTHESIZED: ("#ff7f0e", "^", "synthesized MSCCL"),
}


# rcParams are process-global and the operator plans in threads (asyncio.to_thread): two plans
# rendering at once would restore each other's settings mid-render (and lose the hash salt).
_RC_LOCK = threading.Lock()


@contextmanager
def _reproducible() -> Iterator[None]:
    with _RC_LOCK, matplotlib.rc_context(_RC):
        yield


def _sources(values: list[str]) -> str:
    return "+".join(sorted(set(values)))


def _size_axis(ax: Axes, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    step = max(1, math.ceil(len(sizes) / 8))  # at most ~8 tick labels
    ticks = sizes[::step]
    ax.set_xticks(ticks, [format_size(s) for s in ticks])
    ax.minorticks_off()
    ax.set_xlabel("message size (bytes, log2)")


def _in_curve(row: Row, category: str) -> bool:
    """Synthesized rows make their own curve; tuned NCCL is every other chosen row, so the curve
    runs through sizes where NCCL's default was kept (and process-wide knobs may still help)."""
    return (row.category == SYNTHESIZED) == (category == SYNTHESIZED)


def _series(rows: list[Row], category: str) -> list[float]:
    return [r.busbw_gbps if _in_curve(r, category) else math.nan for r in rows]


def _has_curve(rows: list[Row], category: str) -> bool:
    if category == SYNTHESIZED:
        return any(r.category == SYNTHESIZED for r in rows)
    return any(r.category == TUNED or r.time_us != r.default_time_us
               for r in rows if r.category != SYNTHESIZED)  # fmt: skip


def task_figure(task: ReportTask) -> Figure:
    rows = task.rows
    sizes = [r.size for r in rows]
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.add_subplot()
    color, marker, name = _STYLE[DEFAULT]
    line = ax.plot(sizes, [r.default_busbw_gbps for r in rows], color=color, marker=marker,
                   linewidth=1.5, markersize=4,
                   label=f"{name} ({_sources([r.default_source for r in rows])})")  # fmt: skip
    line[0].set_gid(f"curve-{DEFAULT}")
    for category in (TUNED, SYNTHESIZED):
        if not _has_curve(rows, category):
            continue
        mine = [r for r in rows if _in_curve(r, category)]
        color, marker, name = _STYLE[category]
        line = ax.plot(sizes, _series(rows, category), color=color, marker=marker, linewidth=2.0,
                       markersize=5, label=f"{name} ({_sources([r.source for r in mine])})")  # fmt: skip
        line[0].set_gid(f"curve-{category}")
    bound = [math.nan if r.bound_busbw_gbps is None else r.bound_busbw_gbps for r in rows]
    if any(not math.isnan(b) for b in bound):
        line = ax.plot(sizes, bound, color="black", linestyle="--", linewidth=1.0,
                       label="lower bound (cost model)")  # fmt: skip
        line[0].set_gid("curve-bound")
    _size_axis(ax, sizes)
    ax.set_ylabel("busbw (GB/s, nccl-tests' definition)")
    ax.set_ylim(bottom=0)
    ax.set_title(task.title, loc="left")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0


def summary_figure(report: Report) -> Figure:
    # One legend line per task, below the axes: inside, it would hide the curves.
    fig = Figure(figsize=(7.0, 3.6 + 0.18 * len(report.tasks)), layout="constrained")
    ax = fig.add_subplot()
    all_sizes: set[int] = set()
    for index, task in enumerate(report.tasks):
        rows = task.rows
        speedups = [r.speedup for r in rows]
        all_sizes.update(r.size for r in rows)
        label = (f"{task.key.collective} · {task.key.role} · {task.key.ranks} ranks: "
                 f"geomean {_geomean(speedups):.2f}x ({_sources([r.source for r in rows])})")  # fmt: skip
        line = ax.plot([r.size for r in rows], speedups, marker="o", markersize=4, label=label)
        line[0].set_gid(f"speedup-{index + 1}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    if all_sizes:
        _size_axis(ax, sorted(all_sizes))
    ax.set_ylabel("speedup over NCCL's default (x)")
    ax.set_title(f"plan {report.plan} on {report.cluster}: ccltune's choice vs NCCL's default",
                 loc="left")  # fmt: skip
    fig.legend(loc="outside lower center", fontsize=8)
    return fig


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=_SVG_METADATA)
    return buf.getvalue()


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_PNG_DPI, metadata={"Software": None})
    return buf.getvalue()


def _figures(report: Report) -> Iterator[tuple[str, Figure]]:
    for index, task in enumerate(report.tasks):
        yield plot_path(index, task), task_figure(task)
    yield SUMMARY_PLOT, summary_figure(report)


def svg_plots(report: Report) -> dict[str, str]:
    """Plan-relative path -> SVG text, for every task and the summary."""
    with _reproducible():
        return {path: _svg(fig) for path, fig in _figures(report)}


def png_plots(report: Report) -> dict[str, bytes]:
    """The same plots as PNG (path ends in .png); binary, so never plan files."""
    with _reproducible():
        return {path.removesuffix(".svg") + ".png": _png(fig) for path, fig in _figures(report)}
