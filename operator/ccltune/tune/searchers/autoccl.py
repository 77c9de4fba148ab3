"""AutoCCL's search (NSDI'25, section 4): divide and conquer over NCCL's parameters.

1. Implementation subspaces (algorithm x protocol x transport) are few: each is looked at once,
   NCCL's default first (a known-good incumbent), then the others in the order a prior (NCCL's
   static model, see prior.py) predicts, each at NCCL's default resources projected onto it. When
   the budget is under two trials per subspace, only the subspaces the prior finds plausible are
   looked at (prior.visit_order); otherwise all are, as in AutoCCL.
2. Inside each subspace the resource parameters (channels, threads, buffer size) are tuned by
   coordinate descent with an adaptive step: a step that improves is taken and doubled, a
   dimension that does not improve halves its step. A step never jumps over a point already
   measured on its line; it goes halfway to it (bisection of the bracket the optimum is in).
   Subspaces are descended best-first (by their starting point), so a tight budget goes to the
   promising ones; with `prune_margin` set, a subspace whose start is that much slower than the
   best start is skipped (off by default, as in AutoCCL, which descends every subspace).
3. Convergence: a full round over the dimensions at step 1 without a relative gain above `eps`
   (measurement noise level) ends a subspace; the search ends when every visited subspace
   converged or the budget is spent. A step that lands on a plateau (within `flat_tol`) probes up
   to `plateau` steps further before giving up on that direction (NCCL's surfaces have flat
   stretches, e.g. buffer sizes above the per-channel share of the message).
4. Noise: a gain smaller than `confirm`, or a loss smaller than `tie`, is re-measured (both
   points, `confirm_reps` more repetitions each) before it is judged, so noise neither walks the
   descent off course nor hides a real small gain.
5. The `finalists` best configurations are re-measured with `verify_reps` more repetitions and
   the winner is picked on the combined mean (no new configurations, so no extra trials).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from ..space import Config, Subspace, TaskSpace
from .base import (
    BudgetExhausted,
    Evaluate,
    Index,
    Log,
    SearchResult,
    check_budget,
    point_at,
    start_index,
)
from .prior import PRIOR_MARGIN, Prior, visit_order


@dataclass
class AutoCCLSearcher:
    eps: float = 0.01
    prune_margin: float | None = None
    plateau: int = 2  # steps probed across a flat stretch before giving up on a direction
    flat_tol: float = 0.05  # "flat" = within this of the current value (above the noise level)
    confirm: float = 0.06  # gains below this are confirmed with `confirm_reps` more repetitions
    confirm_reps: int = 2
    tie: float = 0.03  # ... and so are results up to this much worse
    finalists: int = 3  # best configurations re-measured at the end
    verify_reps: int = 2  # extra repetitions for each finalist
    prior_margin: float = PRIOR_MARGIN  # see prior.visit_order
    reps: int = 1
    name: str = "autoccl"

    def search(
        self, space: TaskSpace, evaluate: Evaluate, budget: int, seed: int, start: Config | None = None,
        prior: Prior | None = None,
    ) -> SearchResult:
        check_budget(budget)
        log = Log(evaluate, budget, self.reps)
        starts: list[tuple[float, int, Subspace, Index]] = []
        visits = visit_order(space, budget, start, prior, self.prior_margin)
        converged = True
        reason = "every subspace converged"
        try:
            for i, sub in enumerate(visits):
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
        if len(visits) < len(space.subspaces):
            skipped = len(space.subspaces) - len(visits)
            reason += f" ({skipped} subspaces the prior found implausible not visited)"
        self._verify(log)
        best, value = log.best()
        return SearchResult(best, value, log.trials, converged, reason, extra_measurements=log.verified)

    def _descend(self, sub: Subspace, idx: Index, value: float, log: Log) -> None:
        dims = [d for d in range(len(sub.values)) if len(sub.values[d]) > 1]
        steps = {d: max(1, len(sub.values[d]) // 4) for d in dims}
        cur, cur_v = list(idx), value
        while dims:
            improved = False
            at_one = all(steps[d] == 1 for d in dims)  # converge only after a round at step 1
            for d in dims:
                moved = False
                for direction in (1, -1):
                    probe, flats = list(cur), 0
                    while True:
                        nxt = self._move(sub, probe, d, direction * steps[d], log.cache)
                        if nxt is None:
                            break
                        cand = sub.config(point_at(sub, nxt))
                        v = log(cand)
                        if cur_v * (1 - self.confirm) < v < cur_v * (1 + self.tie) and self.confirm_reps:
                            # A small gain (or a near tie) may be noise: measure both points again.
                            v = log.refine(cand, self.confirm_reps)
                            cur_v = log.refine(sub.config(point_at(sub, tuple(cur))), self.confirm_reps)
                        if v < cur_v * (1 - self.eps):
                            cur, cur_v = list(nxt), v
                            probe, flats = list(nxt), 0
                            moved = improved = True
                            steps[d] = min(steps[d] * 2, len(sub.values[d]) - 1)
                        elif v <= cur_v * (1 + self.flat_tol) and flats < self.plateau:
                            probe, flats = list(nxt), flats + 1  # flat: look past the plateau
                        else:
                            break
                    if moved:
                        break
                if not moved:
                    steps[d] = max(1, steps[d] // 2)
            if not improved and at_one:
                return

    def _verify(self, log: Log) -> None:
        """Re-measure the closest contenders so that noise does not pick the winner."""
        ranked = sorted(log.cache, key=lambda c: (log.cache[c], c))[: self.finalists]
        if len(ranked) < 2 or self.verify_reps < 1:
            return
        for c in ranked:
            log.refine(c, self.verify_reps)

    @staticmethod
    def _move(sub: Subspace, cur: list[int], d: int, delta: int, measured: Container[Config] = ()) -> Index | None:
        """Step along dimension d; in a sparse (replayed) grid, go on to the next existing point.

        A step never jumps over a point already measured on this line: it goes halfway to it
        instead (the optimum of a unimodal line lies before a point that did not improve)."""
        n = len(sub.values[d])
        if delta == 0:
            return None
        step = 1 if delta > 0 else -1
        target = max(0, min(n - 1, cur[d] + delta))

        def at(i: int) -> Index:
            nxt = list(cur)
            nxt[d] = i
            return tuple(nxt)

        between = range(cur[d] + step, target, step)
        known = next((i for i in between if sub.config(point_at(sub, at(i))) in measured), None)
        if known is not None:
            target = cur[d] + step * max(1, abs(known - cur[d]) // 2)
        while 0 <= target < n and target != cur[d]:
            if sub.contains(point_at(sub, at(target))):
                return at(target)
            target += step
        return None


__all__ = ["AutoCCLSearcher"]
