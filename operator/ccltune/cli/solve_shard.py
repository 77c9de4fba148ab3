"""`ccltune solve-shard`: one pod of a sharded synthesis (an Indexed Job; controller/shardjob.py)."""

from __future__ import annotations

import asyncio
import os

import typer

from .common import fail, user_errors


def solve_shard(
    namespace: str = typer.Option(..., "--namespace", help="Namespace of the Job and its ConfigMaps."),
    input_cm: str = typer.Option(..., "--input", help="The shard input ConfigMap."),
    output: str = typer.Option(..., "--output", help="Result ConfigMaps are named OUTPUT-<index>."),
    job: str | None = typer.Option(None, "--job", help="This Job's name (to own the results)."),
    index: int | None = typer.Option(
        None, "--index", help="The shard to run; default $JOB_COMPLETION_INDEX (set by Kubernetes)."
    ),
) -> None:
    """Synthesize one shard of a plan's tasks and write the result ConfigMap(s)."""
    with user_errors():
        if index is None:
            text = os.environ.get("JOB_COMPLETION_INDEX", "")
            if not text.isdigit():
                fail(f"--index not given and JOB_COMPLETION_INDEX is {text!r}: run as an Indexed "
                     "Job pod or give --index")  # fmt: skip
            index = int(text)
        from ..controller.shardjob import run

        code = asyncio.run(run(namespace, input_cm, output, job, index))
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("solve-shard")(solve_shard)
