"""`ccltune plan`: placeholder until the pipeline lands (being written)."""

import typer


def register(app: typer.Typer) -> None:
    pass
