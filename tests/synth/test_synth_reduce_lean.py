"""The latency-lean AllReduce for many servers (synth/reduce_small.py): few chunks per loop, so
msccl-executor-nccl selects it at 1 KiB; correct and race-free by construction (the checker
proves it); within the SM budget; loaded by the executor's own parser (conformance kit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan, make_cluster

from ccltune.api.cluster import Dimension
from ccltune.api.common import Collective
from ccltune.model.formats.msccl.limits import first_selected
from ccltune.model.formats.msccl.stream import render_lowering, write_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.schedule.check import ScheduleError, check_schedule
from ccltune.model.schedule.ir import Schedule, Transfer
from ccltune.model.sim.routing import Router
from ccltune.synth import engine, timed
from ccltune.synth import reduce_small as rsm
from ccltune.synth.grid import file_time


def _dims(local: int, *outer: int) -> list[Dimension]:
    return [Dimension(name=f"d{i}", kind="switch", size=n, bandwidth_gbps=100.0, latency_us=1.0)
            for i, n in enumerate((local, *outer))]  # fmt: skip


def test_outer_dimensions_cut_into_levels_of_at_most_eight() -> None:
    assert rsm.levels(_dims(8, 64)) == [rsm.Level(8, 8), rsm.Level(64, 8)]
    assert rsm.levels(_dims(8, 4, 4)) == [rsm.Level(8, 4), rsm.Level(32, 4)]
    assert rsm.levels(_dims(8, 16)) == [rsm.Level(8, 4), rsm.Level(32, 4)]
    assert rsm.levels(_dims(8, 32)) == [rsm.Level(8, 4), rsm.Level(32, 8)]
    assert rsm.levels(_dims(8, 6)) == [rsm.Level(8, 6)]
    assert rsm.levels(_dims(8, 12)) is None  # no cut into levels of at most 8
    # the busiest GPU's peers, one threadblock each: h800-rail-512 fits 16 only with the ring
    assert [rsm.leader_peers(_dims(8, 64), m) for m in rsm.INTRA_MODES] == [21, 17, 16]
    assert rsm.leader_peers(_dims(8, 64), "direct", 4) == 16  # levels 4 x 4 x 4
    assert rsm.variants(_dims(8, 64), 16) == [("ring", 8), ("direct", 4)]
    assert rsm.variants(_dims(8, 4, 4), 12) == [("halving", 8)]  # radix 4 cuts it alike
    assert rsm.variants(_dims(8, 4), 16) == []  # 32 GPUs: below the small-message target
    assert rsm.label(_dims(8, 64), "direct", 4) == "lean/direct/4x4x4"


@pytest.mark.parametrize("outer", [(8,), (4, 4), (16,), (2, 2, 2)])
@pytest.mark.parametrize("intra", rsm.INTRA_MODES)
def test_lean_allreduce_is_correct_race_free_and_selected_at_1k(intra: str,
                                                                outer: tuple[int, ...]) -> None:  # fmt: skip
    dims = _dims(8, *outer)
    arr = rsm.small_allreduce(dims, intra, "t")
    assert arr is not None and arr.collective == Collective.ALLREDUCE
    check_schedule(arr.to_schedule())
    top = (rsm.levels(dims) or [])[-1].size
    assert arr.chunks_per_rank == 8 * top
    # selected at 1 KiB and up for 1-, 2- and 4-byte elements (limits.first_selected)
    start = first_selected(Collective.ALLREDUCE, arr.nranks, engine._chunks_per_loop(arr), 1)
    assert start is not None and start <= 1 << 10
    assert arr.count.max() <= 32  # cnt stays below the executor's MSCCL_MAX_COUNT (72)


def test_chained_reduces_are_what_keeps_it_race_free() -> None:
    """Every reduce into a (GPU, chunk) waits for the one before it; without those waits
    (the data dependencies alone) the checker finds the race."""
    s = rsm.small_allreduce(_dims(8, 4, 4), "direct", "t")
    assert s is not None
    sched = s.to_schedule()
    ts = sched.transfers

    def overlaps(a: Transfer, b: Transfer) -> bool:
        return a.dst == b.dst and a.chunk < b.chunk + b.count and b.chunk < a.chunk + a.count

    cut = [Transfer(t.src, t.dst, t.chunk, t.count, t.reduce,
                    tuple(d for d in t.deps if not (t.reduce and ts[d].reduce and overlaps(t, ts[d]))),
                    t.channel) for t in ts]  # fmt: skip
    assert cut != ts
    with pytest.raises(ScheduleError):
        check_schedule(Schedule("t", Collective.ALLREDUCE, s.nranks, s.chunks_per_rank, cut))


def test_lean_file_on_64_gpus_passes_the_executors_own_code(tmp_path: Path) -> None:
    """Each intra-server mode on 8 servers x 8 GPUs, lowered within 16 threadblocks and written
    as the engine writes it: msccl-executor-nccl's parser loads it; our executor model runs it
    with LL without a deadlock, faster at 1 KiB than at 64 KiB."""
    topo = make_cluster(8, 8)
    router = Router(topo)
    dims = topo.dimensions
    assert dims is not None
    names = []
    ranges = [(1, 1 << 12), ((1 << 12) + 1, 1 << 16), ((1 << 16) + 1, None)]  # one file selected each
    for intra, (lo, hi) in zip(rsm.INTRA_MODES, ranges, strict=True):
        arr = rsm.small_allreduce(dims, intra, "t")
        assert arr is not None
        low = lower_msccl(arr.to_schedule(), max_threadblocks=16, order="early")
        low.require(max_threadblocks=16)
        text = render_lowering(low, name=intra, proto="LL", nchannels=1)
        small, larger = (file_time(Collective.ALLREDUCE, s, topo, router, text)
                         for s in (1 << 10, 1 << 16))  # fmt: skip
        assert isinstance(small, float) and isinstance(larger, float), (small, larger)
        assert small < larger
        names.append(f"allreduce-64r-lean-{intra}-LL")
        xml = tmp_path / "msccl" / f"{names[-1]}.xml"
        xml.parent.mkdir(exist_ok=True)
        with xml.open("w", encoding="utf-8") as fh:
            write_lowering(low, fh, name=names[-1], proto="LL", nchannels=1, min_bytes=lo,
                           max_bytes=hi, inplace=True)  # fmt: skip
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    for name in names:
        assert f"PASS msccl/{name}.xml load" in out


def test_engine_publishes_the_lean_file_where_it_is_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 servers x 8 GPUs within 8 threadblocks (only bundles fit the search's variants): at
    1 KiB the engine times the lean AllReduce's file beside them and publishes it, faster than
    NCCL's default and every other file; at 64 MiB it is not used. (With evaluate=False the
    search's variants alone: test_synth_reduce_bundled.) Every schedule here is given a
    time-ordered twin, as on the 3-tier fabric, where the lean files were once left untimed
    because the twins replaced them."""
    real = timed.timed_lowering

    def always(arr, budget, pairing, times, schedule=None):  # type: ignore[no-untyped-def]
        low = real(arr, budget, pairing, times, schedule)
        return low or lower_msccl(arr.to_schedule(), max_threadblocks=budget, pairing=pairing,
                                  order="early")  # fmt: skip

    monkeypatch.setattr(timed, "timed_lowering", always)
    topo = make_cluster(8, 16)
    res = engine.synthesize(topo, Collective.ALLREDUCE, [1 << 10, 1 << 26], max_threadblocks=8)
    small, large = res.sizes
    assert small.chosen.startswith("lean/ring/4x4"), small.chosen
    assert small.estimate.time_us < small.default.time_us
    assert not large.chosen.startswith("lean/")
