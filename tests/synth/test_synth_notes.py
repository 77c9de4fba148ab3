"""The engine's notes name each dropped candidate once, however many sizes tried its file."""

from __future__ import annotations

import math
import re
from html import unescape

import pytest

from ccltune.synth import alltoall as a2a
from ccltune.synth import engine
from ccltune.synth.engine import synthesize
from ccltune.topology.load import load_cluster


def test_a_dropped_file_is_named_once_across_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    # AlltoAll on 2 x 8 A800, its files timed at every size (AlltoAll's cuts off: NCCL's p2p is
    # at the bound or faster). The first Simple file timed is refused at every size, as the
    # executor model refuses a file that deadlocks (forced: which file deadlocks, if any,
    # depends on the writer's step order).
    monkeypatch.setattr(a2a, "at_bound", lambda *_a, **_k: {})
    monkeypatch.setattr(a2a, "worth_timing", lambda *_a: True)
    real = engine.file_time
    refused: list[str] = []
    tries = 0

    def file_time(coll, size, topo, router, text, give_up_at=math.inf):  # type: ignore[no-untyped-def]
        nonlocal tries
        found = re.search(r'\bname="([^"]*)"', text)
        assert found is not None
        name = unescape(found.group(1))  # the label, as the XML attribute escapes it
        if 'proto="Simple"' in text and name in (refused or [name]):
            refused[:] = [name]
            tries += 1
            return "deadlock (forced by the test)"
        return real(coll, size, topo, router, text)

    monkeypatch.setattr(engine, "file_time", file_time)
    sizes = [1 << k for k in range(10, 31)]  # 1K..1G, as `ccltune synthesize` sweeps
    res = synthesize(load_cluster("syccl-a800-16"), "alltoall", sizes, workers=1)
    assert tries > 1  # several sizes tried the refused file
    notes = [n for n in res.notes if "were dropped: " in n]
    assert notes, res.notes
    count = int(notes[0].split(" ", 1)[0])
    assert count == 1, notes[0]
    assert notes[0].count(f"{refused[0]}/Simple: deadlock (forced by the test)") == 1
