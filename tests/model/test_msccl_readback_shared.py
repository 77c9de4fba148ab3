"""A read-back's per-rank work, cut without changing it (issue 18): no garbage collection
during a read, `slots` asked once per step count, and the values every rank's steps and
transfers hold shared as one int object each. Counted in collections, calls and objects,
never in seconds; that the read-backs are unchanged is test_synth_orbit_once.py's and
test_synth_orbit_readback.py's (full reads), and test_msccl_readback_cpu.py's (`execute`)."""

from __future__ import annotations

import gc
from collections import Counter

from ccltune.api.common import Collective
from ccltune.model.formats.msccl import reader
from ccltune.model.formats.msccl.executor import RECV_TYPES, SEND_TYPES, Program, XStep, execute
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.schedule.ir import Schedule, Transfer

RANKS, CHUNKS = 32, 40  # offsets, chunks and step uids past 256 (CPython's cached ints)


def _ring_text() -> str:
    """An AllGather ring of RANKS ranks, CHUNKS chunks a rank: every rank rank 0's translate."""
    ts = [Transfer(r, (r + 1) % RANKS, (r - k) % RANKS * CHUNKS, CHUNKS, False,
                   () if k == 0 else ((k - 1) * RANKS + (r - 1) % RANKS,))
          for k in range(RANKS - 1) for r in range(RANKS)]  # fmt: skip
    low = lower_msccl(Schedule("ring", Collective.ALLGATHER, RANKS, CHUNKS, ts))
    return render_lowering(low, name="ring", proto="Simple", nchannels=1)


def _read(text: str) -> tuple[reader.ReadBack, reader._Read]:
    reader._READS.clear()
    try:
        rb = reader.read_msccl(text)
        return rb, next(iter(reader._READS.values()))
    finally:
        reader._READS.clear()


def test_a_read_runs_no_collection_of_its_own() -> None:
    """The read's objects all live to its end: a collection during it only walks them. One may
    run as it ends (its allocations counted while collection was off)."""
    text = _ring_text()
    runs: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        _read(text)
    finally:
        gc.callbacks.remove(count)
    assert gc.isenabled()
    assert len(runs) <= 1, runs


def test_slots_are_asked_once_per_step_count() -> None:
    _, _, tbs = reader._parse_each(_ring_text())
    prog = Program.wire(tbs)
    asked: list[int] = []

    def slots(x: XStep) -> int:
        asked.append(x.cnt)
        return 4 * x.cnt

    execute(prog, slots)
    counts = {x.cnt for x in prog.steps if x.type in SEND_TYPES | RECV_TYPES}
    assert sorted(asked) == sorted(counts)
    assert len(prog.steps) > 10 * len(counts)  # asked per step, it would be far more


def _objects_per_value(values: list[int]) -> int:
    """The most int objects any one value is held as."""
    ids: dict[int, set[int]] = {}
    for v in values:
        ids.setdefault(v, set()).add(id(v))
    return max(len(s) for s in ids.values())


def test_translated_steps_hold_one_object_a_value() -> None:
    text = _ring_text()
    maps: list = []
    got = reader._parse_translated(text, maps)
    assert got is not None and maps  # read through rank 0
    steps = [x for g in got[2][1:] for t in g for x in t]
    moved = [v for x in steps for v in (x.send, x.recv, x.srcoff, x.dstoff)]
    assert max(moved) > 256
    assert _objects_per_value(moved) == 1
    # and their values are those the element by element parse gives
    each = [x for g in reader._parse_each(text)[2][1:] for t in g for x in t]
    assert [v for x in each for v in (x.send, x.recv, x.srcoff, x.dstoff)] == moved


def test_transfers_moved_per_orbit_hold_one_object_a_value() -> None:
    rb, seen = _read(_ring_text())
    transfers = rb.schedule.transfers
    assert len(transfers) == RANKS * (RANKS - 1)
    chunks = [t.chunk for t in transfers]
    assert max(chunks) > 256 and _objects_per_value(chunks) == 1
    # each transfer's sending step is named by that step's own uid object
    assert max(seen.senders) > 256
    assert all(u is seen.prog.steps[u].uid for u in seen.senders)
    assert Counter(t.src for t in transfers) == Counter(dict.fromkeys(range(RANKS), RANKS - 1))
