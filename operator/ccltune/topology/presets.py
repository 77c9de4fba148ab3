"""Built-in cluster presets: compact ClusterSpec YAML files in presets/, every number sourced."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from ..api.cluster import ClusterTopology
from .cluster_file import from_data
from .errors import TopologyError
from .yamlio import parse

_PACKAGE = "ccltune.topology"  # data files live in topology/presets/*.yaml


def _files() -> dict[str, str]:
    root = resources.files(_PACKAGE).joinpath("presets")
    return {p.name.removesuffix(".yaml"): p.name for p in root.iterdir() if p.name.endswith(".yaml")}


def list_presets() -> list[str]:
    return sorted(_files())


def preset_text(name: str) -> str:
    files = _files()
    if name not in files:
        raise TopologyError(f"unknown cluster preset {name!r}; presets: {', '.join(sorted(files))}")
    return resources.files(_PACKAGE).joinpath("presets", files[name]).read_text(encoding="utf-8")


@lru_cache(maxsize=32)
def _load(name: str) -> ClusterTopology:
    data, lines = parse(preset_text(name), f"preset {name}")
    return from_data(data, lines, f"preset {name}")


def load_preset(name: str) -> ClusterTopology:
    """The preset's ClusterTopology with its dimensions detected. Each call returns a fresh copy."""
    return _load(name).model_copy(deep=True)
