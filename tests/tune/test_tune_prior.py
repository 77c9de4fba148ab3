"""The searchers' prior (NCCL's static model), the visiting rule, and the replayed stand-in default."""

from __future__ import annotations

from tune_helpers import preset

from ccltune.api.common import Collective
from ccltune.tune.default import nccl_prior, nearest_replayed
from ccltune.tune.fabric import FabricFacts, facts_for
from ccltune.tune.searchers.prior import AFFORD_PER_SUBSPACE, PRIOR_MARGIN, Prior, visit_order
from ccltune.tune.space import Config, Impl, Subspace, TaskSpace, build_space


def h100_space() -> tuple[TaskSpace, FabricFacts]:
    facts = facts_for(preset("dgx-h100-1"), 8, 1)
    return build_space(Collective.ALLREDUCE, facts), facts


def test_nccl_prior_ranks_protocols_by_message_size() -> None:
    space, facts = h100_space()
    small = nccl_prior(Collective.ALLREDUCE, 4096, facts, space)
    large = nccl_prior(Collective.ALLREDUCE, 1 << 30, facts, space)
    assert set(small.predicted_us) == {s.impl for s in space.subspaces}
    assert min(small.predicted_us, key=small.predicted).protocol == "LL"  # latency-bound
    assert min(large.predicted_us, key=large.predicted) == Impl("nvls", "Simple")  # bandwidth-bound
    best = min(large.predicted_us.values())
    assert large.predicted(Impl("ring", "LL")) > 2 * best  # LL's bandwidth cap is hopeless at 1 GiB


def toy_space(n: int = 4) -> TaskSpace:
    impls = [Impl("ring", p) for p in ("LL", "LL128", "Simple")] + [Impl("tree", "LL")]
    subs = tuple(Subspace(i, ((1, 2, 4, 8), (512,), (4 << 20,))) for i in impls[:n])
    return TaskSpace(Collective.ALLREDUCE, subs)


def test_visit_order_puts_the_start_first_then_follows_the_prior() -> None:
    space = toy_space()
    ll, ll128, simple, tree = (s.impl for s in space.subspaces)
    prior = Prior({ll: 30.0, ll128: 10.0, simple: 11.0, tree: 12.0})
    start = Config(tree, 2, 512, 4 << 20)
    ample = AFFORD_PER_SUBSPACE * len(space.subspaces)
    assert [s.impl for s in visit_order(space, ample, start, prior)] == [tree, ll128, simple, ll]
    assert [s.impl for s in visit_order(space, ample, None, None)] == [ll, ll128, simple, tree]


def test_tight_budget_visits_only_what_the_prior_finds_plausible() -> None:
    space = toy_space()
    ll, ll128, simple, tree = (s.impl for s in space.subspaces)
    prior = Prior({ll: 100.0, ll128: 10.0, simple: 10.0 * PRIOR_MARGIN, tree: 13.0})
    start = Config(ll, 2, 512, 4 << 20)  # NCCL's default stays, however the prior rates it
    tight = AFFORD_PER_SUBSPACE * len(space.subspaces) - 1
    assert [s.impl for s in visit_order(space, tight, start, prior)] == [ll, ll128, simple]
    assert len(visit_order(space, tight + 1, start, prior)) == 4  # affordable: every subspace
    assert len(visit_order(space, tight, start, None)) == 4  # no prior: nothing to prune on


def test_nearest_replayed_default() -> None:
    _, facts = h100_space()
    ring_simple = Impl("ring", "Simple")
    points = frozenset({(4, 512, 4 << 20), (16, 512, 4 << 20)})
    sub = Subspace(ring_simple, ((4, 16), (512,), (4 << 20,)), points)
    tree = Subspace(Impl("tree", "Simple"), ((2,), (512,), (4 << 20,)), frozenset({(2, 512, 4 << 20)}))
    table = TaskSpace(Collective.ALLREDUCE, (sub, tree))
    # The same implementation, nearest channel count.
    wanted = Config(ring_simple, 12, 512, 4 << 20)
    assert nearest_replayed(Collective.ALLREDUCE, 1 << 20, wanted, table, facts) == Config(ring_simple, 16, 512, 4 << 20)
    # An implementation the table lacks: the entry NCCL's static model ranks first (ring beats
    # tree/Simple at 1 MiB on 8 GPUs of one node).
    absent = Config(Impl("nvls", "Simple"), 32, 512, 4 << 20)
    got = nearest_replayed(Collective.ALLREDUCE, 1 << 20, absent, table, facts)
    assert got is not None and got.impl == ring_simple
    empty = TaskSpace(Collective.ALLREDUCE, ())
    assert nearest_replayed(Collective.ALLREDUCE, 1 << 20, wanted, empty, facts) is None
