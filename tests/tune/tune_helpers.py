"""Shared helpers for the tune tests: presets load once per session."""

from __future__ import annotations

from functools import cache

from ccltune.api.cluster import ClusterTopology
from ccltune.topology.presets import load_preset

DATA = "/work/shared/data/nccl-tests"


@cache
def preset(name: str) -> ClusterTopology:
    return load_preset(name)
