"""What a searcher believes before measuring, and which subspaces a budget can afford to visit.

A `Prior` predicts each implementation subspace's time (lower is better). Visiting rule, shared
by AutoCCL and MRACO:
- the subspace of the start configuration (NCCL's default, a known-good incumbent) comes first,
  then the others in order of predicted time (without a prior: the space's order);
- when the budget allows at least `AFFORD_PER_SUBSPACE` trials per subspace, every subspace is
  visited (AutoCCL's rule);
- otherwise only subspaces predicted within `margin` of the best prediction are visited, so a tight
  budget goes to descending the plausible ones instead of one look at each of the hopeless ones;
  subspaces the prior has no prediction for (MSCCL schedule variants: NCCL's model does not know
  them) are always visited, after the predicted ones: a prior only prunes what it can judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..space import Config, Impl, Subspace, TaskSpace

AFFORD_PER_SUBSPACE = 2  # one look plus at least one descent step per subspace
PRIOR_MARGIN = 1.25  # how far NCCL's static model may be off and still be worth a look (docs/tuning.md)


@dataclass(frozen=True)
class Prior:
    predicted_us: Mapping[Impl, float]  # per subspace
    source: str = ""

    def predicted(self, impl: Impl) -> float:
        return self.predicted_us.get(impl, float("inf"))

    def knows(self, impl: Impl) -> bool:
        return impl in self.predicted_us


def visit_order(
    space: TaskSpace, budget: int, start: Config | None, prior: Prior | None, margin: float = PRIOR_MARGIN
) -> list[Subspace]:
    """The subspaces to visit, in the order to visit them (see the module docstring)."""
    subs = list(space.subspaces)
    if prior is not None:
        subs.sort(key=lambda s: prior.predicted(s.impl))  # stable: ties keep the space's order
    if start is not None:
        subs.sort(key=lambda s: s.impl != start.impl)
    if prior is None or budget >= AFFORD_PER_SUBSPACE * len(subs):
        return subs
    best = min(prior.predicted(s.impl) for s in subs)
    return [s for i, s in enumerate(subs)
            if i == 0 or not prior.knows(s.impl) or prior.predicted(s.impl) <= best * margin]


__all__ = ["AFFORD_PER_SUBSPACE", "PRIOR_MARGIN", "Prior", "visit_order"]
