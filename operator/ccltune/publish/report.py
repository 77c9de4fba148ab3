"""report.json and report.md: nccl-tests-style tables that say where every number came from.

report.json is the source of every rendering (report.md, report.html, plots): `ccltune report DIR`
re-renders them from it without re-planning.
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from pydantic import ValidationError

from ..api.common import format_size
from ..api.errors import InputError, InternalError
from ..api.plan import Estimate, Plan, PlanTask, TaskKey

RUNTIME_LINE = {
    "nccl": "stock NCCL (no MSCCL: every row is NCCL's own choice or a tuner-table row)",
    "msccl": "msccl-executor-nccl (NCCL 2.23.4 base; MSCCL files from MSCCL_ALGO_DIR)",
    "rccl": "RCCL (MSCCL built in; RCCL_MSCCL_FORCE_ENABLE set when files are published)",
}

# What a chosen row is, for plots and legends: NCCL's own choice, tuned NCCL, or an MSCCL file.
DEFAULT, TUNED, SYNTHESIZED = "default", "tuned", "synthesized"


@dataclass(frozen=True)
class Row:
    size: int
    default_time_us: float
    default_busbw_gbps: float
    default_source: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    bound_busbw_gbps: float | None
    pct_of_bound: float | None
    speedup: float
    source: str
    default_choice: str
    choice: str
    realized_by: str  # what makes the runtime do it: NCCL default, tuner row N, msccl/<file>
    category: str  # DEFAULT, TUNED or SYNTHESIZED
    evaluator: str = ""  # the one model (or table) that timed both sides of the speedup


class ReportBug(InternalError):
    """A row the plan should never have produced (two evaluators, or faster than its bound)."""


# Relative slack for float rounding when a time is compared with its bound.
_BOUND_SLACK = 1e-9


def _evaluator(e: Estimate) -> str:
    return e.evaluator or str(e.source)


def _check_row(task: PlanTask, d: Estimate, c: Estimate) -> None:
    """Both sides from one evaluator, both carrying a bound and neither beating it."""
    where = f"{task.key.label()} at {format_size(c.size_bytes)}"
    if _evaluator(d) != _evaluator(c):
        raise ReportBug(f"{where}: the speedup would divide {_evaluator(d)} by {_evaluator(c)}")
    for side, e in (("default", d), ("chosen", c)):
        if e.bound_us is None:
            raise ReportBug(f"{where}: the {side} row carries no bound")
        if e.time_us < e.bound_us * (1 - _BOUND_SLACK):
            raise ReportBug(f"{where}: the {side} row takes {e.time_us:.3f} us, below its bound "
                            f"{e.bound_us:.3f} us (busbw above the physical limit)")  # fmt: skip


def _category(kind: str, realized_by: str) -> str:
    if kind == "msccl" or realized_by.startswith("msccl/"):
        return SYNTHESIZED
    return DEFAULT if realized_by == "NCCL default" else TUNED


def task_rows(task: PlanTask) -> list[Row]:
    rows = []
    for d, c in zip(task.default_estimates, task.chosen_estimates, strict=True):
        _check_row(task, d, c)
        choice = c.choice or task.chosen
        bound_busbw = None if c.bound_us is None else c.busbw_gbps * c.time_us / c.bound_us
        realized_by = choice.realized_by or "NCCL default"
        rows.append(
            Row(
                size=d.size_bytes,
                default_time_us=d.time_us,  # unrounded: speedup == default / chosen exactly
                default_busbw_gbps=round(d.busbw_gbps, 3),
                default_source=str(d.source),
                time_us=c.time_us,
                algbw_gbps=round(c.algbw_gbps, 3),
                busbw_gbps=round(c.busbw_gbps, 3),
                bound_busbw_gbps=None if bound_busbw is None else round(bound_busbw, 3),
                pct_of_bound=None if c.pct_of_bound is None else round(c.pct_of_bound, 1),
                speedup=d.time_us / c.time_us,
                source=str(c.source),
                default_choice=(d.choice or task.default).describe(),
                choice=choice.describe(),
                realized_by=realized_by,
                category=_category(choice.kind, realized_by),
                evaluator=_evaluator(c),
            )
        )
    return rows


@dataclass(frozen=True)
class ReportTask:
    key: TaskKey
    default: dict[str, Any]  # Choice.wire()
    chosen: dict[str, Any]
    trials: int | None
    notes: list[str]
    rows: list[Row]

    @property
    def title(self) -> str:
        k = self.key
        return f"{k.collective} · {k.role} · {k.ranks} ranks on {k.nodes} node(s)"

    @property
    def slug(self) -> str:
        """A file-name stem unique within a plan once prefixed by the task's index."""
        k = self.key
        return f"{k.collective}-{k.role}-{k.ranks}r{k.nodes}n"


@dataclass(frozen=True)
class Report:
    plan: str
    cluster: str
    runtime: str
    topology: str
    world_size: int
    nodes: int
    env: dict[str, str]
    tasks: list[ReportTask]
    notes: list[str]


def build_report(plan: Plan, topology_line: str) -> Report:
    return Report(
        plan=plan.name, cluster=plan.cluster, runtime=plan.runtime, topology=topology_line,
        world_size=plan.world_size, nodes=plan.nodes, env=dict(plan.env), notes=list(plan.notes),
        tasks=[ReportTask(key=t.key, default=t.default.wire(), chosen=t.chosen.wire(),
                          trials=t.trials, notes=list(t.notes), rows=task_rows(t))
               for t in plan.tasks],
    )  # fmt: skip


def report_json(report: Report) -> str:
    body = {
        "plan": report.plan,
        "cluster": report.cluster,
        "runtime": report.runtime,
        "topology": report.topology,
        "worldSize": report.world_size,
        "nodes": report.nodes,
        "env": report.env,
        "tasks": [
            {"key": t.key.wire(), "default": t.default, "chosen": t.chosen, "trials": t.trials,
             "notes": t.notes, "rows": [asdict(r) for r in t.rows]}
            for t in report.tasks
        ],
        "notes": report.notes,
    }  # fmt: skip
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


_ROW_FIELDS = {f.name for f in fields(Row)}
_ROW_REQUIRED = {f.name for f in fields(Row) if f.default is MISSING}


def parse_report_json(text: str, where: str = "report.json") -> Report:
    """A Report from report.json; InputError naming the field for anything malformed."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    path = where
    try:
        tasks = []
        for i, t in enumerate(body["tasks"]):
            path = f"{where}: tasks[{i}]"
            rows = []
            for j, r in enumerate(t["rows"]):
                path = f"{where}: tasks[{i}].rows[{j}]"
                missing = sorted(_ROW_REQUIRED - set(r))
                if missing:
                    raise KeyError(", ".join(missing))
                rows.append(Row(**{k: r[k] for k in _ROW_FIELDS if k in r}))
            path = f"{where}: tasks[{i}].key"
            tasks.append(ReportTask(key=TaskKey.model_validate(t["key"]), default=t["default"],
                                    chosen=t["chosen"], trials=t.get("trials"),
                                    notes=list(t.get("notes") or []), rows=rows))  # fmt: skip
        path = where
        return Report(
            plan=str(body["plan"]), cluster=str(body["cluster"]), runtime=str(body["runtime"]),
            topology=str(body["topology"]), world_size=int(body["worldSize"]),
            nodes=int(body["nodes"]), env=dict(body.get("env") or {}), tasks=tasks,
            notes=list(body.get("notes") or []),
        )  # fmt: skip
    except KeyError as exc:
        raise InputError(f"{path}: missing field {exc.args[0]}") from None
    except (TypeError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise InputError(f"{path}: malformed ({first})") from None


# Characters Markdown (CommonMark + GFM tables) gives a meaning to inside a table cell.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~!&])")


def md_cell(text: str) -> str:
    """A table cell that renders as the literal text: no column break, emphasis, link or HTML."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(text.split()))


def schedule_tags(task: ReportTask) -> dict[str, str]:
    """Synthesized schedules' labels are long: tables name them `msccl#N`, a legend follows."""
    tags: dict[str, str] = {}
    for r in task.rows:
        if r.category == SYNTHESIZED:
            tags.setdefault(r.realized_by, f"msccl#{len(tags) + 1}")
    return tags


PLOTS_DIR = "plots"
SUMMARY_PLOT = f"{PLOTS_DIR}/speedup.svg"


def plot_path(index: int, task: ReportTask) -> str:
    return f"{PLOTS_DIR}/{index + 1:02d}-{task.slug}.svg"

INTRO = [
    "Times are per operation in microseconds; algbw = size / time; busbw = algbw x the",
    "nccl-tests factor of the collective, so numbers compare with nccl-tests output. The bound",
    "is ccltune's lower bound on time under the same cost model. Source says where each",
    "number came from (simulated: ccltune's event simulator; replayed: a measured table;",
    "measured: a live run). Realized by names what makes the runtime do the chosen row:",
    "NCCL's own choice, a row of the tuner table, an MSCCL file, or nccl.conf's process-wide",
    "settings (docs/runtimes.md). Both sides of every speedup are timed by one evaluator,",
    "named in the source column (docs/cost-model.md, \"One evaluator\").",
]

TABLE_HEADER = ["size", "NCCL default", "default µs", "default busbw", "chosen", "chosen µs",
                "algbw GB/s", "busbw GB/s", "bound busbw", "% of bound", "speedup", "source",
                "realized by"]  # fmt: skip
TABLE_ALIGN = ["---:", "---", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:",
               "---:", "---", "---"]  # fmt: skip


def table_cells(task: ReportTask) -> list[list[str]]:
    """One list of plain-text cells per row, in TABLE_HEADER order (Markdown and HTML share it)."""
    tags = schedule_tags(task)
    out = []
    for r in task.rows:
        tag = tags.get(r.realized_by)
        out.append([
            format_size(r.size), r.default_choice, f"{r.default_time_us:.2f}",
            f"{r.default_busbw_gbps:.2f}", tag or r.choice, f"{r.time_us:.2f}",
            f"{r.algbw_gbps:.2f}", f"{r.busbw_gbps:.2f}",
            "" if r.bound_busbw_gbps is None else f"{r.bound_busbw_gbps:.2f}",
            "" if r.pct_of_bound is None else f"{r.pct_of_bound:.1f}%",
            f"{r.speedup:.2f}x",
            _source_cell(r),
            r.realized_by,
        ])  # fmt: skip
    return out


def _source_cell(r: Row) -> str:
    src = r.source if r.source == r.default_source else f"{r.source} (default: {r.default_source})"
    return f"{src} ({r.evaluator})" if r.evaluator and r.evaluator != r.source else src


def legend_lines(task: ReportTask) -> list[tuple[str, str, str]]:
    """(tag, file, full label) for every synthesized schedule a task's table names by tag."""
    labels = {r.realized_by: r.choice for r in task.rows if r.category == SYNTHESIZED}
    return [(tag, path, labels[path]) for path, tag in schedule_tags(task).items()]


def render_md(report: Report) -> str:
    out = [
        f"# ccltune plan `{md_cell(report.plan)}`",
        "",
        f"Cluster `{report.cluster}`: {md_cell(report.topology)}",
        "",
        *INTRO,
        "",
        f"Runtime: {RUNTIME_LINE.get(report.runtime, report.runtime)}.",
        "",
        f"![speedup over NCCL's default per task]({SUMMARY_PLOT})",
        "",
    ]
    for index, task in enumerate(report.tasks):
        key = task.key
        out += [
            f"## {task.title}",
            "",
            f"Size range {format_size(key.min_bytes)} to {format_size(key.max_bytes)}"
            + (f" · {task.trials} tuning trials" if task.trials else ""),
            "",
            f"![busbw against message size: {md_cell(task.title)}]({plot_path(index, task)})",
            "",
            "| " + " | ".join(TABLE_HEADER) + " |",
            "|" + "|".join(TABLE_ALIGN) + "|",
            *("| " + " | ".join(md_cell(c) for c in cells) + " |" for cells in table_cells(task)),
        ]
        legend = legend_lines(task)
        if legend:
            out += ["", *(f"- **{tag}** = `{path}`: {md_cell(label)}" for tag, path, label in legend)]
        for note in task.notes:
            out += ["", f"> {md_cell(note)}"]
        out.append("")
    if report.env:
        out += ["## NCCL settings", "", "```",
                *[f"{k}={v}" for k, v in sorted(report.env.items())], "```", ""]  # fmt: skip
    if report.notes:
        out += ["## Notes", "", *[f"- {md_cell(n)}" for n in report.notes], ""]
    return "\n".join(out)


def render_report_md(plan: Plan, topology_line: str) -> str:
    return render_md(build_report(plan, topology_line))


def render_report_json(plan: Plan, topology_line: str) -> str:
    return report_json(build_report(plan, topology_line))
