"""AutoCCL's search (NSDI'25, section 4): divide and conquer over NCCL's parameters.

1. Implementation subspaces (algorithm x protocol x transport) are few: every one is visited,
   starting from NCCL's default resources projected onto it.
2. Inside each subspace the resource parameters (channels, threads, buffer size) are tuned by
   coordinate descent with an adaptive step: a step that improves is taken and doubled, a
   dimension that does not improve halves its step. Subspaces are descended best-first (by their
   starting point), so a tight budget goes to the promising ones; with `prune_margin` set, a
   subspace whose start is that much slower than the best start is skipped (off by default, as in
   AutoCCL, which visits every subspace).
3. Convergence: a full round over the dimensions at step 1 without a relative gain above `eps`
   (measurement noise level) ends a subspace; the search ends when every subspace converged or the
   budget is spent.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..space import Config, Subspace, TaskSpace
from .base import BudgetExhausted, Evaluate, Log, SearchResult, check_budget, point_at, start_index


@dataclass
class AutoCCLSearcher:
    eps: float = 0.01
    prune_margin: float | None = None
    reps: int = 1
    name: str = "autoccl"

    def search(
        self, space: TaskSpace, evaluate: Evaluate, budget: int, seed: int, start: Config | None = None
    ) -> SearchResult:
        check_budget(budget)
        log = Log(evaluate, budget, self.reps)
        starts: list[tuple[float, int, Subspace, tuple[int, int, int]]] = []
        converged = True
        reason = "every subspace converged"
        try:
            for i, sub in enumerate(space.subspaces):
                idx = start_index(sub, start)
                starts.append((log(sub.config(point_at(sub, idx))), i, sub, idx))
            starts.sort(key=lambda s: (s[0], s[1]))
            best_start = starts[0][0]
            for value, _, sub, idx in starts:
                if self.prune_margin is not None and value > best_start * (1 + self.prune_margin):
                    continue
                self._descend(sub, idx, value, log)
        except BudgetExhausted:
            converged = False
            reason = f"budget of {budget} trials spent"
        best, value = log.best()
        return SearchResult(best, value, log.trials, converged, reason)

    def _descend(self, sub: Subspace, idx: tuple[int, int, int], value: float, log: Log) -> None:
        dims = [d for d in range(3) if len(sub.values[d]) > 1]
        steps = {d: max(1, len(sub.values[d]) // 4) for d in dims}
        cur, cur_v = list(idx), value
        while dims:
            improved = False
            for d in dims:
                moved = False
                for direction in (1, -1):
                    while True:
                        nxt = self._move(sub, cur, d, direction * steps[d])
                        if nxt is None:
                            break
                        v = log(sub.config(point_at(sub, nxt)))
                        if v < cur_v * (1 - self.eps):
                            cur, cur_v = list(nxt), v
                            moved = improved = True
                            steps[d] = min(steps[d] * 2, len(sub.values[d]) - 1)
                        else:
                            break
                    if moved:
                        break
                if not moved:
                    steps[d] = max(1, steps[d] // 2)
            if not improved and all(s == 1 for s in steps.values()):
                return

    @staticmethod
    def _move(sub: Subspace, cur: list[int], d: int, delta: int) -> tuple[int, int, int] | None:
        """Step along dimension d; in a sparse (replayed) grid, go on to the next existing point."""
        n = len(sub.values[d])
        target = cur[d] + delta
        if delta == 0:
            return None
        step = 1 if delta > 0 else -1
        target = max(0, min(n - 1, target))
        while 0 <= target < n and target != cur[d]:
            nxt = list(cur)
            nxt[d] = target
            t = (nxt[0], nxt[1], nxt[2])
            if sub.contains(point_at(sub, t)):
                return t
            target += step
        return None


__all__ = ["AutoCCLSearcher"]
