"""One interface for every way of measuring a configuration: simulated, replayed or live."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from ...api.common import Source
from ...api.errors import InputError
from ...api.plan import TaskKey
from ..fabric import FabricFacts
from ..space import Config, TaskSpace


class ProfilerError(InputError):
    """A measurement cannot be made (missing replay point, failed benchmark run)."""


@dataclass(frozen=True, slots=True)
class Measurement:
    time_us: float  # mean over `reps` repetitions
    source: Source
    reps: int = 1
    note: str = ""  # e.g. "interpolated from 512K and 2M"


class Profiler(Protocol):
    name: str
    source: Source

    def space(self, key: TaskKey, facts: FabricFacts, full: TaskSpace) -> TaskSpace:
        """The part of the valid space this profiler can measure (all of it, or a table's rows)."""
        ...

    def measure(self, key: TaskKey, size: int, config: Config, reps: int = 1) -> Measurement:
        ...


def stable_seed(*parts: object) -> int:
    """A seed that depends only on the parts' text (Python's hash() is salted per process)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


__all__ = ["Measurement", "Profiler", "ProfilerError", "stable_seed"]
