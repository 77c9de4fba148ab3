"""One read-back per file whatever its protocol (docs/synthesis-scale.md, "Session 12: one
read-back per file"): the evaluator times every protocol of a file on the first protocol's
read-back (a 512-rank ring file's is ~110 MB, its arrays ~70 MB), checks each protocol's run
on its own (a deadlock is still found), and shares a sliced structure between slicings that
build the same one. Counted by objects and calls, never by seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from synth_helpers import make_cluster

from ccltune.model import evaluate
from ccltune.model.formats.msccl import reader, slicing
from ccltune.model.formats.msccl.executor import execute, slots_per_step
from ccltune.model.formats.msccl.rail_ring import rail_ring_allgather
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.sim.routing import Router
from ccltune.synth.grid import as_protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from test_model_msccl_reader import exchange_allgather

SERVERS, GPUS = 8, 4  # a 32-rank ring file
SIZES = (1 << 16, 1 << 22, 1 << 26, 1 << 30)


def _clear() -> None:
    evaluate._read_back.cache_clear()
    evaluate._structure.cache_clear()
    reader._READS.clear()


def _ring() -> str:
    _, low = rail_ring_allgather(SERVERS, GPUS, "t", 16)
    return render_lowering(low, name="t", proto="LL128", nchannels=1)


def _times(texts: list[str]) -> list[float]:
    clus = make_cluster(GPUS, SERVERS)
    router = Router(clus)
    return [evaluate.published_estimate("allgather", n, clus, t, router=router).time_us
            for t in texts for n in SIZES]  # fmt: skip


def test_the_second_protocol_is_timed_on_the_first_read_back(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    ll128 = _ring()
    simple = as_protocol(ll128, "Simple")
    _clear()
    reader.read_msccl(ll128)
    seen = next(iter(reader._READS.values()))
    attrs = seen.attrs
    order = execute(seen.prog, slots_per_step("Simple", int(attrs["maxBytes"]),
                                              int(attrs["nchunksperloop"])))  # fmt: skip
    assert tuple(x.uid for x in order) != seen.order  # Simple numbers the transfers otherwise
    # each protocol timed alone, from empty caches: what the shared read-back must give
    alone = []
    for text in (ll128, simple):
        _clear()
        alone += _times([text])
    _clear()
    parsed, renumbered = [], []
    parse, renumber = reader._parse, reader._renumbered
    monkeypatch.setattr(reader, "_parse", lambda *a: parsed.append(1) or parse(*a))
    monkeypatch.setattr(reader, "_renumbered", lambda *a: renumbered.append(1) or renumber(*a))
    slicing._ARRAYS.clear()
    assert _times([ll128, simple]) == alone
    assert (len(parsed), len(renumbered)) == (1, 0)
    assert len(evaluate._read_back) == 1 and len(slicing._ARRAYS) == 1
    first = evaluate._read_back(reader.file_key(ll128), ll128)
    assert evaluate._read_back(reader.file_key(simple), simple) is first
    _clear()


def test_slicings_that_build_the_same_structure_share_it() -> None:
    """LL and LL128 take a FIFO slot a call, and a ring file's steps move one chunk each: every
    max_allowed_count builds the same structure. Each shared one equals its own build."""
    ll128 = _ring()
    _clear()
    key = reader.file_key(ll128)
    rb = evaluate._read_back(key, ll128)
    asked = [(p, m, k) for p in ("LL", "LL128", "Simple") for m in (1, 4, 16) for k in (1, 2)]
    for p, m, k in asked:
        got = evaluate._structure(key, p, m, k, ll128)
        own = slicing.structure(rb, slicing.Slicing(p, 0.0, slicing.SLICE_BYTES[p], k, 0.0, m), k)
        for f in ("src", "dst", "chunk", "count", "reduce", "channel", "dep_ptr", "dep_idx", "tb"):
            assert np.array_equal(getattr(got, f), getattr(own, f)), (p, m, k, f)
    assert len(evaluate._structure) == 4  # (1 slot or 4) x (k = 1 or 2), not 18
    evaluate._read_back.cache_clear()  # a structure goes with its read-back
    assert len(evaluate._structure) == 0
    _clear()


def test_a_protocol_that_deadlocks_is_refused_after_another_was_read() -> None:
    clus = make_cluster(2, 1)
    ll, simple = exchange_allgather("LL", 1, 0), exchange_allgather("Simple", 1, 0)
    for forget_program in (False, True):
        _clear()
        evaluate.published_estimate("allgather", 1 << 20, clus, ll)
        if forget_program:
            reader._READS.clear()
        with pytest.raises(MscclFormatError, match=r"deadlock: .*waits for a free FIFO slot"):
            evaluate.published_estimate("allgather", 1 << 20, clus, simple)
    _clear()


def test_a_program_goes_once_its_protocols_have_run() -> None:
    """The reader keeps a file's program for the protocols not yet run; a large file's for
    one more (154 MB for the 512-GPU ring): a third protocol parses it again."""
    ll128 = _ring()
    _clear()
    reader.read_msccl(ll128)
    reader.check_protocol(as_protocol(ll128, "Simple"))
    assert len(reader._READS) == 1
    reader.check_protocol(as_protocol(ll128, "LL"))
    assert len(reader._READS) == 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reader, "_LARGE_STEPS", 100)
        reader.read_msccl(ll128)
        reader.check_protocol(as_protocol(ll128, "Simple"))
        assert len(reader._READS) == 0
        reader.check_protocol(as_protocol(ll128, "LL"))
    _clear()
