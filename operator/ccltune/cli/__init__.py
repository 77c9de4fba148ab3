"""`ccltune` command line. Each sub-command lives in its own module and registers itself here."""

from __future__ import annotations

import os
import sys
from importlib import import_module

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


# Sub-command -> the module that defines it (register(app)) and its one-line help, in `--help`
# order. The help is the command's own docstring (tests/cli/test_cli_startup.py keeps them equal),
# so that `ccltune --help` lists every command without importing any.
_COMMANDS = {
    "plan": ("plan", "Plan a CCLTuning for a cluster: topology, NCCL settings, schedules and a "
             "report."),
    "report": ("report", "Re-render report.md, report.html and the plots (SVG, PNG) from a "
               "plan's report.json."),
    "presets": ("topology", "List the built-in cluster presets."),
    "topology": ("topology", "Show a cluster's model (dimensions, symmetry) and export it."),
    "crds": ("crds", "Generate the CustomResourceDefinitions from the API models."),
    "unpack": ("unpack", "Restore a published plan's files: copy plain entries, join and gunzip "
               "packed parts."),
    "solve-shard": ("solve_shard", "Synthesize one shard of a plan's tasks and write the result "
                    "ConfigMap(s)."),
    "synthesize": ("synthesize", "Synthesize schedules per size range (SyCCL) and write MSCCL "
                   "algorithm files."),
    "tune": ("tune", "Tune NCCL (algorithm, protocol, channels, threads, buffer, transport) per "
             "task key."),
}  # fmt: skip
_OPTIONAL = ("synthesize", "tune")  # may fail to import (extras): then absent


def _register(argv: list[str] | None = None) -> None:
    """Register the invoked command alone, importing only its module: `ccltune unpack` runs in
    every injected pod and `ccltune synthesize` is what the user waits for. Without a known
    command (`ccltune --help`, a typo) every command is listed by name and help, none imported.
    `argv` None (tests) registers every command for real."""
    invoked = next((a for a in argv or () if not a.startswith("-")), None)
    if argv is not None and invoked not in _COMMANDS:
        for name, (_, summary) in _COMMANDS.items():
            app.command(name, help=summary, add_help_option=False)(_listed_only)
        return
    wanted = [_COMMANDS[invoked][0]] if invoked in _COMMANDS else [m for m, _ in _COMMANDS.values()]
    for name in dict.fromkeys(wanted):
        try:
            module = import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            if name not in _OPTIONAL:
                raise
            continue
        module.register(app)


def _listed_only() -> None:
    # Registered only when argv names no command, so typer never dispatches to it.
    raise RuntimeError("ccltune bug: a command listed for --help was invoked before it loaded")


def main() -> None:
    # ccltune makes no BLAS call, yet numpy's OpenBLAS starts a thread per core at import
    # (~0.1 s CPU, on a 2-core machine taken from the run itself). A user's setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _register(sys.argv[1:])
    app()
