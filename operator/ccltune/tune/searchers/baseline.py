"""Baselines: grid (exhaustive when the budget allows, evenly thinned otherwise) and random.

Both are uninformed on purpose: they ignore the start configuration and the prior."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..space import Config, TaskSpace
from .base import Evaluate, Log, SearchResult, check_budget
from .prior import Prior


@dataclass
class GridSearcher:
    """Every configuration in a fixed order; with a smaller budget, every k-th of them."""

    reps: int = 1
    name: str = "grid"

    def search(
        self, space: TaskSpace, evaluate: Evaluate, budget: int, seed: int, start: Config | None = None,
        prior: Prior | None = None,
    ) -> SearchResult:
        check_budget(budget)
        configs = list(space)
        if budget < len(configs):
            step = len(configs) / budget
            configs = [configs[int(i * step)] for i in range(budget)]
        log = Log(evaluate, budget, self.reps)
        for c in configs:
            log(c)
        best, value = log.best()
        exhaustive = len(log.trials) == len(space)
        reason = "whole space measured" if exhaustive else f"thinned grid of {budget} trials"
        return SearchResult(best, value, log.trials, exhaustive, reason)


@dataclass
class RandomSearcher:
    """Uniform sampling without replacement, seeded."""

    reps: int = 1
    name: str = "random"

    def search(
        self, space: TaskSpace, evaluate: Evaluate, budget: int, seed: int, start: Config | None = None,
        prior: Prior | None = None,
    ) -> SearchResult:
        check_budget(budget)
        configs = list(space)
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(configs))[: min(budget, len(configs))]
        log = Log(evaluate, budget, self.reps)
        for i in order:
            log(configs[int(i)])
        best, value = log.best()
        done = len(log.trials) == len(configs)
        return SearchResult(best, value, log.trials, done, f"{len(log.trials)} random trials")


__all__ = ["GridSearcher", "RandomSearcher"]
