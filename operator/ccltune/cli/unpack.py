"""`ccltune unpack`: the injected pod's init container writes the plan files, packed ones restored."""

from __future__ import annotations

from pathlib import Path

import typer

from ..publish.unpack import parse_index, unpack
from .common import user_errors


def unpack_cmd(
    src: Path = typer.Option(
        ..., "--from", help="Directory holding the ConfigMap entries, each at its key."
    ),
    dst: Path = typer.Option(..., "--to", help="Directory to write the plan files into."),
    items: str = typer.Option(
        ..., "--items", help="The pointer manifest's items as JSON (the webhook passes them)."
    ),
) -> None:
    """Restore a published plan's files: copy plain entries, join and gunzip packed parts."""
    with user_errors():
        written = unpack(parse_index(items), src, dst)
    typer.echo(f"unpacked {len(written)} plan file(s) into {dst}")


def register(app: typer.Typer) -> None:
    app.command("unpack")(unpack_cmd)
