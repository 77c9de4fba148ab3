"""Error classes named by who must act, and validation errors as lines that name each field.

`InputError`: the user's input is wrong (CLI exit 2, a user-facing condition). `InternalError`:
ccltune broke its own invariant (CLI exit 3, condition reason InternalError). Both keep
`ValueError` as a base so the `except ValueError` sites written before this split still work.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


class CcltuneError(Exception):
    """Root of every error ccltune raises on purpose."""


class InputError(CcltuneError, ValueError):
    """Bad input; each problem is one line naming the file, field or node."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) or (message,)


class InternalError(CcltuneError, ValueError):
    """ccltune produced something it should not have: a bug, never the user's fault."""


def field_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.startswith(("function-after", "function-before", "function-wrap")):
            continue  # validator frames carry no field name
        else:
            path = f"{path}.{part}" if path else part
    return path or "(root)"


def summary(problems: Sequence[str]) -> str:
    """All problems on one line (for conditions and events): nothing is left out."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems: " + "; ".join(problems)


def problems(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """Every error as `field.path: message`; unknown fields get a "did you mean" from `model`."""
    root = model or model_named(exc.title)
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        out.append(f"{field_path(loc, prefix)}: {message(err, root)}")
    return list(dict.fromkeys(out))  # a union reports one problem once per branch


def message(err: Any, root: type[BaseModel] | None = None) -> str:
    """The text of one pydantic error as a user reads it (wire names, sizes, suggestions)."""
    kind = err["type"]
    if kind == "extra_forbidden":
        loc = tuple(err["loc"])
        hint = did_you_mean(str(loc[-1]), _names_at(root, loc[:-1])) if root and loc else None
        return "unknown field" + (f" (did you mean {hint}?)" if hint else "")
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        from .common import SIZE_PATTERN  # api.common raises InputError: import it late

        ctx = err.get("ctx") or {}
        if ctx.get("pattern") == SIZE_PATTERN:
            return f"{err['input']!r} is not a positive size (use e.g. 1K, 64MiB, 1G or a byte count)"
        return f"{err['input']!r} does not match {ctx.get('pattern')}"
    return str(err["msg"]).removeprefix("Value error, ")


def one_line(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """Every problem of `exc` on one line (the first one first)."""
    return summary(problems(exc, prefix, model))


def input_error(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> InputError:
    found = problems(exc, prefix, model)
    return InputError(summary(found), found)


def did_you_mean(name: str, known: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return close[0] if close else None


def _names_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> set[str]:
    """The wire names (aliases) a user may write where `loc` points, following nested models."""
    models = [root]
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the element's models are already in `models`
        inner = [m for model in models for m in _field_models(model, part)]
        if inner:
            models = inner
        # else: a union tag, a validator frame or a dict key: the same models apply
    return {name for model in models for name in _wire_names(model)}


def _wire_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _field_models(model: type[BaseModel], wire_name: str) -> list[type[BaseModel]]:
    for name, info in model.model_fields.items():
        if wire_name in (name, info.alias):
            return _models_in(info.annotation)
    return []


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """BaseModel classes inside list[...], X | None, Annotated[...], dict[str, ...]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None and not isinstance(annotation, types.UnionType):
        return []
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def model_named(title: str) -> type[BaseModel] | None:
    """The model a ValidationError came from (its title is the class name), when unambiguous."""
    found: dict[type[BaseModel], None] = {}
    todo = list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__name__ == title and cls.__module__.startswith("ccltune."):
            found[cls] = None
    return next(iter(found)) if len(found) == 1 else None
