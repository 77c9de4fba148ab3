"""`ccltune tune`: search NCCL's knobs for collectives on a cluster, offline or on GPU nodes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..api.cluster import ClusterTopology
from ..api.common import format_size, parse_size
from ..api.plan import Estimate, PlanTask, TaskKey
from ..model.evaluate import common_bound_us
from ..pipeline import judged_tuning
from ..plan_steps import schedule_files, variant_resolver
from ..topology.load import load_cluster
from ..tune.keys import parse_collective, parse_size_range
from ..tune.profilers.replay import FALLBACKS, ReplayProfiler
from ..tune.searchers import SEARCHERS
from ..tune.tuner import TaskOutcome, TuningResult, communicator_topology, tune_tasks
from .common import console, fail, size_table, user_errors


def tune(
    cluster: str = typer.Option(..., "--cluster", "-c", help="Preset name or cluster/ASTRA-sim YAML file."),
    collective: list[str] = typer.Option(
        ["allreduce"], "--collective", help="allreduce, allgather, reducescatter, broadcast, alltoall; repeat or comma-separate."
    ),
    sizes: str = typer.Option("1K:1G", "--sizes", help="Size range MIN:MAX (K/M/G binary), bucketed by --size-factor."),
    ranks: int | None = typer.Option(None, "--ranks", help="Communicator size (default: the whole cluster)."),
    nodes: int | None = typer.Option(None, "--nodes", help="Nodes the communicator spans (default: what --ranks needs)."),
    role: str = typer.Option("world", "--role", help="Communicator role in the task key (world, tp, dp, pp, ep)."),
    profiler: str = typer.Option("simulated", "--profiler", help="simulated | replay:FILE | live"),
    profiles: Path | None = typer.Option(None, "--profiles", help="Tune on measured profiles: a directory of NCCL sweep CSVs and nccl-tests logs."),
    runtime: str = typer.Option("nccl", "--runtime", help="nccl | msccl | rccl; with msccl/rccl the MSCCL variants of replayed tables are searched jointly."),
    searcher: str = typer.Option("autoccl", "--searcher", help=" | ".join(SEARCHERS)),
    budget: int = typer.Option(200, "--budget", help="Trials per task key (size bucket)."),
    seed: int = typer.Option(0, "--seed"),
    nccl_version: str = typer.Option("2.24", "--nccl-version", help="NCCL release the settings are for."),
    size_factor: int = typer.Option(2, "--size-factor", help="Bucket width: sizes MIN, MIN*f, ..."),
    interference: float = typer.Option(0.0, "--interference", help="simulated: share of SMs/memory bandwidth taken by compute [0,1]."),
    noise: float = typer.Option(0.02, "--noise", help="simulated: relative std. dev. of one repetition."),
    fallback: str = typer.Option("error", "--fallback", help=f"replay: missing points -> {' | '.join(FALLBACKS)}."),
    inplace: bool = typer.Option(False, "--inplace", help="replay/live: use nccl-tests' in-place columns."),
    sharp: bool | None = typer.Option(None, "--sharp/--no-sharp", help="Network has SHARP (CollNet); default: node label 'sharp'."),
    launcher: str = typer.Option("", "--launcher", help="live: command prefix starting one process per GPU (e.g. 'mpirun -np 16 -x NCCL_ALGO ...')."),
    bindir: str = typer.Option("", "--bindir", help="live: directory of the nccl-tests binaries."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write tuner.table, nccl_tuner.conf, nccl.conf and tuning.json here."),
    wide: bool = typer.Option(False, "--wide", help="One table with NCCL's own choices and size ranges (about 140 columns)."),
) -> None:
    """Tune NCCL (algorithm, protocol, channels, threads, buffer, transport) per task key."""
    with user_errors():
        topo = load_cluster(cluster)
        colls = [parse_collective(c, "--collective") for item in collective for c in item.split(",") if c.strip()]
        if not colls:
            fail("--collective: give at least one collective")
        lo, hi = parse_size_range(sizes, "--sizes")
        n_ranks = ranks if ranks is not None else topo.world_size
        if n_ranks < 2:
            fail(f"--ranks: a communicator needs at least 2 ranks, got {n_ranks}")
        n_nodes = nodes if nodes is not None else max(1, -(-n_ranks // topo.gpus_per_node))
        if fallback not in FALLBACKS:
            fail(f"--fallback: {fallback!r} is not one of {', '.join(FALLBACKS)}")
        if runtime not in ("nccl", "msccl", "rccl"):
            fail(f"--runtime: {runtime!r} is not one of nccl, msccl, rccl")
        if profiles is not None and profiler != "simulated":
            fail(f"--profiles: give either --profiles or --profiler {profiler}, not both")
        # Whole ranges: tune_tasks buckets them (by --size-factor, or at a replayed table's sizes).
        keys = [TaskKey(collective=c, min_bytes=lo, max_bytes=hi, ranks=n_ranks, nodes=n_nodes, role=role) for c in colls]
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            job = bar.add_task("tuning", total=None)

            def step(msg: str, done: int, total: int) -> None:
                bar.update(job, description=msg, completed=done, total=total)

            options: dict[str, Any] = dict(
                searcher=searcher, budget=budget, seed=seed, runtime=runtime,
                nccl_version=nccl_version, size_factor=size_factor, sharp=sharp, progress=step,
                interference=interference, noise=noise, fallback=fallback, inplace=inplace,
                collective=colls[0], ranks=n_ranks, nodes=n_nodes,
                launcher=shlex.split(launcher), bindir=bindir,
            )
            if profiles is None and profiler == "simulated":
                # Both sides from the plan's evaluator; the surface only steers the search.
                result, judged = judged_tuning(keys, topo, profiler="simulated", **options)
            else:  # both sides measured (or replayed) in the same profile
                # A winning MSCCL variant msccl:<name> is written with the file of that name beside the profiles.
                files = variant_resolver(schedule_files(profiles), str(profiles)) if profiles is not None else None
                result = tune_tasks(keys, topo, profiler=profiler if profiles is None else ReplayProfiler.from_dir(
                    profiles, collective=colls[0], ranks=n_ranks, nodes=n_nodes, fallback=fallback,
                    inplace=inplace, runtime=runtime), variant_file=files, **options)
                judged = [_with_model_bounds(t, topo) for t in result.plan_tasks_by_key()]
        if out is not None:
            _write(out, result)
    (_print if wide else _print_compact)(result, judged)
    if out is not None:
        console.print(f"wrote {out}/ (tuner.table, nccl_tuner.conf, nccl.conf, tuning.json)")


def _write(out: Path, result: TuningResult) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, content in result.files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)  # msccl/<file> of a winning variant
        (out / name).write_text(content)
    doc = {
        "searcher": result.searcher, "profiler": result.profiler, "source": str(result.source),
        "budget": result.budget, "seed": result.seed, "env": result.env, "notes": result.notes,
        "tasks": [t.plan_task().wire() for t in result.tasks],
    }
    (out / "tuning.json").write_text(json.dumps(doc, indent=2) + "\n")


def _with_model_bounds(task: PlanTask, topo: ClusterTopology) -> PlanTask:
    """Measured rows with the model's bound beside them (a bound is a model number: a measured
    busbw above it says the cluster file undersells the hardware, and the table says so)."""
    sub = communicator_topology(topo, task.key)
    if sub is None:
        return task

    def fill(e: Estimate) -> Estimate:
        b = common_bound_us(task.key.collective, e.size_bytes, sub)
        return e.model_copy(update={"bound_us": b, "pct_of_bound": 100.0 * b / e.time_us})

    return task.model_copy(update={"default_estimates": [fill(e) for e in task.default_estimates],
                                   "chosen_estimates": [fill(e) for e in task.chosen_estimates]})  # fmt: skip


Row = tuple[TaskOutcome, Estimate, Estimate]  # the bucket, NCCL's default there, what runs there


def _rows(result: TuningResult, judged: list[PlanTask]) -> list[Row]:
    """Each tuned bucket with the numbers to print: the judged task's estimates (one per bucket,
    in the order tune_tasks produced them)."""
    by_label = {t.key.label(): t for t in judged}
    seen: dict[str, int] = {}
    rows = []
    for o in result.tasks:
        label = (o.parent or o.key).label()
        i = seen.get(label, 0)
        seen[label] = i + 1
        task = by_label[label]
        rows.append((o, task.default_estimates[i], task.chosen_estimates[i]))
    return rows


def _label(o: TaskOutcome, chosen: Estimate) -> str:
    if o.synthesized is not None:
        return o.choice().describe()
    choice = chosen.choice
    if choice is None or choice.realized_by == "NCCL default":
        return "NCCL default"
    if o.deployed is not None:
        return f"{choice.describe()}/{o.deployed.threads}t"
    return choice.describe()


def _pct(e: Estimate) -> str:
    return "-" if e.pct_of_bound is None else f"{e.pct_of_bound:.0f}%"


def _above_bound(rows: list[Row]) -> list[str]:
    over = [format_size(c.size_bytes) for _, d, c in rows for e in (d, c)
            if e.pct_of_bound is not None and e.pct_of_bound > 100.0 + 1e-6]  # fmt: skip
    if not over:
        return []
    return [f"measured faster than the model's bound at {', '.join(sorted(set(over), key=parse_size))}: "
            "the cluster file undersells this hardware (links or NICs); the bound column is the model's"]  # fmt: skip


def _print_compact(result: TuningResult, judged: list[PlanTask]) -> None:
    """80 columns: one table per communicator and collective; NCCL's own choices under --wide."""
    src = str(result.source)
    console.print(f"[bold]{result.searcher}[/] on {result.profiler}: busbw in GB/s, {src}; "
                  f"both sides timed {_both_sides(result)}", highlight=False)  # fmt: skip
    groups: dict[tuple[str, str, int, int], list[Row]] = {}
    rows = _rows(result, judged)
    for row in rows:
        k = row[0].key
        groups.setdefault((str(k.collective), k.role, k.ranks, k.nodes), []).append(row)
    for (coll, role, ranks, nodes), group in groups.items():
        table = size_table(
            f"{coll} · {role} · {ranks} ranks / {nodes} node(s)",
            ["size", "choice", "busbw", "NCCL", "vs NCCL", "bound", "trials"],
            "choice: algorithm/protocol/channels/threads; busbw of it and of NCCL's default; "
            "bound: the choice's % of the lower bound; a row runs to the next; --wide: NCCL's choices",
        )
        legend: dict[str, str] = {}  # synthesized schedules' labels are long: tagged, listed below
        for o, d, c in group:
            label = _label(o, c)
            if o.synthesized is not None:
                label = legend.setdefault(label, f"msccl#{len(legend) + 1}")
            table.add_row(format_size(o.key.min_bytes), label, f"{c.busbw_gbps:.1f}", f"{d.busbw_gbps:.1f}",
                          f"{d.time_us / c.time_us:.2f}x", _pct(c), str(o.trials))  # fmt: skip
        console.print(table)
        for full, tag in legend.items():
            console.print(f"  {tag} = {full}", highlight=False)
    _print_settings(result, _above_bound(rows))


def _both_sides(result: TuningResult) -> str:
    if result.profiler == "simulated":
        return "by the event simulator"
    return f"from the same {result.source} profile"


def _print_settings(result: TuningResult, extra: list[str]) -> None:
    for name, value in sorted(result.env.items()):
        console.print(f"  {name}={value}", highlight=False)
    for note in [*result.notes, *extra]:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _print(result: TuningResult, judged: list[PlanTask]) -> None:
    src = str(result.source)
    shapes = sorted({(t.key.ranks, t.key.nodes) for t in result.tasks})
    shape = ", ".join(f"{r} ranks/{n} nodes" for r, n in shapes)
    table = Table(title=f"{result.searcher} on {result.profiler} · {shape} · busbw GB/s, {src}, "
                        f"both sides timed {_both_sides(result)}")  # fmt: skip
    for col in ("task", "sizes", "NCCL default", f"busbw ({src})", "tuned", f"busbw ({src})",
                "% of bound", "speedup", "trials"):  # fmt: skip
        right = col in ("speedup", "trials", "% of bound") or col.startswith("busbw")
        table.add_column(col, justify="right" if right else "left", no_wrap=col != "tuned")
    rows = _rows(result, judged)
    for o, d, c in rows:
        k = o.key
        task = str(k.collective) + ("" if k.role == "world" else f" ({k.role})")
        default = d.choice.describe() if d.choice else "NCCL (logged)"
        end = k.max_bytes + 1 if (k.max_bytes + 1) & k.max_bytes == 0 else k.max_bytes  # exclusive 2^n end
        sizes = format_size(k.min_bytes) if k.min_bytes == k.max_bytes else f"{format_size(k.min_bytes)}-{format_size(end)}"
        table.add_row(task, sizes, default, f"{d.busbw_gbps:.1f}", _label(o, c), f"{c.busbw_gbps:.1f}",
                      _pct(c), f"{d.time_us / c.time_us:.2f}x", str(o.trials))  # fmt: skip
    console.print(table)
    _print_settings(result, _above_bound(rows))


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
