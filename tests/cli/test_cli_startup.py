"""What a command imports before it runs (docs/cli-startup.md): counted in modules, not seconds.

Each check runs a fresh interpreter, since this one has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import import_module

import pytest
import typer
from typer.core import TyperGroup

import ccltune.api
from ccltune import cli

# Never needed by `ccltune synthesize`: the operator's stack, the CRD models, graph and LP
# libraries (the MILP's HiGHS loads with the engine, but SciPy and networkx never).
NEVER_IN_SYNTHESIZE = (
    "kopf", "kubernetes", "networkx", "scipy", "optuna", "matplotlib", "ccltune.controller",
    "ccltune.publish", "ccltune.tune", "ccltune.pipeline", "ccltune.api.ccltuning",
)  # fmt: skip


def _modules_after(code: str) -> set[str]:
    """sys.modules of a fresh interpreter after running `code`."""
    probe = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return set(json.loads(out.strip().splitlines()[-1]))


def _cli(argv: list[str]) -> str:
    """Run the console script's main() on argv, keeping the interpreter for inspection."""
    return f"""
    import sys
    from ccltune.cli import main
    sys.argv = ["ccltune", *{argv!r}]
    try:
        main()
    except SystemExit:
        pass
    """


def test_importing_the_synthesize_command_loads_only_the_cli() -> None:
    loaded = _modules_after("import ccltune.cli.synthesize")
    heavy = ("numpy", "pydantic", "yaml", "highspy", "rich.progress", "ccltune.api.cluster",
             "ccltune.synth.engine", "ccltune.topology.load", *NEVER_IN_SYNTHESIZE)  # fmt: skip
    assert sorted(m for m in heavy if m in loaded) == []


def test_synthesize_help_lists_its_options_without_the_engine() -> None:
    loaded = _modules_after(_cli(["synthesize", "--help"]))
    assert "ccltune.cli.synthesize" in loaded
    assert sorted(m for m in ("numpy", "ccltune.synth.engine", "ccltune.cli.plan",
                              "ccltune.cli.unpack") if m in loaded) == []  # fmt: skip


def test_synthesize_run_imports_its_stack_only() -> None:
    # A bad collective fails after the command has imported all it runs with.
    loaded = _modules_after(_cli(["synthesize", "--cluster", "dgx-h100-1", "--collective", "x"]))
    assert {"ccltune.synth.engine", "ccltune.topology.load", "numpy"} <= loaded
    assert sorted(m for m in NEVER_IN_SYNTHESIZE if m in loaded) == []
    assert sorted(m for m in loaded if m.startswith("ccltune.cli.")) == [
        "ccltune.cli.common", "ccltune.cli.synthesize"]  # fmt: skip


def test_unpack_does_not_load_the_planning_stack() -> None:
    # Every injected pod with packed files runs `ccltune unpack` first.
    loaded = _modules_after(_cli(["unpack", "--help"]))
    assert "ccltune.cli.unpack" in loaded
    assert sorted(m for m in ("numpy", "ccltune.synth", "ccltune.model", "ccltune.topology",
                              "ccltune.api.ccltuning", *NEVER_IN_SYNTHESIZE[:4])
                  if m in loaded) == []  # fmt: skip


def test_root_help_lists_every_command_without_importing_any() -> None:
    out = subprocess.run([sys.executable, "-m", "ccltune", "--help"], capture_output=True,
                         text=True, check=True, env={"COLUMNS": "100", "TERM": "dumb"}).stdout  # fmt: skip
    for command in ("plan", "report", "presets", "topology", "crds", "unpack", "solve-shard",
                    "synthesize", "tune"):  # fmt: skip
        assert f" {command} " in out, command
    loaded = _modules_after(_cli(["--help"]))
    assert sorted(m for m in loaded if m.startswith("ccltune.cli.")) == []
    assert "numpy" not in loaded


def test_listed_help_is_each_commands_own() -> None:
    # The summaries `ccltune --help` lists without importing must say what the commands say.
    from typer.main import get_command

    full = typer.Typer()
    for module, _ in dict.fromkeys(m for m in cli._COMMANDS.values()):
        import_module(f"ccltune.cli.{module}").register(full)
    full.callback()(cli._root)
    group = get_command(full)
    assert isinstance(group, TyperGroup)
    assert list(group.commands) == list(cli._COMMANDS)
    for name, (_, summary) in cli._COMMANDS.items():
        assert group.commands[name].help == summary, name


def test_api_models_load_on_first_use() -> None:
    loaded = _modules_after("import ccltune.api.cluster")
    assert "ccltune.api.ccltuning" not in loaded
    loaded = _modules_after("from ccltune.api import CCLTuning")
    assert "ccltune.api.ccltuning" in loaded


@pytest.mark.parametrize("name", ccltune.api.__all__)
def test_api_reexports_every_name_from_its_module(name: str) -> None:
    value = getattr(ccltune.api, name)
    assert getattr(value, "__module__", "").startswith("ccltune.api."), name
    assert getattr(sys.modules[value.__module__], name) is value


def test_api_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ccltune.api.Nope  # noqa: B018


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("4", "4")])
def test_openblas_threads_default_to_one_unless_the_user_says(given: str | None,
                                                              expected: str) -> None:  # fmt: skip
    code = textwrap.dedent(_cli(["--help"])) + "\nimport os\nprint('THREADS', os.environ['OPENBLAS_NUM_THREADS'])\n"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True, env=env).stdout  # fmt: skip
    assert f"THREADS {expected}" in out
