"""`ccltune plan`: the whole pipeline offline — no cluster, no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from ..api.ccltuning import CCLTuningSpec
from ..api.common import format_size
from ..api.plan import PlanFile, PlanTask
from ..pipeline import build_plan
from ..publish.configmaps import pointer_name, render_configmaps
from ..publish.report import RUNTIME_LINE, build_report, task_rows
from ..publish.report_files import local_report_files, published_svgs
from ..topology.export import describe
from ..topology.load import load_cluster
from ..topology.shape_warnings import shape_warnings
from ..workload import preflight
from .common import ccltuning_document, console, fail, size_table, user_errors


def plan(
    spec_file: Path = typer.Argument(..., help="A CCLTuning manifest (YAML)."),
    cluster: str = typer.Option(
        ...,
        "--cluster",
        "-c",
        help="A preset name (see `ccltune presets`) or a cluster/ASTRA-sim YAML file.",
    ),
    out: Path = typer.Option(
        Path("ccltune-plan"), "--out", "-o", help="Directory for files, manifests and reports."
    ),
    namespace: str = typer.Option(
        "default", help="Namespace written into the ConfigMap manifests."
    ),
    profiles: Path | None = typer.Option(
        None, "--profiles", help="Tune on measured profiles: a directory of NCCL sweep CSVs and nccl-tests logs."
    ),
    workers: int = typer.Option(
        1, "--workers", help="Processes for the tasks' syntheses (one task per process at a time)."
    ),
) -> None:
    """Plan a CCLTuning for a cluster: topology, NCCL settings, schedules and a report."""
    with user_errors():
        if workers < 1:
            fail(f"--workers {workers}: give at least 1")
        doc = ccltuning_document(spec_file)
        name = str((doc.get("metadata") or {}).get("name") or spec_file.stem)
        namespace = str((doc.get("metadata") or {}).get("namespace") or namespace)
    with user_errors("spec"):
        spec = CCLTuningSpec.model_validate(doc.get("spec") or {})
    with user_errors():
        topo = load_cluster(cluster)
        console.print(f"[bold]cluster[/] {topo.name}: {describe(topo)}", highlight=False)
        warned = shape_warnings(topo)
        for warning in warned:
            console.print(f"[yellow]warning:[/] {warning}", highlight=False)
        _keys, work = preflight(spec, topo)  # a spec that cannot be planned fails before any work
        console.print(f"[bold]work estimate[/] {work.describe()}", highlight=False)
        with console.status("planning...") as status:
            result = build_plan(spec, topo, name=name, progress=lambda msg: status.update(msg),
                                profiles=profiles, workers=workers)  # fmt: skip
        config_map_name = pointer_name(name, spec.publish.config_map_name)
        manifests = render_configmaps(result, name=config_map_name, namespace=namespace)
        _write(out, result.files, manifests)
        report = build_report(result, describe(topo))
        for path, content in local_report_files(report, published_svgs(result)).items():
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            (out / path).write_bytes(content)
    console.print(f"[bold]runtime[/] {RUNTIME_LINE[result.runtime]}", highlight=False)
    for task in result.tasks:
        _print_task(task)
    for note in result.notes:
        if note not in warned:  # shape warnings are plan notes too: said once, above
            console.print(f"[yellow]note:[/] {note}", highlight=False)
    console.print(
        f"wrote {out}/ (report.md, report.html, plots/, manifests/configmaps.yaml; "
        f"{len(result.files)} plan files) · plan digest {result.digest[:12]}",
        highlight=False,
    )


def _write(out: Path, files: list[PlanFile], manifests: list[dict[str, Any]]) -> None:
    for f in files:
        path = out / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.content)
    (out / "manifests").mkdir(parents=True, exist_ok=True)
    (out / "manifests" / "configmaps.yaml").write_text(
        yaml.safe_dump_all(manifests, sort_keys=False)
    )


def _print_task(task: PlanTask) -> None:
    key = task.key
    rows = task_rows(task)
    sources = sorted({r.source for r in rows})
    mixed = len(sources) > 1
    # algbw and the full labels are in report.md; `via` names what realizes the row.
    table = size_table(
        f"{key.collective} · {key.role} · {key.ranks} ranks / {key.nodes} node(s)",
        ["size", "choice", "time", "busbw", "bound", "% bound", "vs NCCL", "via",
         *(["source"] if mixed else [])],
        "time per call in µs; busbw and its bound in GB/s (nccl-tests' busbw)"
        + ("" if mixed else f"; all {sources[0] if sources else ''}"),
    )  # fmt: skip
    # A synthesized schedule's label is long: the table names it by file, a legend follows.
    legend: dict[str, str] = {}
    for r, est in zip(rows, task.chosen_estimates, strict=True):
        choice, via = r.choice, _via(r.realized_by)
        if est.choice is not None and est.choice.kind == "msccl" and est.choice.msccl_file:
            via = legend.setdefault(est.choice.msccl_file, f"msccl#{len(legend) + 1}")
            choice = f"msccl/{est.choice.protocol}"
        table.add_row(
            format_size(r.size),
            choice,
            f"{r.time_us:.2f}",
            f"{r.busbw_gbps:.2f}",
            "" if r.bound_busbw_gbps is None else f"{r.bound_busbw_gbps:.2f}",
            "" if r.pct_of_bound is None else f"{r.pct_of_bound:.0f}%",
            f"{r.speedup:.2f}x",
            via,
            *([r.source] if mixed else []),
        )
    console.print(table)
    labels = {e.choice.msccl_file: e.choice.algorithm for e in task.chosen_estimates
              if e.choice is not None and e.choice.msccl_file}  # fmt: skip
    for path, tag in legend.items():  # the label can be longer than a line: on its own
        console.print(f"  {tag} = {path}", highlight=False)
        console.print(f"     {labels[path]}", highlight=False)


def _via(realized_by: str) -> str:
    """Short form of Choice.realized_by for the 80-column table."""
    if realized_by == "NCCL default":
        return "default"
    return realized_by.replace("tuner row ", "row ")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
