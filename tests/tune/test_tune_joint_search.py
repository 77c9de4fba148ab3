"""TuCCL's joint space: NCCL algorithms and MSCCL schedule variants searched together.

Replay tables come from the simulated surface (noise-free): NCCL's sweep rows (algorithm x
protocol x channels) and MSCCL variant rows (schedule x protocol x channels x instances), written
in the replay CSV schema and read back by the replay profiler. Each searcher must land within 2%
of the table's best in >= 95% of (collective, size) cases with <= 25% of the exhaustive trials,
however the variants are named and listed (the names decide the order a table sorts them in).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import cache

import pytest

from ccltune.api.common import Collective
from ccltune.api.plan import TaskKey
from ccltune.topology.load import load_cluster
from ccltune.tune.default import nccl_default_config, nccl_prior
from ccltune.tune.fabric import FabricFacts, facts_for
from ccltune.tune.profilers.base import ProfilerError
from ccltune.tune.profilers.replay import ReplayProfiler
from ccltune.tune.profilers.simulated import SimulatedProfiler, simulated_variants, sweep_csv
from ccltune.tune.searchers import AutoCCLSearcher, MracoSearcher
from ccltune.tune.searchers.base import point_at, start_index
from ccltune.tune.space import (
    Config,
    Impl,
    ScheduleVariant,
    TaskSpace,
    build_space,
    check_config,
    msccl_algorithm,
)

PRESETS = (("dgx-h100-1", 8, 1), ("dgx-a100-2", 16, 2), ("mi300x-8", 8, 1))
COLLECTIVES = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER)
SIZES = (16 << 10, 1 << 20, 32 << 20, 512 << 20)
SHARE = 0.25  # of the exhaustive trials
WITHIN = 0.02
HIT_RATE = 0.95


@cache
def _truth(preset: str, ranks: int, nodes: int) -> tuple[str, dict[tuple[Collective, int], dict[Config, float]]]:
    """The table's CSV text for a preset, and its times per (collective, size) and configuration
    (schedule family names: `msccl:ring`, ...), read back through the replay profiler."""
    topo = load_cluster(preset)
    text = sweep_csv(topo, ranks, nodes, COLLECTIVES, SIZES)
    prof = ReplayProfiler(runtime="msccl")
    prof.add_sweep_csv(text, f"{preset}.csv")
    facts = facts_for(topo, ranks, nodes)
    truth: dict[tuple[Collective, int], dict[Config, float]] = {}
    for coll in COLLECTIVES:
        for size in SIZES:
            key = TaskKey(collective=coll, min_bytes=size, max_bytes=size, ranks=ranks, nodes=nodes)
            space = prof.space(key, facts, build_space(coll, facts))
            truth[(coll, size)] = {c: prof.measure(key, size, c).time_us for c in space}
    return text, truth


def _permuted_table(text: str, perm: int) -> tuple[str, dict[str, str]]:
    """The table with rows shuffled and the schedule variants renamed in a random order."""
    rng = random.Random(perm)
    lines = text.splitlines()
    header, body = lines[0], lines[1:]
    families = sorted({ln.split(",")[2] for ln in body if ln.split(",")[2].startswith("msccl:")})
    labels = [f"v{i}" for i in range(len(families))]
    rng.shuffle(labels)
    names = {f: msccl_algorithm(lbl) for f, lbl in zip(families, labels, strict=True)}
    renamed = []
    for ln in body:
        cells = ln.split(",")
        cells[2] = names.get(cells[2], cells[2])
        renamed.append(",".join(cells))
    rng.shuffle(renamed)
    return "\n".join([header, *renamed]) + "\n", {v: k for k, v in names.items()}


def _start(space: TaskSpace, coll: Collective, size: int, facts: FabricFacts) -> Config | None:
    nccl_only = TaskSpace(coll, tuple(s for s in space.subspaces if not s.impl.algorithm.startswith("msccl:")))
    dflt = nccl_default_config(coll, size, facts, nccl_only).config
    for sub in space.subspaces:
        if sub.impl == dflt.impl:
            return sub.config(point_at(sub, start_index(sub, dflt)))
    return None


def _evaluator(prof: ReplayProfiler, key: TaskKey, size: int) -> Callable[[Config, int], float]:
    return lambda config, reps: prof.measure(key, size, config, reps).time_us


def _run_cases(searcher_name: str, perm: int) -> tuple[int, int, list[str]]:
    hits, cases, misses = 0, 0, []
    for preset, ranks, nodes in PRESETS:
        text, truth = _truth(preset, ranks, nodes)
        table, back = _permuted_table(text, perm)
        prof = ReplayProfiler(runtime="msccl")
        prof.add_sweep_csv(table, f"{preset}.csv")
        facts = facts_for(load_cluster(preset), ranks, nodes)
        for (coll, size), times in truth.items():
            key = TaskKey(collective=coll, min_bytes=size, max_bytes=size, ranks=ranks, nodes=nodes)
            space = prof.space(key, facts, build_space(coll, facts))
            assert len(space) == len(times)  # every variant of the table is in the searched space
            rng = random.Random(perm * 1000 + size)
            subs = list(space.subspaces)
            rng.shuffle(subs)  # and the order the space lists them in is arbitrary too
            space = TaskSpace(coll, tuple(subs))
            budget = math.floor(SHARE * len(space))
            searcher = AutoCCLSearcher() if searcher_name == "autoccl" else MracoSearcher()
            result = searcher.search(space, _evaluator(prof, key, size), budget, seed=perm,
                                     start=_start(space, coll, size, facts), prior=nccl_prior(coll, size, facts, space))
            assert result.n_trials <= budget
            best = result.best
            if best.impl.algorithm in back:
                best = Config(Impl(back[best.impl.algorithm], best.impl.protocol), best.channels, best.threads,
                              best.buffsize, best.instances)
            got, top = times[best], min(times.values())
            cases += 1
            if got <= top * (1 + WITHIN):
                hits += 1
            else:
                winner = min(times, key=lambda c: (times[c], c))
                misses.append(f"{preset} {coll} {size}: {best.label()} {got / top:.3f}x of {winner.label()}")
    return hits, cases, misses


@pytest.mark.parametrize("searcher", ["autoccl", "mraco"])
@pytest.mark.parametrize("perm", [1, 2, 3])
def test_joint_search_finds_the_best_variant_whatever_the_order(searcher: str, perm: int) -> None:
    hits, cases, misses = _run_cases(searcher, perm)
    assert cases == len(PRESETS) * len(COLLECTIVES) * len(SIZES)  # every case has its table
    assert hits >= HIT_RATE * cases, misses


def test_simulated_tables_hold_msccl_winners_and_losers() -> None:
    """The acceptance tables are not trivial: MSCCL variants win some cases and lose others."""
    wins = 0
    for preset, ranks, nodes in PRESETS:
        _, truth = _truth(preset, ranks, nodes)
        for times in truth.values():
            wins += min(times, key=lambda c: times[c]).impl.algorithm.startswith("msccl:")
    total = len(PRESETS) * len(COLLECTIVES) * len(SIZES)
    assert 0 < wins < total


def test_variant_validity_and_runtime_gate() -> None:
    topo = load_cluster("dgx-a100-2")
    facts = facts_for(topo, 16, 2)
    variants = simulated_variants(Collective.ALLREDUCE, facts)
    nccl = build_space(Collective.ALLREDUCE, facts, variants=variants, runtime="nccl")
    assert not any(s.impl.algorithm.startswith("msccl:") for s in nccl.subspaces)
    assert "runtime nccl does not run MSCCL" in nccl.notes[0]
    joint = build_space(Collective.ALLREDUCE, facts, variants=variants, runtime="msccl")
    hier = {s.impl.protocol for s in joint.subspaces if s.impl.algorithm == "msccl:hierarchical"}
    assert hier == {"LL", "Simple"}  # generated for those protocols only
    assert all(c.channels * c.instances <= 32 for c in joint)  # MAXCHANNELS threadblock channels
    ring8 = Config(Impl("msccl:ring", "Simple"), 8, 512, 4 << 20, 8)
    with pytest.raises(ValueError, match="exceed MAXCHANNELS 32"):
        check_config(Collective.ALLREDUCE, ring8, facts)
    small = ScheduleVariant("allpairs", Collective.ALLREDUCE, ("LL",), (1,), max_bytes=1 << 20)
    at_size = build_space(Collective.ALLREDUCE, facts, variants=[small], runtime="rccl", size=4 << 20)
    assert not any(s.impl.algorithm.startswith("msccl:") for s in at_size.subspaces)
    assert any("not selected for 4194304 bytes" in n for n in at_size.notes)
    with pytest.raises(ProfilerError, match="no model of schedule"):
        SimulatedProfiler(topo, noise=0.0).true_time_us(
            TaskKey(collective="allreduce", min_bytes=1024, max_bytes=1024, ranks=16, nodes=2), 1024,
            Config(Impl("msccl:butterfly", "LL"), 1, 512, 4 << 20))
