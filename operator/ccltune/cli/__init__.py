"""`ccltune` command line. Each sub-command lives in its own module and registers itself here."""

from __future__ import annotations

import os
import sys

import typer

app = typer.Typer(
    name="ccltune",
    help="Synthesize and tune NCCL/MSCCL collectives for the cluster a job runs on.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Tracebacks of internal errors; solver (HiGHS) output."
    ),
) -> None:
    """Synthesize and tune NCCL/MSCCL collectives for the cluster a job runs on."""
    from . import common

    common.VERBOSE = verbose
    if verbose:  # synth/quiet.py reads it; worker processes inherit it
        os.environ["CCLTUNE_SOLVER_OUTPUT"] = "1"


def _register() -> None:
    # Sub-command modules: each defines register(app). Imported here so `--help` lists them all.
    from . import unpack

    if sys.argv[1:2] == ["unpack"]:
        # Every injected pod with packed files runs this first: skip the planning stack's imports.
        unpack.register(app)
        return
    if next((a for a in sys.argv[1:] if not a.startswith("-")), None) == "synthesize":
        # What the user waits for: the plan/tune stacks' imports cost more than a 16-GPU run.
        from . import synthesize

        synthesize.register(app)
        return
    from . import crds, plan, report, solve_shard, topology

    for module in (plan, report, topology, crds, unpack, solve_shard):
        module.register(app)
    for optional in ("synthesize", "tune"):
        try:
            module = __import__(f"{__name__}.{optional}", fromlist=["register"])
        except ModuleNotFoundError:
            continue
        module.register(app)


def main() -> None:
    _register()
    app()
