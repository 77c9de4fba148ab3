"""Turn pydantic validation errors into one line naming the field, as users see them."""

from __future__ import annotations

from pydantic import ValidationError

from .common import SIZE_PATTERN


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


def one_line(exc: ValidationError, prefix: str = "") -> str:
    """First error as `field.path: message`, plus how many more there are."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "string_pattern_mismatch":
        ctx = first.get("ctx") or {}
        if ctx.get("pattern") == SIZE_PATTERN:
            message = f"{first['input']!r} is not a positive size (use e.g. 1K, 64MiB, 1G or a byte count)"
        else:
            message = f"{first['input']!r} does not match {ctx.get('pattern')}"
    line = f"{field_path(tuple(first['loc']), prefix)}: {message}"
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more)"
    return line
