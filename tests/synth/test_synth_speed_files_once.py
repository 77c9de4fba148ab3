"""Work done for nothing: the look ahead queues only files the loop times, no file is timed
twice at one size, no schedule is proved twice (docs/synthesis-scale.md, "Session 10: CPU
cuts")."""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from typing import Any

import pytest
from synth_helpers import make_cluster

from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import Collective
from ccltune.model.formats.msccl import writer
from ccltune.model.schedule.ir import Schedule
from ccltune.model.sim.routing import Router
from ccltune.synth import engine, rail_ring, side

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 26, 1 << 28]
# Where the engine's second (variant, protocol) at 256 MiB loses to the first's file, so its
# files are never timed there (measured on the tree before the change: 2 of 12 queued).
TOPO = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)


def _timed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    """(label, protocol, size) of every file this process times, in order."""
    seen: list[tuple[str, str, int]] = []
    real = engine.file_time

    def spy(coll: Collective, size: int, topo: ClusterTopology, router: Router,
            text: str, give_up_at: float = math.inf) -> float | str:  # fmt: skip
        name = re.search(r' name="([^"]*)"', text)
        proto = re.search(r' proto="([^"]*)"', text)
        assert name and proto
        seen.append((html.unescape(name[1]), proto[1], size))
        return real(coll, size, topo, router, text, give_up_at)

    monkeypatch.setattr(engine, "file_time", spy)
    return seen


def test_look_ahead_queues_only_files_the_loop_times(monkeypatch: pytest.MonkeyPatch) -> None:
    queued: list[tuple[str, str, int]] = []

    class Spy(side.FilesApart):
        def __init__(self, *args: object, **kw: object) -> None:
            queued.extend(args[-1])  # type: ignore[arg-type]
            super().__init__(*args, **kw)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(side, "FilesApart", Spy)
        two = engine.synthesize(TOPO, Collective.ALLGATHER, SIZES, max_threadblocks=4, workers=2)
    timed = _timed(monkeypatch)
    one = engine.synthesize(TOPO, Collective.ALLGATHER, SIZES, max_threadblocks=4)
    assert queued and set(queued) <= set(timed)
    assert [(s.chosen, s.estimate) for s in one.sizes] == [(s.chosen, s.estimate) for s in two.sizes]


def test_no_file_is_timed_twice_at_a_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 servers of 2 GPUs: the rail ring wins at most sizes, so between grid points it is
    # asked for as a neighbour's winner and as a ring (11 repeats before the change)
    timed = _timed(monkeypatch)
    res = engine.synthesize(make_cluster(2, 4, "nvswitch"), Collective.ALLGATHER,
                            [1 << k for k in range(10, 31)])  # fmt: skip
    assert sum(s.chosen == rail_ring.LABEL for s in res.sizes) > 4
    assert timed and max(Counter(timed).values()) == 1


def test_no_schedule_is_proved_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant's other pairings are lowered from the schedule its first lowering proved."""
    proved: list[tuple[object, ...]] = []
    real = writer.check_schedule

    def spy(schedule: Schedule, **kw: bool) -> None:
        proved.append((schedule.name, schedule.channels, tuple(schedule.transfers)))
        real(schedule, **kw)

    pairings: list[str] = []
    lower = engine.lower_msccl

    def lowering(schedule: Schedule, **kw: Any) -> writer.MscclLowering:
        pairings.append(kw.get("pairing", "forwarding"))
        return lower(schedule, **kw)

    with monkeypatch.context() as m:
        m.setattr(writer, "check_schedule", spy)
        m.setattr(engine, "lower_msccl", lowering)
        once = engine.synthesize(TOPO, Collective.ALLGATHER, SIZES, max_threadblocks=4)
    assert "balanced" in pairings  # a variant was lowered again with another pairing
    assert proved and max(Counter(proved).values()) == 1
    # a deal equal to one that failed is skipped with its work counted: the same result
    monkeypatch.setattr(engine, "_same_schedule", lambda a, b: False)
    again = engine.synthesize(TOPO, Collective.ALLGATHER, SIZES, max_threadblocks=4)
    assert (once.work, once.notes) == (again.work, again.notes)
    assert [(s.chosen, s.estimate) for s in once.sizes] == [(s.chosen, s.estimate) for s in again.sizes]
