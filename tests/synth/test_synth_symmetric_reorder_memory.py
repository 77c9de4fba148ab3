"""A read-back file's quotient is found without a reordered copy of its deps
(docs/synthesis-scale.md, "Session 11: the rail-512 rings"): the copy held while the deps were
checked took h800-rail-512 AllGather's row past 2 GB. Counted in traced bytes, never seconds."""

from __future__ import annotations

import tracemalloc

import pytest
from synth_helpers import make_cluster

from ccltune.model import evaluate
from ccltune.model.formats.msccl import reader
from ccltune.model.formats.msccl.rail_ring import rail_ring_allgather
from ccltune.model.formats.msccl.slicing import slicing, with_slices
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.sim import symmetric_sim
from ccltune.model.sim.routing import Router
from ccltune.model.sim.translations import Translations

SERVERS, GPUS = 16, 8  # a 128-rank ring file: 14,336 transfers, 68k deps at 64 MiB, k = 2


def test_a_read_back_files_deps_are_checked_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the deps are checked, less than one copy of them is held beyond the schedule's own
    (here ~0.8 of one; with the transfers reordered and the deps renumbered as before: 2.3),
    and the quotient is found: the file is read back not in translate-major order."""
    _, low = rail_ring_allgather(SERVERS, GPUS, "t", 16)
    text = render_lowering(low, name="t", proto="Simple", nchannels=1)
    clus = make_cluster(GPUS, SERVERS)
    key = reader.file_key(text)
    rb = evaluate._read_back(key, text)
    sl = slicing(rb.schedule.protocol, 1 << 26, rb.chunks_per_loop, "allgather")
    arrays = with_slices(evaluate._structure(key, sl.protocol, sl.max_allowed_count, 2, text),
                         rb, sl)  # fmt: skip
    evaluate._read_back.cache_clear()
    evaluate._structure.cache_clear()
    assert clus.dimensions is not None
    sizes = [d.size for d in clus.dimensions]
    assert isinstance(symmetric_sim._layout(arrays, Translations(sizes)), str)  # reordered
    # small blocks: the check's own temporaries are not what is counted
    monkeypatch.setattr(symmetric_sim, "_DEP_BLOCK", 4096)
    held: list[int] = []
    check = symmetric_sim._quotient_deps

    def counted(*args: object) -> str | None:
        held.append(tracemalloc.get_traced_memory()[0])
        return check(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(symmetric_sim, "_quotient_deps", counted)
    tracemalloc.start()
    try:
        st = symmetric_sim._structure(arrays, clus, Router(clus))
    finally:
        tracemalloc.stop()
    assert not isinstance(st, str), st
    assert st.images == SERVERS * GPUS
    assert held and max(held) < arrays.dep_idx.nbytes, (held, arrays.dep_idx.nbytes)
