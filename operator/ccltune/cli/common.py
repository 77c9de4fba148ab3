"""What every sub-command shares: errors by who must act (exit 2 input, 3 bug), YAML input."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

if TYPE_CHECKING:
    from rich.table import Table

# pydantic, yaml and the API's errors load with the models that raise them, not with the CLI:
# `ccltune synthesize --help` needs none of them (user_errors looks them up in sys.modules).
console = Console()
err_console = Console(stderr=True)


def size_table(title: str, columns: list[str], caption: str) -> Table:
    """Per-size results that fit 80 columns without cutting numbers (no wrapping, no edges)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, pad_edge=False)  # fmt: skip
    for col in columns:
        left = col in ("choice", "source")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    return table


# Exit codes: 2 = the user's input is wrong, 3 = ccltune failed (a bug: please report it).
EXIT_INPUT = 2
EXIT_INTERNAL = 3

# Set by the root `-v/--verbose` option; CCLTUNE_DEBUG=1 does the same for scripts.
VERBOSE = False


def verbose() -> bool:
    return VERBOSE or bool(os.environ.get("CCLTUNE_DEBUG"))


def fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def fail_input(problems: Sequence[str]) -> NoReturn:
    """One problem: one line. Several: the count and the first, then every one numbered."""
    if len(problems) > 1:
        err_console.print(f"[bold red]error:[/] {len(problems)} problems, the first: {problems[0]}",
                          highlight=False, soft_wrap=True)  # fmt: skip
        for i, problem in enumerate(problems, start=1):
            err_console.print(f"  {i}. {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INPUT)
    fail(problems[0])


def fail_internal(exc: BaseException) -> NoReturn:
    """A bug of ours: never blamed on the input. The traceback only with -v."""
    if verbose():
        err_console.print("".join(traceback.format_exception(exc)).rstrip(), highlight=False,
                          markup=False, soft_wrap=True)  # fmt: skip
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    fail(f"internal error (a ccltune bug): {detail} -- please report it with the command you ran"
         f"{'' if verbose() else ' and the traceback -v prints'}", EXIT_INTERNAL)  # fmt: skip


def _os_message(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror.lower()}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@contextmanager
def user_errors(prefix: str = "") -> Iterator[None]:
    """Bad input (InputError, pydantic, YAML, files) exits 2 naming each field; anything else 3."""
    try:
        yield
    except typer.Exit:
        raise
    except OSError as exc:
        fail(_os_message(exc))
    except Exception as exc:
        # A class whose module was never imported cannot have been raised.
        if isinstance(exc, _loaded("pydantic", "ValidationError")):
            from ..api.errors import problems

            fail_input(problems(exc, prefix))
        if isinstance(exc, _loaded("ccltune.api.errors", "InputError")):
            fail_input(exc.problems)
        if isinstance(exc, _loaded("yaml", "YAMLError")):
            fail(str(exc).splitlines()[0] if str(exc) else "malformed YAML")
        fail_internal(exc)


class _NotLoaded(Exception):
    """Stands for an exception class whose module is not imported: nothing raised it."""


def _loaded(module: str, name: str) -> type[Any]:
    cls = getattr(sys.modules.get(module), name, _NotLoaded)
    return cls if isinstance(cls, type) else _NotLoaded


def read_yaml_documents(path: Path) -> list[Any]:
    import yaml

    from ..api.errors import InputError

    if not path.exists():
        raise InputError(f"{path}: no such file")
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise InputError(f"{path}: malformed YAML at {where}: {exc.problem}") from None


def ccltuning_document(path: Path) -> dict[str, Any]:
    """The first CCLTuning in a YAML file (other documents are ignored)."""
    from ..api.errors import InputError

    docs = read_yaml_documents(path)
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "CCLTuning":
            return doc
    raise InputError(f"{path}: no document with kind: CCLTuning")
