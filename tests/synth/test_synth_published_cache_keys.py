"""The published-file caches name a file by a digest, not its text (docs/synthesis-scale.md,
"Session 11: the rail-512 rings"): the engine passes a new copy of a text for each protocol but
the one it rendered, and a cache keyed by the text held one copy per entry (rail-512
ReduceScatter: its peak fell by 480 MB without them). Counted in bytes, never in seconds."""

from __future__ import annotations

from synth_helpers import make_cluster

from ccltune.model import evaluate
from ccltune.model.formats.msccl import reader
from ccltune.model.formats.msccl.rail_ring import rail_ring_allgather
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.sim.routing import Router
from ccltune.synth.grid import as_protocol

SERVERS, GPUS = 8, 4  # a 32-rank ring file
SIZES = (1 << 20, 1 << 24, 1 << 27, 1 << 30)  # different slicings: a structure entry each


def _clear() -> None:
    evaluate._read_back.cache_clear()
    evaluate._structure.cache_clear()
    reader._READS.clear()


def _times(text: str, fresh: bool) -> tuple[list[float], int]:
    """Times at SIZES, and the characters of text the caches' keys then hold; `fresh`: each
    timing from a new copy of the text, as the engine's `as_protocol` makes one."""
    clus = make_cluster(GPUS, SERVERS)
    router = Router(clus)
    simple = as_protocol(text, "Simple")
    _clear()
    times = [evaluate.published_estimate("allgather", n, clus,
                                         as_protocol(text, "Simple") if fresh else simple,
                                         router=router).time_us for n in SIZES]  # fmt: skip
    assert len(evaluate._structure) > 1  # entries of several slicings: each could hold a text
    keys = [*evaluate._read_back._held, *evaluate._structure._held]
    held = sum(len(part) for key in keys for part in key if isinstance(part, str))
    _clear()
    return times, held


def test_timing_fresh_copies_of_a_file_holds_no_copy_of_its_text() -> None:
    """Time a file at sizes of different slicings, each time from a fresh copy of its text: the
    caches' keys hold its `<algo>` line at most, not the text (before: 5 texts here, one per
    entry), and the times are the same as timing one text object throughout."""
    _, low = rail_ring_allgather(SERVERS, GPUS, "t", 16)
    text = render_lowering(low, name="t", proto="LL128", nchannels=1)
    one, _ = _times(text, fresh=False)
    copies, held = _times(text, fresh=True)
    assert copies == one
    head = text[: text.index(">") + 1]
    assert held <= (1 + len(SIZES)) * len(head) < len(text) // 100, (held, len(text))
