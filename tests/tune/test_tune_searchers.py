"""Searchers: seeded and reproducible, within budget, only valid proposals, and effective."""

from __future__ import annotations

import pytest
from tune_helpers import preset

from ccltune.api.common import Collective
from ccltune.api.plan import TaskKey
from ccltune.tune.default import nccl_default_config, nccl_prior
from ccltune.tune.fabric import facts_for
from ccltune.tune.profilers.simulated import SimulatedProfiler
from ccltune.tune.searchers import (
    SEARCHERS,
    AutoCCLSearcher,
    GridSearcher,
    MracoSearcher,
    Prior,
    make_searcher,
)
from ccltune.tune.space import Config, Impl, Subspace, TaskSpace, build_space
from ccltune.tune.tuner import communicator_topology

KEY = TaskKey(collective="allreduce", min_bytes=64 << 20, max_bytes=(128 << 20) - 1, ranks=8, nodes=1)


def setup(noise: float = 0.02, seed: int = 0):
    topo = preset("dgx-h100-1")
    facts = facts_for(topo, 8, 1)
    space = build_space(Collective.ALLREDUCE, facts)
    prof = SimulatedProfiler(topo, noise=noise, seed=seed)
    members = set(space)

    def evaluate(config: Config, reps: int) -> float:
        assert config in members, config  # never propose outside the valid space
        return prof.measure(KEY, KEY.min_bytes, config, reps).time_us

    return space, prof, evaluate


@pytest.mark.parametrize("name", SEARCHERS)
def test_seeded_runs_are_reproducible_and_within_budget(name: str) -> None:
    runs = []
    for _ in range(2):
        space, _, evaluate = setup()
        runs.append(make_searcher(name).search(space, evaluate, 30, seed=7))
    a, b = runs
    assert [(t.config, t.value, t.reps) for t in a.trials] == [(t.config, t.value, t.reps) for t in b.trials]
    assert a.best == b.best and 1 <= a.n_trials <= 30
    space, _, evaluate = setup()
    other = make_searcher(name).search(space, evaluate, 30, seed=8)
    if name in ("random", "mraco"):
        assert [t.config for t in other.trials] != [t.config for t in a.trials]


def test_grid_without_noise_finds_the_exhaustive_optimum() -> None:
    space, prof, evaluate = setup(noise=0.0)
    result = GridSearcher().search(space, evaluate, len(space), seed=0)
    true = {c: prof.true_time_us(KEY, KEY.min_bytes, c) for c in space}
    assert result.converged and result.n_trials == len(space)
    assert result.best == min(true, key=lambda c: (true[c], c))


def test_autoccl_gets_near_the_optimum_with_a_tenth_of_the_trials() -> None:
    space, prof, evaluate = setup(noise=0.01)
    true = {c: prof.true_time_us(KEY, KEY.min_bytes, c) for c in space}
    optimum = min(true.values())
    result = AutoCCLSearcher().search(space, evaluate, len(space) // 10, seed=0)
    assert true[result.best] <= optimum * 1.02
    assert result.n_trials <= len(space) // 10


def test_autoccl_converges_on_a_small_space() -> None:
    space, _, evaluate = setup(noise=0.0)
    small = TaskSpace(space.collective, tuple(s for s in space.subspaces if s.impl.protocol == "LL128"))
    result = AutoCCLSearcher().search(small, evaluate, 1000, seed=0)
    assert result.converged and result.reason == "every subspace converged"
    assert result.n_trials < len(small)


def test_mraco_prunes_with_repetitions_and_converges() -> None:
    space, prof, evaluate = setup(noise=0.03)
    topo = preset("dgx-h100-1")
    facts = facts_for(topo, 8, 1)
    start = nccl_default_config(Collective.ALLREDUCE, KEY.min_bytes, facts, space, communicator_topology(topo, KEY)).config
    prior = nccl_prior(Collective.ALLREDUCE, KEY.min_bytes, facts, space)
    result = MracoSearcher(window=8, startup_trials=8).search(space, evaluate, 400, seed=1, start=start, prior=prior)
    assert any(t.pruned for t in result.trials)  # Hyperband stopped some trials early
    assert any(t.reps == 9 for t in result.trials)
    assert result.n_measurements < 9 * result.n_trials
    assert result.converged and "converged" in result.reason and result.n_trials < 400
    true = {c: prof.true_time_us(KEY, KEY.min_bytes, c) for c in space}
    assert true[result.best] <= min(true.values()) * 1.10


def toy_space() -> tuple[TaskSpace, dict[Config, float]]:
    """Four subspaces; the optimum is ring/LL at 16 channels, two grid steps from 8."""
    channels = (1, 2, 4, 8, 12, 16, 24, 32)
    impls = [Impl("ring", "LL"), Impl("ring", "LL128"), Impl("ring", "Simple"), Impl("tree", "LL")]
    subs = tuple(Subspace(i, (channels, (512,), (4 << 20,))) for i in impls)
    times = {c: (10.0 + abs(channels.index(c.channels) - 5) if c.impl == impls[0] else 20.0)
             for s in subs for c in s}
    return TaskSpace(Collective.ALLREDUCE, subs), times


@pytest.mark.parametrize("name", ["autoccl", "mraco"])
def test_informed_searchers_measure_nccl_default_first(name: str) -> None:
    space, times = toy_space()
    start = Config(Impl("tree", "LL"), 8, 512, 4 << 20)  # last in the space's order
    result = make_searcher(name).search(space, lambda c, r: times[c], 12, seed=0, start=start)
    assert result.trials[0].config == start


def test_a_tight_budget_goes_to_the_subspaces_the_prior_finds_plausible() -> None:
    space, times = toy_space()
    ll = Impl("ring", "LL")
    prior = Prior({s.impl: (10.0 if s.impl == ll else 50.0) for s in space.subspaces})
    start = Config(ll, 8, 512, 4 << 20)
    optimum = min(times, key=lambda c: times[c])
    # 3 trials < 2 per subspace: without a prior they go to one look at each subspace...
    blind = AutoCCLSearcher().search(space, lambda c, r: times[c], 3, seed=0, start=start)
    assert {t.config.impl for t in blind.trials} != {ll} and blind.best != optimum
    # ...with it they descend the plausible one and reach the optimum.
    informed = AutoCCLSearcher().search(space, lambda c, r: times[c], 3, seed=0, start=start, prior=prior)
    assert informed.best == optimum and "3 subspaces the prior found implausible not visited" in informed.reason
    mraco = MracoSearcher().search(space, lambda c, r: times[c], 3, seed=0, start=start, prior=prior)
    assert {t.config.impl for t in mraco.trials} == {ll}


def test_autoccl_steps_never_jump_over_a_measured_point() -> None:
    sub = Subspace(Impl("ring", "LL"), ((1, 2, 4, 8, 12, 16, 24, 32), (512,), (4 << 20,)))
    assert AutoCCLSearcher._move(sub, [0, 0, 0, 0], 0, 7) == (7, 0, 0, 0)
    measured = {sub.config((8, 512, 4 << 20, 1))}  # index 3 did not improve: the optimum is before it
    assert AutoCCLSearcher._move(sub, [0, 0, 0, 0], 0, 7, measured) == (1, 0, 0, 0)
    assert AutoCCLSearcher._move(sub, [2, 0, 0, 0], 0, 7, measured) == (3, 0, 0, 0)  # adjacent: the point itself
    assert AutoCCLSearcher._move(sub, [7, 0, 0, 0], 0, -7, measured) == (5, 0, 0, 0)


def test_sparse_replayed_subspace_only_proposes_existing_points() -> None:
    impl = Impl("ring", "Simple")
    points = frozenset({(2, 512, 4 << 20), (8, 512, 4 << 20), (32, 512, 4 << 20)})
    sub = Subspace(impl, ((2, 8, 32), (512,), (4 << 20,)), points)
    space = TaskSpace(Collective.ALLREDUCE, (sub,))
    values = {2: 30.0, 8: 20.0, 32: 25.0}

    def evaluate(config: Config, reps: int) -> float:
        assert sub.contains(config.point)
        return values[config.channels]

    for name in SEARCHERS:
        start = Config(impl, 16, 512, 4 << 20)  # not in the table: projected to an existing point
        result = make_searcher(name).search(space, evaluate, 10, seed=0, start=start)
        assert result.best.channels == 8, name


def test_budget_must_be_positive() -> None:
    space, _, evaluate = setup()
    for name in SEARCHERS:
        with pytest.raises(ValueError, match="budget must be at least 1"):
            make_searcher(name).search(space, evaluate, 0, seed=0)
    with pytest.raises(ValueError, match="unknown 'annealing'"):
        make_searcher("annealing")
