"""Timing a large file holds memory by the block and the caches hold it by the byte
(docs/synthesis-scale.md, "Session 10: the rail rings within 2 GB"). Every bound here is in
bytes allocated (tracemalloc) or counted, never in seconds."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model import evaluate
from ccltune.model.formats.msccl import rail_ring_reduce as lowering
from ccltune.model.formats.msccl import reader, slicing
from ccltune.model.formats.msccl.rail_ring import rail_ring_allgather
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.sim import symmetric_sim
from ccltune.model.sim.routing import Router
from ccltune.synth import rail_ring as rings
from ccltune.synth import rail_ring_reduce as rrr
from ccltune.topology.presets import load_preset

SERVERS, GPUS = 16, 4  # a ring file of 4,032 transfers, ~60k deps once sliced in 2 iterations
BLOCK = 2048  # deps a block, so the file is many blocks


@pytest.fixture(scope="module")
def ring_text() -> str:
    _, low = rail_ring_allgather(SERVERS, GPUS, "t", 16)
    return render_lowering(low, name="t", proto="Simple", nchannels=1)


def _peak(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """fn(*args) and the bytes allocated at its peak beyond what was before."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        out = fn(*args)
        return out, tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def test_slicing_and_the_quotient_peak_by_the_block(ring_text: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Slicing a file into 2 iterations and taking its quotient peak at a small multiple of
    the sliced schedule they keep, not at several int64 arrays of all its deps at once (before:
    3.9x and 6.8x here, 4.2x and 7.6x on 32 x 8; new 1.9x and 3.4x, 1.5x and 2.1x; the 512-GPU
    ring file's deps are 120 MB)."""
    monkeypatch.setattr(slicing, "_DEP_BLOCK", BLOCK)
    monkeypatch.setattr(symmetric_sim, "_DEP_BLOCK", BLOCK)
    rb = evaluate._read_back(reader.file_key(ring_text), ring_text)
    sl = slicing.slicing("Simple", 1 << 30, rb.chunks_per_loop, "allgather")
    slicing._arrays(rb)  # the file's own arrays, cached: not the slicing's
    shape, peak = _peak(slicing.structure, rb, sl, 2)
    assert shape.dep_idx.nbytes > 16 * BLOCK * 8  # many blocks
    kept = symmetric_sim._held_bytes(shape)
    assert peak < 2.5 * kept, peak / kept
    clus = make_cluster(GPUS, SERVERS)
    arrays = slicing.with_slices(shape, rb, sl)
    st, peak = _peak(symmetric_sim._structure, arrays, clus, Router(clus))
    assert not isinstance(st, str), st
    assert peak < 4.5 * kept, peak / kept


def test_the_caches_hold_at_most_their_bytes() -> None:
    """Each cache evicts the least recently used entry beyond its bytes, but keeps the newest."""
    sizes = {"a": 40, "b": 50, "c": 30, "big": 500}
    cache = evaluate._Cached(lambda k: k, sizes.__getitem__, entries=8, max_bytes=100)
    for key in ("a", "b", "a", "c"):  # "a" used again: "b" is the least recent
        cache(key)
    assert (len(cache), cache.held_bytes) == (2, 70)
    cache("big")
    assert (len(cache), cache.held_bytes) == (1, 500)  # alone, over the bound
    assert evaluate._structure.max_bytes == evaluate.STRUCTURE_BYTES
    assert evaluate._read_back.max_bytes == evaluate.READ_BACK_BYTES


def test_the_symmetric_cache_holds_at_most_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file timed at several sizes (each timing a new schedule): the quotients' cache stays
    within CACHE_BYTES, as counted by the arrays its entries hold, or holds the newest alone."""
    _, low = rail_ring_allgather(4, 4, "t", 16)
    text = render_lowering(low, name="t", proto="Simple", nchannels=1)
    clus = make_cluster(4, 4)
    router = Router(clus)
    bound = 200_000
    monkeypatch.setattr(symmetric_sim, "CACHE_BYTES", bound)
    monkeypatch.setattr(evaluate, "forget", lambda s: None)  # the published path keeps none
    symmetric_sim._CACHE.clear()
    counts = []
    for size in (1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30):
        evaluate.published_estimate("allgather", size, clus, text, router=router)
        held = [h[3] for h in symmetric_sim._CACHE.values()]
        assert sum(held) <= bound or len(held) == 1, held
        counts.append(len(held))
    assert max(counts) > 1 and min(counts[1:]) < len(counts)  # some kept, some evicted
    for s, _, st, nbytes in symmetric_sim._CACHE.values():
        assert nbytes == symmetric_sim._held_bytes(s, st) > 0
    symmetric_sim._CACHE.clear()


def test_a_published_files_quotients_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A published file timed at a size is a new schedule each call, never asked for again:
    its quotient is dropped once timed (the cache held ~150 MB of them on rail-512), and the
    times are the same as with it kept."""
    _, low = rail_ring_allgather(4, 4, "t", 16)
    text = render_lowering(low, name="t", proto="Simple", nchannels=1)
    clus = make_cluster(4, 4)
    router = Router(clus)
    sizes = (1 << 20, 1 << 26, 1 << 30)
    symmetric_sim._CACHE.clear()
    got = [evaluate.published_estimate("allgather", n, clus, text, router=router).time_us
           for n in sizes]  # fmt: skip
    assert not symmetric_sim._CACHE
    monkeypatch.setattr(evaluate, "forget", lambda s: None)
    kept = [evaluate.published_estimate("allgather", n, clus, text, router=router).time_us
            for n in sizes]  # fmt: skip
    assert symmetric_sim._CACHE and got == kept
    symmetric_sim._CACHE.clear()


def test_the_reader_keeps_a_large_program_until_another_file_is_read() -> None:
    """A large file's parsed program serves its other protocols, then goes when another file
    is read (154 MB for the 512-GPU ring); small files' stay. Read-backs are the same as read
    afresh."""
    _, low = rail_ring_allgather(4, 4, "t", 16)
    large = {p: render_lowering(low, name="t", proto=p, nchannels=1) for p in ("Simple", "LL128")}
    _, low = rail_ring_allgather(2, 2, "s", 16)
    small = render_lowering(low, name="s", proto="Simple", nchannels=1)

    def kept_large() -> list[bool]:
        return sorted(len(r.prog.steps) > 100 for r in reader._READS.values())

    with pytest.MonkeyPatch.context() as mp:  # above 2 x 2's steps, below 4 x 4's
        mp.setattr(reader, "_LARGE_STEPS", 100)
        reader._READS.clear()
        fresh = reader.read_msccl(large["LL128"]).schedule.transfers
        reader._READS.clear()
        reader.read_msccl(small)
        reader.read_msccl(large["Simple"])
        assert kept_large() == [False, True]
        again = reader.read_msccl(large["LL128"])  # from the kept program
        assert again.schedule.transfers == fresh and kept_large() == [False, True]
        reader.read_msccl(small)
        assert kept_large() == [False]
    reader._READS.clear()


@pytest.mark.parametrize(("servers", "gpus"), [(4, 8), (8, 8), (3, 4)])
def test_the_reduce_files_steps_are_counted_before_building(servers: int, gpus: int) -> None:
    """The one gate (rail_ring.MAX_FILE_STEPS) reads a file's steps before building it: exact
    for every shape that builds."""
    for coll in rrr.COLLECTIVES:
        for pieces, nrings, paired in rrr.SHAPES:
            try:
                _, low = lowering.lower(coll, servers, gpus, pieces, nrings, "t", paired)
            except MscclFormatError:
                continue
            steps = sum(len(items) for rank in low.items_of for items in rank.values())
            assert rrr.file_steps(coll, servers, gpus, pieces) == steps


def test_one_gate_in_file_steps() -> None:
    """h800-rail-64's ring files are offered, and every file the gate by ranks (<= 256) let
    through; of h800-rail-512's (0.3-0.5M steps) ReduceScatter's, AllGather's and AllReduce's, whose rows
    measured within 1,850 MB (AllGather's once a file had one read-back whatever its protocol).
    Not built here: a 512-GPU lowering is ~300 MB."""
    rail64 = load_preset("h800-rail-64").dimensions or []
    allgather, reduce_scatter, allreduce = Collective.ALLGATHER, *rrr.COLLECTIVES
    assert rings.file_steps(8, 8) == 7_808 <= rings.max_file_steps(allgather)
    assert rings.file_steps(64, 8) == 492_544 <= rings.max_file_steps(allgather)
    assert rrr.file_steps(reduce_scatter, 32, 8, 2) == 245_760 <= rings.MAX_FILE_STEPS
    assert rrr.file_steps(reduce_scatter, 64, 8, 1) == 491_520 <= rings.max_file_steps(reduce_scatter)
    # AllReduce: the one-way ring needs 127 steps in a threadblock; the both-ways ring in
    # blocks of 4 servers fits (its row measured within the margin) and nothing larger
    assert rrr.file_steps(allreduce, 64, 8, 1, 4, True) == 309_248 <= rings.max_file_steps(allreduce)
    assert rrr.file_steps(allreduce, 64, 8, 1) > rings.max_file_steps(allreduce)
    for coll in rrr.COLLECTIVES:
        got = rrr.variants(rail64, coll, 16, "t")
        assert got and all(rrr.file_steps(coll, 8, 8, int(v.label.split("/p")[1][0])) <=
                           rings.MAX_FILE_STEPS for v in got)  # fmt: skip
