"""Sharding interface: shards cover each isomorphism class once; JSON round trip; pool = serial."""

from __future__ import annotations

import pytest

from ccltune.synth.group import GroupTopo
from ccltune.synth.milp import SubDemand
from ccltune.synth.shard import (
    merge,
    plan_from_json,
    plan_json,
    plan_shards,
    results_from_json,
    results_json,
    solve_all,
    solve_shard,
)


def _demands() -> list[SubDemand]:
    sw, ring = GroupTopo("switch", 8, 100.0, 1.0), GroupTopo("ring", 5, 50.0, 0.5)
    out = [SubDemand(sw, (0,), (o,), True, 1) for o in range(1, 8)]  # one class
    out += [SubDemand(ring, (0,), tuple(range(1, 5)), s, p) for s in (False, True) for p in (1, 2)]
    return out


def test_plan_dedupes_and_covers() -> None:
    plan = plan_shards(_demands(), 3)
    assert len(plan.demands) == 5
    assert sorted(i for s in plan.shards for i in s) == list(range(5))


def test_indexed_job_round_trip_matches_in_process() -> None:
    plan = plan_from_json(plan_json(plan_shards(_demands(), 2, node_limit=200)))
    parts = [results_from_json(results_json(solve_shard(plan, i))) for i in range(len(plan.shards))]
    merged = merge(parts)
    local = solve_all(_demands(), workers=1, node_limit=200)
    assert set(merged) == set(local)
    for k, s in merged.items():
        assert s.epochs == local[k].epochs


def test_process_pool() -> None:
    assert set(solve_all(_demands(), workers=2, node_limit=200, pool_min_weight=0)) == set(
        solve_all(_demands(), workers=1, node_limit=200)
    )


def test_light_milps_stay_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forking costs more than MILPs this light save: no pool, the same result."""
    import ccltune.synth.shard as shard

    def no_pool(*_a: object, **_k: object) -> None:
        raise AssertionError("a process pool was started")

    monkeypatch.setattr(shard, "ProcessPoolExecutor", no_pool)
    assert set(solve_all(_demands(), workers=2, node_limit=200)) == set(
        solve_all(_demands(), workers=1, node_limit=200)
    )
