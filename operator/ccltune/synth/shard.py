"""Solving many sub-demands: once per isomorphism class, in-process or in a process pool.

`plan_shards` / `solve_shard` / `merge` and the JSON wire format would let the classes be spread
over pods too, but the operator shards whole syntheses instead (units.py): the MILPs here are a
small part of a synthesis' time (docs/synthesis.md, "What is sharded").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from .group import GroupTopo
from .milp import NODE_LIMIT, SubDemand, SubSchedule, solve


@dataclass(frozen=True, slots=True)
class ShardPlan:
    demands: tuple[SubDemand, ...]  # canonical, one per isomorphism class
    shards: tuple[tuple[int, ...], ...]  # demand indices per shard
    node_limit: int  # branch-and-bound nodes per sub-demand (work, not seconds)


def _weight(d: SubDemand) -> int:
    return d.pieces * len(d.group.links()) * max(1, len(d.receivers))


def plan_shards(
    demands: Iterable[SubDemand], shards: int, *, node_limit: int = NODE_LIMIT
) -> ShardPlan:
    """Dedupe by isomorphism class and spread the classes over `shards` (largest first)."""
    unique: dict[tuple[object, ...], SubDemand] = {}
    for d in demands:
        unique.setdefault(d.key(), d.canonical())
    ds = tuple(unique.values())
    n = max(1, min(shards, len(ds)))
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(ds)), key=lambda i: -_weight(ds[i])):
        j = load.index(min(load))
        bins[j].append(i)
        load[j] += _weight(ds[i])
    return ShardPlan(ds, tuple(tuple(b) for b in bins), node_limit)


def solve_shard(plan: ShardPlan, index: int) -> list[SubSchedule]:
    if not 0 <= index < len(plan.shards):
        raise ValueError(f"shard index {index} not in 0..{len(plan.shards) - 1}")
    return [solve(plan.demands[i], node_limit=plan.node_limit) for i in plan.shards[index]]


def merge(results: Iterable[Iterable[SubSchedule]]) -> dict[tuple[object, ...], SubSchedule]:
    out: dict[tuple[object, ...], SubSchedule] = {}
    for shard in results:
        for s in shard:
            out[s.demand.key()] = s
    return out


# Work (sum of `_weight`) below which a pool costs more than it saves: it forks this process
# per worker (0.1-0.6 s of wall under load at 100 MB-1 GB resident), and the heaviest issue 18
# row, h800-rail-512 AllGather (45k), solves its MILPs in 0.08 + 0.28 s in-process
# (docs/synthesis-scale.md, "The second core").
POOL_MIN_WEIGHT = 200_000


def solve_all(
    demands: Iterable[SubDemand], *, workers: int = 1, node_limit: int = NODE_LIMIT,
    pool_min_weight: int = POOL_MIN_WEIGHT,
) -> dict[tuple[object, ...], SubSchedule]:  # fmt: skip
    """Every distinct sub-demand solved once; `workers` > 1 uses a process pool where the
    MILPs weigh at least `pool_min_weight`. The result is the same either way."""
    plan = plan_shards(demands, max(1, workers), node_limit=node_limit)
    light = sum(_weight(d) for d in plan.demands) < pool_min_weight
    if workers <= 1 or len(plan.shards) <= 1 or light:
        return merge(solve_shard(plan, i) for i in range(len(plan.shards)))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        parts = list(pool.map(solve_shard, [plan] * len(plan.shards), range(len(plan.shards))))
    return merge(parts)


# ---- wire format for an Indexed Job ---------------------------------------------------------


def _demand_dict(d: SubDemand) -> dict[str, object]:
    g = d.group
    return {
        "group": {"kind": g.kind, "size": g.size, "bandwidthGbps": g.bandwidth_gbps,
                  "latencyUs": g.latency_us, "lanes": [list(x) for x in g.lanes]},
        "sources": list(d.sources), "receivers": list(d.receivers),
        "symmetric": d.symmetric, "pieces": d.pieces, "origins": list(d.origins),
    }  # fmt: skip


def _demand_of(x: dict) -> SubDemand:
    g = x["group"]
    lanes = tuple((int(u), int(v), int(k)) for u, v, k in g.get("lanes", []))
    group = GroupTopo(g["kind"], int(g["size"]), float(g["bandwidthGbps"]), float(g["latencyUs"]),
                      lanes)  # fmt: skip
    return SubDemand(group, tuple(x["sources"]), tuple(x["receivers"]), bool(x["symmetric"]),
                     int(x["pieces"]), tuple(int(o) for o in x.get("origins", [])))  # fmt: skip


def plan_json(plan: ShardPlan) -> str:
    return json.dumps({
        "demands": [_demand_dict(d) for d in plan.demands],
        "shards": [list(s) for s in plan.shards],
        "nodeLimit": plan.node_limit,
    })  # fmt: skip


def plan_from_json(text: str) -> ShardPlan:
    x = json.loads(text)
    return ShardPlan(
        tuple(_demand_of(d) for d in x["demands"]),
        tuple(tuple(int(i) for i in s) for s in x["shards"]),
        int(x["nodeLimit"]),
    )


def results_json(results: list[SubSchedule]) -> str:
    return json.dumps([
        {"demand": _demand_dict(s.demand), "sends": [list(t) for t in s.sends],
         "epochs": s.epochs, "status": s.status, "solveS": s.solve_s, "milp": s.milp,
         "nodes": s.nodes, "greedyEpochs": s.greedy_epochs}
        for s in results
    ])  # fmt: skip


def results_from_json(text: str) -> list[SubSchedule]:
    out = []
    for x in json.loads(text):
        sends = tuple((int(t[0]), int(t[1]), int(t[2]), int(t[3])) for t in x["sends"])
        demand = _demand_of(x["demand"])
        stats = (bool(x.get("milp", False)), int(x.get("nodes", 0)), int(x.get("greedyEpochs", 0)))
        out.append(
            SubSchedule(
                demand, sends, int(x["epochs"]), str(x["status"]), float(x["solveS"]), *stats
            )
        )
    return out
