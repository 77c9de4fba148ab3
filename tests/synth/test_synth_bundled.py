"""Bundled AllGather on aligned splits: several roots' chunks per transfer, sub-spreads inside
aligned blocks, and the symmetric simulator on the refined fabric's translations.

On h800-rail-512 these are the only schedules within 16 threadblocks and 64 steps
(docs/synthesis.md, "Bundled AllGather"); the tests use small fabrics cut the same way."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from synth_helpers import check_plan, make_cluster

from ccltune.api.cluster import ClusterTopology, Dimension
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.formats.msccl.limits import first_selected
from ccltune.model.formats.msccl.stream import write_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.schedule.check import check_schedule
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.model.sim.symmetric_sim import prepare_symmetric, refined_sizes
from ccltune.model.sim.translations import Translations
from ccltune.synth import assemble as asm
from ccltune.synth import engine
from ccltune.synth.milp import solve
from ccltune.synth.sketch import Sketch, search
from ccltune.topology.load import load_text

SIMPLE = protocol_cost("Simple")


def _dims(topo: ClusterTopology) -> list[Dimension]:
    assert topo.dimensions is not None
    return topo.dimensions


def _bundled(topo: ClusterTopology, sk: Sketch, max_count: int = 64) -> ScheduleArrays:
    dims = _dims(topo)
    pats = asm.Patterns({asm.stage_demand(dims, st, True, 1).key():
                         solve(asm.stage_demand(dims, st, True, 1).canonical())
                         for st in sk.stages})  # fmt: skip
    return asm.allgather_bundled(asm.Fabric(dims), [asm.Column(sk, 1)], pats, 1, "t",
                                 max_count=max_count)  # fmt: skip


def _split_sketches(topo: ClusterTopology, budget: int) -> list[Sketch]:
    sketches, stats = search(_dims(topo), max_peers=budget)
    assert stats.split
    return [sk for sk in sketches if sk.relay is None]


def _shuffled(s: ScheduleArrays, seed: int) -> ScheduleArrays:
    """The same schedule with its transfers in a random order (deps renumbered)."""
    perm = np.random.default_rng(seed).permutation(len(s))
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(s))
    deps = [inv[s.dep_idx[s.dep_ptr[i]:s.dep_ptr[i + 1]]] for i in perm]
    ptr = np.zeros(len(s) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in deps], out=ptr[1:])
    return ScheduleArrays(
        name=s.name, collective=s.collective, nranks=s.nranks, chunks_per_rank=s.chunks_per_rank,
        src=s.src[perm], dst=s.dst[perm], chunk=s.chunk[perm], count=s.count[perm],
        reduce=s.reduce[perm], channel=s.channel[perm], dep_ptr=ptr,
        dep_idx=np.concatenate(deps).astype(np.int64), channels=s.channels,
    )  # fmt: skip


def test_aligned_bundles_are_allgathers_with_one_run_length_per_stage() -> None:
    """Every split sketch of 8 x 8 (budget 6): the bundle computes the AllGather (checker),
    carries every chunk once per receiver, and every GPU sends the same counts (aligned blocks:
    no GPU's run wraps around a dimension's end and splits)."""
    topo = make_cluster(8, 8)
    sketches = _split_sketches(topo, 6)
    assert len(sketches) >= 4
    for sk in sketches:
        b = _bundled(topo, sk)
        check_schedule(b.to_schedule())
        assert int(b.count.sum()) == 64 * 63
        per_gpu = [sorted(b.count[b.src == r].tolist()) for r in range(64)]
        assert all(c == per_gpu[0] for c in per_gpu), sk.label(_dims(topo))


def test_bundled_steps_counts_the_busiest_send_stream() -> None:
    """`bundled_steps` (digits alone) equals the built schedule's most transfers from one GPU
    to one peer, for every split sketch of two fabrics and two run caps."""
    for topo, budget in ((make_cluster(8, 8), 6), (make_cluster(8, 4), 5)):
        dims = _dims(topo)
        for sk in _split_sketches(topo, budget):
            for cap in (64, 4):
                b = _bundled(topo, sk, max_count=cap)
                _, per_pair = np.unique(b.src.astype(np.int64) * 4096 + b.dst, return_counts=True)
                assert asm.bundled_steps(dims, sk, cap) == int(per_pair.max()), sk.label(dims)


def test_symmetric_engine_times_bundles_exactly_on_the_refined_fabric() -> None:
    """The bundle is not N translates on the fabric's own group (8 x 8) but is on the refined
    one (each split dimension cut into its digits): the symmetric engine finds that group and
    gives the heap engine's time, also with the transfers shuffled (a file's order)."""
    topo = make_cluster(8, 8)
    router = Router(topo)
    sk = next(s for s in _split_sketches(topo, 8)
              if s.split(_dims(topo)) == ((2, 4), (2, 4)))  # fmt: skip
    b = _bundled(topo, sk)
    assert refined_sizes(b, [8, 8]) == [2, 4, 2, 4]
    q = prepare_symmetric(b, topo, router, SIMPLE)
    assert not isinstance(q, str), q
    assert q.images > 1
    for size in (1 << 16, 1 << 26):
        full = simulate(b, topo, size, SIMPLE, router, engine="heap").time_us
        for s in (b, _shuffled(b, 1)):
            sym = simulate(s, topo, size, SIMPLE, router, engine="symmetric", fallback="heap")
            assert sym.note == "", sym.note
            assert sym.time_us == pytest.approx(full, rel=1e-9)


def test_refinement_is_only_tried_not_trusted() -> None:
    """A schedule that moves along a split dimension in more than one digit at once keeps the
    fabric's own size there; one whose deps break the refined symmetry is simulated in full."""
    topo = make_cluster(8, 8)
    sk = next(s for s in _split_sketches(topo, 8)
              if s.split(_dims(topo)) == ((2, 4), (2, 4)))  # fmt: skip
    b = _bundled(topo, sk)
    grp = Translations([8, 8])
    skewed = b.dst.copy()
    skewed[0] = int(grp.add(b.src[:1].astype(np.int64), np.array([3]))[0])  # 3 = digits (1, 1): two at once
    assert refined_sizes(_with_dst(b, skewed), [8, 8]) == [8, 2, 4]  # the other keeps its cut
    # Drop one dependency of one transfer: still a valid order, no longer symmetric.
    has = np.flatnonzero(np.diff(b.dep_ptr) > 0)[0]
    keep = np.ones(len(b.dep_idx), dtype=bool)
    keep[b.dep_ptr[has]] = False
    ptr = b.dep_ptr.copy()
    ptr[has + 1:] -= 1
    broken = _with_deps(b, ptr, b.dep_idx[keep])
    q = prepare_symmetric(broken, topo, Router(topo), SIMPLE)
    assert isinstance(q, str)


def _with_dst(b: ScheduleArrays, dst: np.ndarray) -> ScheduleArrays:
    return replace(b, dst=dst.astype(np.int32))


def _with_deps(b: ScheduleArrays, ptr: np.ndarray, idx: np.ndarray) -> ScheduleArrays:
    return replace(b, dep_ptr=ptr, dep_idx=idx)


def test_engine_bundles_only_where_nothing_else_fits() -> None:
    """8 x 16 within 8 threadblocks: every unbundled split variant needs more steps than the
    executor allows, so the engine assembles the bundled AllGather of the shortlist
    (`bundled_picks`) and nothing else. 8 x 8 within 8: unbundled variants fit, no bundle
    is built (its files cost more to time: docs/synthesis-scale.md)."""
    res = engine.synthesize(make_cluster(8, 16), Collective.ALLGATHER, [1 << 10, 1 << 26],
                            max_threadblocks=8, evaluate=False)  # fmt: skip
    assert 1 <= len(res.schedules) <= asm.BUNDLE_SHORTLIST
    assert all(lb.endswith("/bundled") for lb in res.schedules)
    fits = engine.synthesize(make_cluster(8, 8), Collective.ALLGATHER, [1 << 10, 1 << 26],
                             max_threadblocks=8, evaluate=False)  # fmt: skip
    assert fits.schedules
    assert not [lb for lb in fits.schedules if lb.endswith("/bundled")]


ASTRA_3TIER = """
topology: [ Switch, Switch, Switch ]
npus_count: [ 4, 4, 2 ]
bandwidth: [ 150.0, 50.0, 25.0 ]
latency: [ 300.0, 3500.0, 4000.0 ]
"""


def test_every_bundle_of_a_three_tier_fabric_takes_the_symmetric_engine() -> None:
    """Every split sketch of a 4 x 4 x 2 switch fabric within 5 peers: its bundle is timed by
    the symmetric engine (each connection's runs queue in an order every translate shares)
    exactly as by the heap engine."""
    topo = load_text(ASTRA_3TIER)
    router = Router(topo)
    sketches = _split_sketches(topo, 5)
    assert len(sketches) >= 4
    for sk in sketches:
        b = _bundled(topo, sk)
        full = simulate(b, topo, 1 << 24, SIMPLE, router, engine="heap").time_us
        sym = simulate(b, topo, 1 << 24, SIMPLE, router, engine="symmetric", fallback="heap")
        assert sym.note == "", (sk.label(_dims(topo)), sym.note)
        assert sym.time_us == pytest.approx(full, rel=1e-9)


def test_bundled_files_pass_the_executors_own_parser(tmp_path: Path) -> None:
    """Bundles lowered within the budget (8 x 8, 8 threadblocks) and written as the engine
    writes them: msccl-executor-nccl's own parser loads each file (conformance kit)."""
    topo = make_cluster(8, 8)
    dims = _dims(topo)
    picks = asm.bundled_picks(dims, _split_sketches(topo, 8), None, [100.0, 25.0], 2, 32)
    assert len(picks) == 2
    names = []
    # One byte range each (below 1 MiB with LL, above with Simple), as the engine's ranges.
    for k, (sk, proto, lo, hi) in enumerate(zip(picks, ("LL", "Simple"), (1, 1 << 20),
                                                (1 << 20, 0), strict=True)):  # fmt: skip
        b = _bundled(topo, sk)
        low = lower_msccl(b.to_schedule(), max_threadblocks=8)
        low.require(max_threadblocks=8)
        start = first_selected(Collective.ALLGATHER, 64, engine._chunks_per_loop(b), lo, hi)
        assert start is not None
        names.append(f"allgather-64r-bundled{k}-{proto}")
        out = tmp_path / "msccl" / f"{names[-1]}.xml"
        out.parent.mkdir(exist_ok=True)
        with out.open("w", encoding="utf-8") as fh:
            write_lowering(low, fh, name=names[-1], proto=proto, nchannels=b.channels,
                           min_bytes=start, max_bytes=hi - 1 if hi else None, inplace=True)  # fmt: skip
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    for name in names:
        assert f"PASS msccl/{name}.xml load" in out
