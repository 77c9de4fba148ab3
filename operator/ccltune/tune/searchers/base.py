"""What every searcher shares: the evaluation callback, the trial log and the budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ...api.errors import InputError
from ..space import DEFAULT_BUFFSIZE, Config, Point, Subspace, TaskSpace

if TYPE_CHECKING:
    from .prior import Prior

# (config, repetitions) -> mean time in microseconds; lower is better.
Evaluate = Callable[[Config, int], float]


@dataclass(frozen=True, slots=True)
class Trial:
    config: Config
    value: float  # mean time (us) over `reps`
    reps: int
    pruned: bool = False


@dataclass
class SearchResult:
    best: Config
    value: float
    trials: list[Trial]
    converged: bool
    reason: str  # why the search stopped
    extra_measurements: int = 0  # repetitions spent re-measuring finalists

    @property
    def n_trials(self) -> int:
        return len(self.trials)

    @property
    def n_measurements(self) -> int:
        return sum(t.reps for t in self.trials) + self.extra_measurements


class Searcher(Protocol):
    name: str

    def search(
        self, space: TaskSpace, evaluate: Evaluate, budget: int, seed: int, start: Config | None = None,
        prior: Prior | None = None,
    ) -> SearchResult: ...


class BudgetExhausted(Exception):
    pass


@dataclass
class Log:
    """Trial bookkeeping with a cache: a configuration is measured once per search."""

    evaluate: Evaluate
    budget: int
    reps: int = 1
    trials: list[Trial] = field(default_factory=list)
    cache: dict[Config, float] = field(default_factory=dict)
    verified: int = 0  # repetitions spent re-measuring configurations already in the log
    nreps: dict[Config, int] = field(default_factory=dict)

    def __call__(self, config: Config) -> float:
        if config in self.cache:
            return self.cache[config]
        if len(self.trials) >= self.budget:
            raise BudgetExhausted
        value = self.evaluate(config, self.reps)
        self.trials.append(Trial(config, value, self.reps))
        self.cache[config] = value
        self.nreps[config] = self.reps
        return value

    def refine(self, config: Config, reps: int) -> float:
        """More repetitions of a measured configuration; the mean over all of them (no new trial)."""
        extra = self.evaluate(config, reps)
        n = self.nreps[config]
        self.cache[config] = (self.cache[config] * n + extra * reps) / (n + reps)
        self.nreps[config] = n + reps
        self.verified += reps
        return self.cache[config]

    @property
    def left(self) -> int:
        return self.budget - len(self.trials)

    def best(self) -> tuple[Config, float]:
        config = min(self.cache, key=lambda c: (self.cache[c], c))
        return config, self.cache[config]


def check_budget(budget: int) -> None:
    if budget < 1:
        raise InputError(f"budget must be at least 1 trial, got {budget}")


Index = tuple[int, ...]  # one value index per dimension


def nearest_member(sub: Subspace, idx: Index) -> Index | None:
    """The grid index closest to `idx` (L1 over value indices) whose point exists in `sub`."""
    best: tuple[int, Index] | None = None
    for point in sub.points or ():
        j = tuple(vals.index(v) for v, vals in zip(point, sub.values, strict=True))
        dist = sum(abs(a - b) for a, b in zip(j, idx, strict=True))
        if best is None or (dist, j) < best:
            best = (dist, j)
    return best[1] if best else None


def point_at(sub: Subspace, idx: Index) -> Point:
    return tuple(vals[i] for vals, i in zip(sub.values, idx, strict=True))


def _threadblock_match(sub: Subspace, idx: Index, channels: int) -> tuple[int, int]:
    """(channels, instances) indices of the MSCCL point with as many threadblock channels
    (channels x instances) as the start has channels, fewest instances on a tie: an MSCCL variant
    starts with the resources NCCL's default uses."""
    best: tuple[float, int, int, int] | None = None
    for ci, c in enumerate(sub.values[0]):
        for ii, inst in enumerate(sub.values[3]):
            point = list(point_at(sub, idx))
            point[0], point[3] = c, inst
            if not sub.contains(tuple(point)):
                continue
            cand = (abs(math.log2(c * inst) - math.log2(max(channels, 1))), inst, ci, ii)
            if best is None or cand < best:
                best = cand
    return (best[2], best[3]) if best is not None else (idx[0], idx[3])


def start_index(sub: Subspace, start: Config | None) -> Index:
    """Where to start inside a subspace: NCCL's default resources projected onto its grid
    (an MSCCL variant: one instance)."""
    idx = []
    for d, vals in enumerate(sub.values):
        if start is None:
            # No NCCL default known: middle channel count, most threads, NCCL's default buffer.
            defaults = (None, max(vals), DEFAULT_BUFFSIZE, 1)
            want = defaults[d]
            idx.append(vals.index(want) if want in vals else len(vals) // 2)
        else:
            target = start.point[d]
            idx.append(min(range(len(vals)), key=lambda i: (abs(vals[i] - target), i)))
    if start is not None and len(sub.values) > 3 and len(sub.values[3]) > 1:
        idx[0], idx[3] = _threadblock_match(sub, tuple(idx), start.channels * start.instances)
    out = tuple(idx)
    if sub.points is not None and point_at(sub, out) not in sub.points:
        near = nearest_member(sub, out)
        if near is not None:
            out = near
    return out


__all__ = [
    "BudgetExhausted",
    "Evaluate",
    "Index",
    "Log",
    "SearchResult",
    "Searcher",
    "Trial",
    "check_budget",
    "nearest_member",
    "point_at",
    "start_index",
]
