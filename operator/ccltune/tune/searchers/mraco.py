"""TuCCL's MRACO search on optuna: TPE exploration, Hyperband pruning with repetitions as the
resource, and convergence by gain and by the stability of what the sampler proposes.

- Exploration: optuna's TPE sampler (seeded, multivariate, grouped for the conditional resource
  parameters of each implementation subspace). The implementation (NCCL algorithm or MSCCL
  schedule variant, protocol, transport) is one categorical parameter over the sorted labels, so
  the order a space lists its subspaces in does not matter. Warm start: NCCL's default is enqueued as the
  first trial, then its resources in every other subspace in the prior's order, so TPE's startup
  trials are the prior's best guesses and its model sees every implementation. When the budget
  is under two trials per subspace, the search is restricted to the subspaces the prior finds
  plausible (prior.visit_order).
- Multi-resource: a trial is measured one repetition at a time, reporting the running mean;
  Hyperband (min 1, max `max_reps` repetitions, reduction factor 3) stops unpromising trials after
  few repetitions, so most of the measurement time goes to good configurations.
- Polish: the last `polish` share of the budget (and whatever convergence leaves) measures the
  unmeasured grid neighbours (one step along each ordered resource) of the best configuration of
  every subspace whose best is within `polish_margin` of the incumbent, in rounds (best first, one
  step each: to the first faster neighbour, or the subspace is settled): TPE finds the promising
  subspaces and regions, local steps settle their resources, so close subspaces are compared
  settled (docs/tuning.md).
- Convergence: stop when the best completed value improved by less than `gain_eps` over the last
  `window` completed trials AND the share of trials per implementation subspace in that window
  differs from the window before by at most `tv_eps` (total variation distance).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass

import optuna

from ..space import DIMS, Config, Subspace, TaskSpace
from .autoccl import AutoCCLSearcher
from .base import Evaluate, SearchResult, Trial, check_budget, nearest_member, point_at, start_index
from .prior import PRIOR_MARGIN, Prior, visit_order

optuna.logging.set_verbosity(optuna.logging.WARNING)



@dataclass
class MracoSearcher:
    max_reps: int = 9
    reduction_factor: int = 3
    window: int = 12
    gain_eps: float = 0.005
    tv_eps: float = 0.25
    startup_trials: int = 10
    warm_start: bool = True
    ei_candidates: int = 64  # TPE candidates per suggestion (optuna default 24; see docs)
    prior_margin: float = PRIOR_MARGIN  # see prior.visit_order
    polish: float = 0.4  # share of the budget kept for local steps around the incumbents
    polish_margin: float = 0.15  # subspaces this close to the incumbent are polished too
    name: str = "mraco"

    def search(
        self, space: TaskSpace, evaluate: Evaluate, budget: int, seed: int, start: Config | None = None,
        prior: Prior | None = None,
    ) -> SearchResult:
        check_budget(budget)
        visits = visit_order(space, budget, start, prior, self.prior_margin)
        subs = {s.impl.label(): s for s in visits}
        labels = sorted(subs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, n_ei_candidates=self.ei_candidates,
                n_startup_trials=min(self.startup_trials + (len(visits) if self.warm_start else 0),
                                     max(3, budget // 4)),
            )
        pruner = optuna.pruners.HyperbandPruner(
            min_resource=1, max_resource=self.max_reps, reduction_factor=self.reduction_factor
        )
        # Hyperband assigns brackets by hashing the study name: fix it so runs repeat.
        study = optuna.create_study(
            study_name=f"mraco-{seed}", direction="minimize", sampler=sampler, pruner=pruner
        )
        # Warm start: NCCL's default first, then one trial in every other visited subspace (as
        # AutoCCL's phase 1), so TPE's model sees every implementation.
        for sub in visits if self.warm_start else visits[:1]:
            if start is not None or self.warm_start:
                study.enqueue_trial(self._params(sub, sub.config(point_at(sub, start_index(sub, start)))))
        trials: list[Trial] = []
        done: dict[Config, Trial] = {}
        completed: list[Trial] = []
        best_hist: list[float] = []
        reason = f"budget of {budget} trials spent"
        converged = False
        attempts = 0
        explore = budget - int(self.polish * budget) if budget >= len(visits) + 5 else budget
        while len(trials) < explore and attempts < 4 * budget:
            attempts += 1
            ot = study.ask()
            label = ot.suggest_categorical("impl", labels)
            sub = subs[label]
            config = self._config(ot, sub)
            if config in done:  # the sampler proposed a measured point again: answer from the log
                prev = done[config]
                state = optuna.trial.TrialState.PRUNED if prev.pruned else optuna.trial.TrialState.COMPLETE
                study.tell(ot, prev.value if not prev.pruned else None, state=state)
                continue
            total, reps, pruned = 0.0, 0, False
            for rep in range(1, self.max_reps + 1):
                total += evaluate(config, 1)
                reps = rep
                ot.report(total / reps, step=rep)
                if rep < self.max_reps and ot.should_prune():
                    pruned = True
                    break
            trial = Trial(config, total / reps, reps, pruned)
            trials.append(trial)
            done[config] = trial
            if pruned:
                study.tell(ot, state=optuna.trial.TrialState.PRUNED)
                continue
            study.tell(ot, trial.value)
            completed.append(trial)
            best_hist.append(min(t.value for t in completed))
            if self._converged(completed, best_hist):
                converged = True
                reason = "converged: no gain and a stable proposal distribution"
                break
        if not trials:
            raise ValueError("MRACO made no trial (empty space?)")
        self._polish(subs, evaluate, budget, trials, done, completed)
        pool = completed or trials
        best = min(pool, key=lambda t: (t.value, t.config))
        return SearchResult(best.config, best.value, trials, converged, reason)

    def _polish(self, subs: dict[str, Subspace], evaluate: Evaluate, budget: int, trials: list[Trial],
                done: dict[Config, Trial], completed: list[Trial]) -> None:  # fmt: skip
        leaders: dict[str, Trial] = {}
        # Pruned trials count here: Hyperband stops a trial for being worse than its bracket's
        # best, and its running mean can still put its subspace within the margin.
        for t in sorted(trials, key=lambda t: (t.value, t.config)):
            leaders.setdefault(t.config.impl.label(), t)
        top = min(t.value for t in leaders.values()) if leaders else 0.0
        active = {lbl: t for lbl, t in leaders.items() if t.value <= top * (1 + self.polish_margin)}
        # Rounds over the close subspaces, best first: each takes one step (the first faster
        # neighbour) or is settled, so the budget is spread over them instead of spent on one.
        while active and len(trials) < budget:
            for label in sorted(active, key=lambda lbl: (active[lbl].value, lbl)):
                moved = self._step(subs[label], active[label], evaluate, budget, trials, done, completed)
                if moved is None:
                    del active[label]
                else:
                    active[label] = moved
                if len(trials) >= budget:
                    return

    def _step(self, sub: Subspace, best: Trial, evaluate: Evaluate, budget: int, trials: list[Trial],
              done: dict[Config, Trial], completed: list[Trial]) -> Trial | None:  # fmt: skip
        """Measure `best`'s unmeasured grid neighbours until one is faster; None if none is."""
        idx = [sub.values[d].index(v) for d, v in enumerate(best.config.point)]
        moves = (AutoCCLSearcher._move(sub, idx, d, step) for d in range(len(idx)) for step in (1, -1))
        fresh = [c for c in (sub.config(point_at(sub, m)) for m in moves if m is not None) if c not in done]
        for config in fresh:
            if len(trials) >= budget:
                return None
            value = sum(evaluate(config, 1) for _ in range(self.max_reps)) / self.max_reps
            trial = Trial(config, value, self.max_reps)
            trials.append(trial)
            done[config] = trial
            completed.append(trial)
            if value < best.value:
                return trial
        return None

    def _converged(self, completed: list[Trial], best_hist: list[float]) -> bool:
        w = self.window
        if len(completed) < 2 * w:
            return False
        old, new = best_hist[-w - 1], best_hist[-1]
        if (old - new) / old > self.gain_eps:
            return False
        recent = Counter(t.config.impl.label() for t in completed[-w:])
        before = Counter(t.config.impl.label() for t in completed[-2 * w : -w])
        keys = set(recent) | set(before)
        tv = 0.5 * sum(abs(recent[k] / w - before[k] / w) for k in keys)
        return tv <= self.tv_eps

    @staticmethod
    def _params(sub: Subspace, config: Config) -> dict[str, object]:
        params: dict[str, object] = {"impl": sub.impl.label()}
        for d, name in enumerate(DIMS):
            if len(sub.values[d]) > 1:
                params[f"{sub.impl.label()}:{name}"] = config.point[d]
        return params

    @staticmethod
    def _config(ot: optuna.trial.Trial, sub: Subspace) -> Config:
        point: list[int] = []
        for d, name in enumerate(DIMS):
            vals = sub.values[d]
            point.append(vals[0] if len(vals) == 1 else int(ot.suggest_categorical(f"{sub.impl.label()}:{name}", vals)))
        p = tuple(point)
        if not sub.contains(p):  # a sparse grid (table, variant) lacks this point: take the nearest one it has
            near = nearest_member(sub, tuple(vals.index(v) for v, vals in zip(p, sub.values, strict=True)))
            assert near is not None
            p = point_at(sub, near)
        return sub.config(p)


__all__ = ["MracoSearcher"]
