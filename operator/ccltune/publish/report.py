"""report.md and report.json: nccl-tests-style tables that say where every number came from."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..api.common import format_size
from ..api.plan import Plan, PlanTask

RUNTIME_LINE = {
    "nccl": "stock NCCL (no MSCCL: every row is NCCL's own choice or a tuner-table row)",
    "msccl": "msccl-executor-nccl (NCCL 2.23.4 base; MSCCL files from MSCCL_ALGO_DIR)",
    "rccl": "RCCL (MSCCL built in; RCCL_MSCCL_FORCE_ENABLE set when files are published)",
}


@dataclass(frozen=True)
class Row:
    size: int
    default_time_us: float
    default_busbw_gbps: float
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


def task_rows(task: PlanTask) -> list[Row]:
    rows = []
    for d, c in zip(task.default_estimates, task.chosen_estimates, strict=True):
        choice = c.choice or task.chosen
        bound_busbw = None if c.bound_us is None else c.busbw_gbps * c.time_us / c.bound_us
        rows.append(
            Row(
                size=d.size_bytes,
                default_time_us=round(d.time_us, 3),
                default_busbw_gbps=round(d.busbw_gbps, 3),
                time_us=round(c.time_us, 3),
                algbw_gbps=round(c.algbw_gbps, 3),
                busbw_gbps=round(c.busbw_gbps, 3),
                bound_busbw_gbps=None if bound_busbw is None else round(bound_busbw, 3),
                pct_of_bound=None if c.pct_of_bound is None else round(c.pct_of_bound, 1),
                speedup=round(d.time_us / c.time_us, 3),
                source=str(c.source),
                default_choice=(d.choice or task.default).describe(),
                choice=choice.describe(),
                realized_by=choice.realized_by or "NCCL default",
            )
        )
    return rows


def render_report_md(plan: Plan, topology_line: str) -> str:
    out = [
        f"# ccltune plan `{plan.name}`",
        "",
        f"Cluster `{plan.cluster}`: {topology_line}",
        "",
        "Times are per operation in microseconds; algbw = size / time; busbw = algbw x the",
        "nccl-tests factor of the collective, so numbers compare with nccl-tests output. The bound",
        "is ccltune's lower bound on time under the same cost model. Source says where each",
        "number came from (simulated: ccltune's event simulator; replayed: a measured table;",
        "measured: a live run). Realized by names what makes the runtime do the chosen row:",
        "NCCL's own choice, a row of the tuner table, an MSCCL file, or nccl.conf's process-wide",
        "settings (docs/runtimes.md).",
        "",
        f"Runtime: {RUNTIME_LINE.get(plan.runtime, plan.runtime)}.",
        "",
    ]
    for task in plan.tasks:
        key = task.key
        out += [
            f"## {key.collective} · {key.role} · {key.ranks} ranks on {key.nodes} node(s)",
            "",
            f"Size range {format_size(key.min_bytes)} to {format_size(key.max_bytes)}"
            + (f" · {task.trials} tuning trials" if task.trials else ""),
            "",
            "| size | NCCL default | default µs | default busbw | chosen | chosen µs | algbw GB/s "
            "| busbw GB/s | bound busbw | % of bound | speedup | source | realized by |",
            "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in task_rows(task):
            bound = "" if r.bound_busbw_gbps is None else f"{r.bound_busbw_gbps:.2f}"
            pct = "" if r.pct_of_bound is None else f"{r.pct_of_bound:.1f}%"
            out.append(
                f"| {format_size(r.size)} | {r.default_choice} | {r.default_time_us:.2f} "
                f"| {r.default_busbw_gbps:.2f} | {r.choice} | {r.time_us:.2f} | {r.algbw_gbps:.2f} | {r.busbw_gbps:.2f} | {bound} | {pct} "
                f"| {r.speedup:.2f}x | {r.source} | {r.realized_by} |"
            )
        for note in task.notes:
            out.append(f"\n> {note}")
        out.append("")
    if plan.env:
        out += [
            "## NCCL settings",
            "",
            "```",
            *[f"{k}={v}" for k, v in sorted(plan.env.items())],
            "```",
            "",
        ]
    if plan.notes:
        out += ["## Notes", "", *[f"- {n}" for n in plan.notes], ""]
    return "\n".join(out)


def render_report_json(plan: Plan, topology_line: str) -> str:
    body = {
        "plan": plan.name,
        "cluster": plan.cluster,
        "runtime": plan.runtime,
        "topology": topology_line,
        "worldSize": plan.world_size,
        "nodes": plan.nodes,
        "env": plan.env,
        "tasks": [
            {
                "key": task.key.wire(),
                "default": task.default.wire(),
                "chosen": task.chosen.wire(),
                "trials": task.trials,
                "notes": task.notes,
                "rows": [asdict(r) for r in task_rows(task)],
            }
            for task in plan.tasks
        ],
        "notes": plan.notes,
    }
    return json.dumps(body, indent=1, sort_keys=True) + "\n"
