"""Sub-demand MILP: valid patterns, never worse than the greedy warm start, bounds respected."""

from __future__ import annotations

import pytest

from ccltune.synth.group import GroupTopo
from ccltune.synth.milp import SubDemand, _lower_bound, _prune, _valid, greedy, solve


@pytest.mark.parametrize("kind,size", [("switch", 4), ("switch", 8), ("ring", 5), ("ring", 8),
                                       ("fully_connected", 4)])  # fmt: skip
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("pieces", [1, 2, 3])
def test_patterns_deliver_every_piece(kind: str, size: int, symmetric: bool, pieces: int) -> None:
    d = SubDemand(GroupTopo(kind, size, 100.0, 1.0), (0,), tuple(range(1, size)), symmetric, pieces)
    s = solve(d, node_limit=200)
    assert _valid(d, list(s.sends))
    assert s.epochs >= _lower_bound(d)
    g = greedy(d)
    assert s.epochs <= 1 + max(t for t, *_ in g)
    # Every receiver gets every piece exactly once (first arrivals only).
    got = [(p, v) for _, p, _, v in s.sends]
    assert sorted(got) == sorted({(p, r) for p in range(pieces) for r in d.receivers})


def test_milp_beats_naive_direct_broadcast_in_a_switch() -> None:
    # One source, 3 receivers, 3 pieces: direct sends need 9 epochs; relaying halves it.
    d = SubDemand(GroupTopo("switch", 4, 100.0, 0.0), (0,), (1, 2, 3), False, 3)
    # Work limits only (nodes, simplex iterations): machine load cannot turn this into "greedy".
    s = solve(d)
    assert s.status == "optimal"
    assert s.epochs <= 5


def test_symmetric_ring_broadcast_is_bandwidth_optimal() -> None:
    # All translates at once: each of the 2 link classes carries one piece per epoch.
    d = SubDemand(GroupTopo("ring", 6, 100.0, 0.0), (0,), tuple(range(1, 6)), True, 2)
    s = solve(d)
    assert s.epochs == 5  # ceil(2 pieces * 5 receivers / 2 classes)


def test_isomorphic_demands_share_a_key_and_map() -> None:
    g = GroupTopo("switch", 8, 100.0, 0.0)
    a = SubDemand(g, (0,), (3,), True, 1)
    b = SubDemand(g, (0,), (5,), True, 1)
    assert a.key() == b.key()
    mapped = solve(a.canonical()).mapped(b)
    assert [(u, v) for _, _, u, v in mapped.sends] == [(0, 5)]
    ring = GroupTopo("ring", 8, 100.0, 0.0)
    assert SubDemand(ring, (0,), (3,), True, 1).key() != SubDemand(ring, (0,), (5,), True, 1).key()


def test_same_demand_same_pattern_and_zero_nodes_means_greedy() -> None:
    d = SubDemand(GroupTopo("switch", 6, 100.0, 0.0), (0,), (1, 2, 3, 4, 5), False, 3)
    first, again = solve(d), solve(d)
    assert (first.sends, first.status) == (again.sends, again.status)
    assert first.status == "optimal" and first.epochs < 1 + max(t for t, *_ in greedy(d))
    lazy = solve(d, node_limit=0)
    assert lazy.status == "greedy"
    assert list(lazy.sends) == _prune(d, greedy(d))
