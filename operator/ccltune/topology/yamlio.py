"""YAML parsing that keeps line numbers, so errors can say where in the file the problem is."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from ..api.errors import message, model_named
from .errors import TopologyError

Path = tuple[str | int, ...]


def parse(text: str, source: str) -> tuple[Any, dict[Path, int]]:
    """(data, {key path: 1-based line}); malformed YAML raises TopologyError naming the line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = (exc.problem or exc.context or "malformed YAML").strip()
        raise TopologyError(f"{where}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"{source}: malformed YAML: {exc}") from None
    lines: dict[Path, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return data, lines


def _walk(node: yaml.Node, path: Path, lines: dict[Path, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value if isinstance(key, yaml.ScalarNode) else str(key.value)
            lines[(*path, k)] = key.start_mark.line + 1
            _walk(value, (*path, k), lines)
            lines[(*path, k)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines)


def located(exc: ValidationError, data: Any, lines: dict[Path, int], source: str) -> TopologyError:
    """Every problem as `file:line: field.path: message` (unknown fields with "did you mean")."""
    root = model_named(exc.title)
    found = [_located_one(err, data, lines, root) for err in exc.errors(include_url=False)]
    found = list(dict.fromkeys(found))  # a union reports one problem once per branch
    each = [f"{source}:{line}: {text}" if line else f"{source}: {text}" for line, text in found]
    if len(found) == 1:
        return TopologyError(each[0])
    brief = "; ".join(f"line {line}: {text}" if line else text for line, text in found)
    return TopologyError(f"{source}: {len(found)} problems: {brief}", each)


def _located_one(err: Any, data: Any, lines: dict[Path, int], root: Any) -> tuple[int | None, str]:
    """(1-based line or None, `field.path: message`)."""
    path: list[str | int] = []
    cur = data
    for part in err["loc"]:
        # pydantic adds union/validator tags ('int', 'list[str]', 'function-after[...]'): skip them.
        if isinstance(cur, dict) and part in cur:  # noqa: SIM114  (split for mypy's narrowing)
            path.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            path.append(part)
            cur = cur[part]
        elif isinstance(part, str) and not isinstance(cur, dict | list):
            continue
        elif isinstance(cur, dict) and isinstance(part, str) and "[" not in part and "-" not in part:
            path.append(part)  # a missing required field
            cur = None
    line = None
    for k in range(len(path), -1, -1):
        if tuple(path[:k]) in lines:
            line = lines[tuple(path[:k])]
            break
    dotted = ""
    for part in path:
        dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else str(part))
    return line, f"{dotted or '(root)'}: {message(err, root)}"
