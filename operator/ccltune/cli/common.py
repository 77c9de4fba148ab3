"""What every sub-command shares: one-line errors instead of tracebacks, YAML input."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.table import Table

from ..api.errors import one_line

console = Console()
err_console = Console(stderr=True)

def size_table(title: str, columns: list[str], caption: str) -> Table:
    """Per-size results that fit 80 columns without cutting numbers (no wrapping, no edges)."""
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, pad_edge=False)  # fmt: skip
    for col in columns:
        left = col in ("choice", "source")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    return table


# Exit codes: 2 = the user's input is wrong, 3 = ccltune failed (a bug: please report it).
EXIT_INPUT = 2
EXIT_INTERNAL = 3


def fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors(prefix: str = "") -> Iterator[None]:
    """Input errors become one line naming the field; anything else a short internal error."""
    try:
        yield
    except typer.Exit:
        raise
    except ValidationError as exc:
        fail(one_line(exc, prefix))
    except (ValueError, OSError, yaml.YAMLError) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except Exception as exc:
        if os.environ.get("CCLTUNE_DEBUG"):
            raise
        fail(
            f"internal error: {type(exc).__name__}: {exc} (set CCLTUNE_DEBUG=1 for a traceback)",
            EXIT_INTERNAL,
        )


def read_yaml_documents(path: Path) -> list[Any]:
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise ValueError(f"{path}: malformed YAML at {where}: {exc.problem}") from None


def ccltuning_document(path: Path) -> dict[str, Any]:
    """The first CCLTuning in a YAML file (other documents are ignored)."""
    docs = read_yaml_documents(path)
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "CCLTuning":
            return doc
    raise ValueError(f"{path}: no document with kind: CCLTuning")


def is_debug() -> bool:
    return bool(os.environ.get("CCLTUNE_DEBUG")) or "--debug" in sys.argv
