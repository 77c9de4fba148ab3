"""Files that cannot win are not read back (docs/synthesis-scale.md, "Session 12: files that
cannot win"): where a file's bound from its lowering (model/published_bound.py) already reaches
the best file so far, the engine records it as the give-up would, without reading it; the
result is the same as when every such file is read and timed."""

from __future__ import annotations

import math

import pytest

from ccltune.synth import engine
from ccltune.topology.load import load_cluster

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 26, 1 << 30]


def _run(monkeypatch: pytest.MonkeyPatch, bound: bool) -> tuple[object, set[str]]:
    """syccl-a800-16 AllReduce, and the files read back (by name)."""
    read: set[str] = set()
    real = engine.file_time

    def counted(coll: object, size: int, topo: object, router: object, text: str,
                give_up_at: float = math.inf) -> float | str:  # fmt: skip
        at = text.index('name="') + len('name="')
        read.add(text[at : text.index('"', at)])
        return real(coll, size, topo, router, text, give_up_at)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(engine, "file_time", counted)
        if not bound:
            m.setattr(engine, "published_lower_bound", lambda *_: 0.0)
        res = engine.synthesize(load_cluster("syccl-a800-16"), "allreduce", SIZES, workers=1)
    picks = [(s.size_bytes, s.chosen, s.protocol, s.estimate.time_us) for s in res.sizes]
    ranges = [(r.min_bytes, r.max_bytes, r.label, r.protocol) for r in res.ranges]
    return (picks, ranges, res.notes, res.work), read


def test_files_that_cannot_win_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real = engine.published_lower_bound

    def spy(*args: object) -> float:
        seen.append(real(*args))  # type: ignore[arg-type]
        return seen[-1]

    monkeypatch.setattr(engine, "published_lower_bound", spy)
    with_bound, read_with = _run(monkeypatch, bound=True)
    without, read_without = _run(monkeypatch, bound=False)
    assert with_bound == without
    assert read_with < read_without  # some files never read (3 of 5 here)
    assert seen  # bounds were asked for
