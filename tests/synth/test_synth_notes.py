"""The engine's notes name each dropped candidate once, however many sizes tried its file."""

from __future__ import annotations

from ccltune.synth import alltoall as a2a
from ccltune.synth.engine import synthesize
from ccltune.topology.load import load_cluster


def test_a_dropped_file_is_named_once_across_sizes(monkeypatch) -> None:
    # AlltoAll on 2 x 8 A800: one Simple file deadlocks in the executor model at every size
    # (timed there only with AlltoAll's cuts off: NCCL's p2p is at the bound or faster).
    monkeypatch.setattr(a2a, "at_bound", lambda *_a, **_k: {})
    monkeypatch.setattr(a2a, "worth_timing", lambda *_a: True)
    sizes = [1 << k for k in range(10, 31)]  # 1K..1G, as `ccltune synthesize` sweeps
    res = synthesize(load_cluster("syccl-a800-16"), "alltoall", sizes)
    notes = [n for n in res.notes if "were dropped: " in n]
    assert notes, res.notes
    count = int(notes[0].split(" ", 1)[0])
    assert count == 1, notes[0]
    assert notes[0].count("spread:nvswitch > spread:leaf/p1x1/Simple: deadlock") == 1
