"""ReduceScatter and AllReduce from bundled AllGathers (synth/reduce_bundled.py): reduces of
overlapping runs chained per chunk, the order shared by every translate of the refined fabric
(docs/synthesis.md, "ReduceScatter and AllReduce at scale"). Small fabrics cut as h800-rail-512
is; the semantic checker proves each schedule computes its collective without a race."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from synth_helpers import check_plan, make_cluster
from test_synth_bundled import ASTRA_3TIER, SIMPLE, _bundled, _dims, _shuffled, _split_sketches

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.limits import first_selected
from ccltune.model.formats.msccl.stream import write_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.schedule.check import ScheduleError, check_schedule
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.arrays import sorted_unique
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth import assemble as asm
from ccltune.synth import engine
from ccltune.synth import reduce_bundled as rb
from ccltune.topology.load import load_text

REDUCING = (Collective.REDUCESCATTER, Collective.ALLREDUCE)


@pytest.mark.parametrize("fabric", ["8x8", "3tier"])
def test_every_bundle_reversed_computes_its_collective_and_times_symmetrically(fabric: str) -> None:
    """Every split sketch: the ReduceScatter and the AllReduce built from its bundle pass the
    checker (every reduce into one buffer ordered against the others: runs of different stages
    overlap), and the symmetric engine times them exactly as the heap engine, also shuffled."""
    topo = make_cluster(8, 8) if fabric == "8x8" else load_text(ASTRA_3TIER)
    budget = 8 if fabric == "8x8" else 5
    router = Router(topo)
    sizes = [d.size for d in _dims(topo)]
    sketches = _split_sketches(topo, budget)
    assert len(sketches) >= 4
    for sk in sketches:
        ag = _bundled(topo, sk)
        for coll in REDUCING:
            s = rb.from_allgather(coll, ag, sizes, "t")
            assert s.collective == coll
            check_schedule(s.to_schedule())
            # the same runs as the AllGather (each once more for AllReduce), all reduces first
            assert int(s.count.sum()) == int(ag.count.sum()) * (1 if coll == REDUCING[0] else 2)
            full = simulate(s, topo, 1 << 24, SIMPLE, router, engine="heap").time_us
            for x in (s, _shuffled(s, 2)):
                sym = simulate(x, topo, 1 << 24, SIMPLE, router, engine="symmetric",
                               fallback="heap")  # fmt: skip
                assert sym.note == "", (sk.label(_dims(topo)), coll, sym.note)
                assert sym.time_us == pytest.approx(full, rel=1e-9)


def test_reduces_of_overlapping_runs_are_chained_per_chunk() -> None:
    """A bundle whose later stage forwards a run containing an earlier stage's: the reversed
    reduces into that GPU overlap in chunks, and dropping the per-chunk chain (keeping only the
    reversed data deps) is a race the checker names."""
    topo = make_cluster(8, 8)
    sk = next(s for s in _split_sketches(topo, 8)
              if s.split(_dims(topo)) == ((2, 4), (2, 4)))  # fmt: skip
    ag = _bundled(topo, sk)
    rs = rb.reverse_bundled(ag, "t", [8, 8])
    check_schedule(rs.to_schedule())
    runs: dict[int, list[tuple[int, int]]] = {}
    for i in range(len(rs)):
        runs.setdefault(int(rs.dst[i]), []).append((int(rs.chunk[i]), int(rs.count[i])))
    assert any(a[0] < b[0] + b[1] and b[0] < a[0] + a[1] and a != b
               for got in runs.values() for a in got for b in got)  # fmt: skip
    # Only the AllGather's own dependencies, reversed: nothing orders reduces into one buffer.
    with pytest.raises(ScheduleError):
        check_schedule(_reversed_deps_only(rs, ag).to_schedule())


def _reversed_deps_only(rs: ScheduleArrays, ag: ScheduleArrays) -> ScheduleArrays:
    """`rs` with only the AllGather's dependencies, reversed (no chain per chunk)."""
    pos = {(int(rs.dst[i]), int(rs.src[i]), int(rs.chunk[i])): i for i in range(len(rs))}
    of = np.asarray([pos[(int(ag.src[i]), int(ag.dst[i]), int(ag.chunk[i]))]
                     for i in range(len(ag))], dtype=np.int64)  # fmt: skip
    owner = np.repeat(np.arange(len(ag)), np.diff(ag.dep_ptr))
    n = len(rs)
    e = sorted_unique(of[ag.dep_idx] * n + of[owner])
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(e // n, minlength=n), out=ptr[1:])
    return replace(rs, dep_ptr=ptr, dep_idx=e % n)


def test_engine_builds_reducing_bundles_only_where_nothing_else_fits() -> None:
    """8 x 16 within 8 threadblocks (every unbundled split variant is over the executor's
    steps, as on h800-rail-512): ReduceScatter and AllReduce get the shortlist's bundle, which
    lowers within 8 threadblocks and 64 steps. 8 x 8 within 8: ReduceScatter's unbundled
    variants fit, no bundle; AllReduce gets its bundle beside unbundled ones, which fit since
    sub-spreads act on aligned blocks (one peer per span-2 part, not two)."""
    for coll in REDUCING:
        res = engine.synthesize(make_cluster(8, 16), coll, [1 << 10, 1 << 26],
                                max_threadblocks=8, evaluate=False)  # fmt: skip
        assert 1 <= len(res.schedules) <= asm.BUNDLE_SHORTLIST
        for lb, arr in res.schedules.items():
            assert lb.endswith("/bundled")
            assert arr.collective == coll
            lower_msccl(arr.to_schedule(), max_threadblocks=8).require(max_threadblocks=8)
        fits = engine.synthesize(make_cluster(8, 8), coll, [1 << 10, 1 << 26],
                                 max_threadblocks=8, evaluate=False)  # fmt: skip
        bundled = [lb.endswith("/bundled") for lb in fits.schedules]
        # ReduceScatter's unbundled variants fit there; AllReduce has both kinds
        assert bundled and not any(bundled) if coll == REDUCING[0] else 0 < sum(bundled) < len(bundled)


def test_reducing_bundles_pass_the_executors_own_code(tmp_path: Path) -> None:
    """ReduceScatter and AllReduce bundles of 8 x 8 lowered within 8 threadblocks and written
    as the engine writes them: msccl-executor-nccl's own parser loads each (conformance kit)."""
    topo = make_cluster(8, 8)
    dims = _dims(topo)
    sk = asm.bundled_picks(dims, _split_sketches(topo, 8), None, [100.0, 25.0], 1, 32)[0]
    ag = _bundled(topo, sk)
    names = []
    for coll in REDUCING:
        s = rb.from_allgather(coll, ag, [8, 8], "t")
        low = lower_msccl(s.to_schedule(), max_threadblocks=8)
        low.require(max_threadblocks=8)
        start = first_selected(coll, 64, engine._chunks_per_loop(s), 1)
        assert start is not None
        names.append(f"{coll.value}-64r-bundled-LL")
        xml = tmp_path / "msccl" / f"{names[-1]}.xml"
        xml.parent.mkdir(exist_ok=True)
        with xml.open("w", encoding="utf-8") as fh:
            write_lowering(low, fh, name=names[-1], proto="LL", nchannels=s.channels,
                           min_bytes=start, max_bytes=None, inplace=True)  # fmt: skip
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    for name in names:
        assert f"PASS msccl/{name}.xml load" in out
