"""`ccltune synthesize`: SyCCL schedule synthesis for one collective, MSCCL XML out."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

# Only what `--help` needs is imported here; the models, numpy and the engine load when the
# command runs, so `--help` and typer's own argument errors never load them (docs/cli-startup.md).
from ..synth import DEFAULT_WORK_BUDGET
from .common import console, fail, size_table, user_errors

# The wall-time targets are on 2 cores: use the second where there is one.
DEFAULT_WORKERS = min(2, os.cpu_count() or 1)

if TYPE_CHECKING:
    from rich.table import Table

    from ..api.cluster import ClusterTopology
    from ..synth.engine import SynthesisResult


def parse_sizes(text: str) -> list[int]:
    """'1K:1G' (every power of two, as nccl-tests -f 2), '1K,64K,1M', or one size."""
    from ..api.common import parse_size
    from ..api.errors import InputError

    text = text.strip()
    if ":" in text:
        lo_s, hi_s = text.split(":", 1)
        lo, hi = parse_size(lo_s), parse_size(hi_s)
        if lo > hi:
            raise InputError(f"--sizes {text}: the first size is larger than the last")
        out, s = [], lo
        while s < hi:
            out.append(s)
            s *= 2
        out.append(hi)
        return out
    return [parse_size(p) for p in text.split(",") if p.strip()]


def budget_bounds(res: SynthesisResult, topo: ClusterTopology) -> list[float]:
    """Per size: the bound at the files' SM budget (model/cost/sm_bound.py), µs."""
    from ..model.cost.sm_bound import budget_bound_us

    return [budget_bound_us(res.collective, s.size_bytes, topo, res.max_threadblocks, s.bound_us)
            for s in res.sizes]  # fmt: skip


def _table(res: SynthesisResult, budget: list[float]) -> Table:
    """Synthesized choices as range tags (#1, #2...): the ranges and their labels follow."""
    from ..api.common import format_size

    t = size_table(
        f"{res.collective.value} on {res.cluster} ({res.nranks} ranks)",
        ["size", "choice", "time", "NCCL", "bound", "busbw", "% bound", "% budget", "vs NCCL"],
        # One source for every row (the simulator), so the caption says it, not a column.
        "simulated µs per call: time (chosen), NCCL (its default choice, same simulator), bound "
        "(analytic lower bound); busbw of the chosen schedule in GB/s; % budget: of the bound "
        f"at {res.max_threadblocks} threadblocks per GPU",
    )  # fmt: skip
    tag = {id(sr): f"#{i}/{rr.protocol}" for i, rr in enumerate(res.ranges, start=1)
           if rr.kind == "msccl" for sr in rr.sizes}  # fmt: skip
    for s, at_budget in zip(res.sizes, budget, strict=True):
        choice = tag.get(id(s), s.chosen.removeprefix("nccl:"))
        t.add_row(
            format_size(s.size_bytes), choice, f"{s.estimate.time_us:.1f}",
            f"{s.default.time_us:.1f}", f"{s.bound_us:.1f}", f"{s.estimate.busbw_gbps:.1f}",
            f"{s.estimate.pct_of_bound or 0:.0f}%", f"{100 * at_budget / s.estimate.time_us:.0f}%",
            f"{s.default.time_us / s.estimate.time_us:.2f}x",
        )  # fmt: skip
    return t


def synthesize_cmd(
    cluster: str | None = typer.Option(
        None, "--cluster", "-c", help="Preset name or cluster YAML file."
    ),
    network: Path | None = typer.Option(None, "--network", help="ASTRA-sim network YAML."),
    collective: str = typer.Option(
        ..., "--collective", help="allgather, reducescatter, allreduce, alltoall or broadcast."
    ),
    sizes: str = typer.Option("1K:1G", "--sizes", help="LO:HI (powers of two) or a comma list."),
    out: Path = typer.Option(
        Path("msccl"), "--out", "-o", help="Directory for the MSCCL XML files."
    ),
    work_budget: int = typer.Option(
        DEFAULT_WORK_BUDGET, "--work-budget",
        help="Transfers simulated before evaluation is cut short (the best found so far is "
        "used); counted in work, so results do not depend on the machine.",
    ),
    budget: float | None = typer.Option(
        None, "--time-budget",
        help="Seconds; past them synthesis stops with an error and writes nothing (it never "
        "changes what is chosen).",
    ),
    workers: int = typer.Option(
        DEFAULT_WORKERS, "--workers",
        help="Processes: NCCL's reference per size and part of the files' timing run beside "
        "synthesis, heavy sub-demand MILPs are spread over them; every result is the same for "
        "any count.",
    ),
    summary: Path | None = typer.Option(
        None, "--json", help="Also write the per-size results, ranges and files as JSON here."
    ),
    max_threadblocks: int | None = typer.Option(
        None,
        "--max-threadblocks",
        help="SM budget: threadblocks per GPU a file may use (default: NCCL's channel count).",
    ),
) -> None:
    """Synthesize schedules per size range (SyCCL) and write MSCCL algorithm files."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Column

    from ..api.common import Collective, format_size
    from ..model.formats.msccl.limits import MAX_THREADBLOCKS
    from ..synth.engine import SynthesisDeadline, synthesize
    from ..topology.load import load_cluster

    with user_errors():
        if (cluster is None) == (network is None):
            fail("give exactly one of --cluster PRESET|FILE or --network ASTRA.yaml")
        try:
            coll = Collective(collective.lower())
        except ValueError:
            fail(
                f"--collective {collective!r}: use one of {', '.join(c.value for c in Collective)}"
            )
        size_list = parse_sizes(sizes)
        topo = load_cluster(str(network) if network is not None else str(cluster))
        if budget is not None and budget <= 0:
            fail("--time-budget must be positive")
        if work_budget < 1:
            fail("--work-budget must be >= 1")
        if workers < 1:
            fail("--workers must be >= 1")
        if max_threadblocks is not None and not 1 <= max_threadblocks <= MAX_THREADBLOCKS:
            fail(f"--max-threadblocks must be in 1..{MAX_THREADBLOCKS} (msccl-executor-nccl's "
                 "threadblocks per rank)")  # fmt: skip
        # The bar keeps its width; a description longer than the rest of the line is cut.
        describe = TextColumn("{task.description}",
                          table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"))
        with Progress(describe, BarColumn(bar_width=None, table_column=Column(width=24)),
                      TimeElapsedColumn(), console=console, transient=True,
                      expand=True) as bar:  # fmt: skip
            task = bar.add_task("sketch search", total=1.0)

            def report(msg: str, frac: float) -> None:
                bar.update(task, description=msg, completed=frac)

            try:
                res = synthesize(topo, coll, size_list, work_budget=work_budget,
                                 time_budget_s=budget, workers=workers, out_dir=out,
                                 progress=report, max_threadblocks=max_threadblocks)  # fmt: skip
            except SynthesisDeadline as exc:
                fail(f"--time-budget: {exc}; raise it, or lower --work-budget for a result "
                     "cut short by work")  # fmt: skip
    if res.stats is not None:
        st = res.stats
        console.print(st.line(), highlight=False)  # every count is of sequences enumerated
    budget_us = budget_bounds(res, topo)
    console.print(_table(res, budget_us))
    for i, rr in enumerate(res.ranges, start=1):
        hi = "inf" if rr.max_bytes == 0 else format_size(rr.max_bytes + 1)
        where = rr.xml_file or "NCCL (no file)"
        name = f"#{i} " if rr.kind == "msccl" else ""
        # The label can be longer than a line: it goes on its own, under range and file.
        console.print(f"  {name}{format_size(max(rr.min_bytes, 1))}..{hi} {rr.protocol} -> {where}",
                      highlight=False)  # fmt: skip
        console.print(f"     {rr.label}", highlight=False)
    for note in res.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    console.print(f"synthesis took {res.timings.get('total_s', 0):.1f} s; every time above is "
                  "simulated (bound: analytic lower bound)", highlight=False)  # fmt: skip
    if summary is not None:
        with user_errors():
            text = json.dumps(summary_of(res, budget_us), indent=1)
            summary.write_text(text + "\n", encoding="utf-8")


def summary_of(res: SynthesisResult, budget: list[float]) -> dict[str, object]:
    """The table, ranges and notes as data (benchmarks/synthesis.py reads it); times in µs,
    every one simulated, the bounds analytic (`budget`: budget_bounds)."""
    return {
        "cluster": res.cluster, "collective": res.collective.value, "ranks": res.nranks,
        "maxThreadblocks": res.max_threadblocks, "budgetExhausted": res.budget_exhausted,
        "work": res.work,
        "sizes": [{"bytes": s.size_bytes, "chosen": s.chosen, "protocol": s.protocol,
                   "timeUs": s.estimate.time_us, "ncclUs": s.default.time_us,
                   "boundUs": s.bound_us, "pctOfBound": s.estimate.pct_of_bound,
                   "budgetBoundUs": b, "pctOfBudgetBound": 100.0 * b / s.estimate.time_us,
                   "source": str(s.estimate.source)}
                  for s, b in zip(res.sizes, budget, strict=True)],
        "ranges": [{"minBytes": r.min_bytes, "maxBytes": r.max_bytes, "kind": r.kind,
                    "label": r.label, "protocol": r.protocol, "file": r.xml_file,
                    "threadblocks": r.threadblocks} for r in res.ranges],
        "notes": res.notes,
        "timingsS": res.timings,
    }  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("synthesize")(synthesize_cmd)
