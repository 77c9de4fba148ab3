"""Session 12's exact cuts to the 16- and 64-GPU sweeps (docs/synthesis-scale.md, "Session 12:
the 16- and 64-GPU sweeps"): channel orbits computed once per route set, and no schedule run
between grid sizes where nothing reads its time."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from ccltune.model.sim import symmetric_sim
from ccltune.model.sim.routing import Router
from ccltune.synth import engine
from ccltune.synth.grid import evaluation_order
from ccltune.topology.load import load_cluster


def _fields(st: object) -> list[object]:
    return [getattr(st, f.name) for f in dataclasses.fields(st)]  # type: ignore[arg-type]


def test_channel_orbits_once_per_route_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file timed at three sizes is three schedules with the same routes and other counts:
    their paths are looked up once, and each structure equals the one computed afresh."""
    topo = load_cluster("syccl-a800-16")
    router = Router(topo)
    arr = next(iter(engine.synthesize(topo, "allgather", [1 << 20], evaluate=False)
                    .schedules.values()))  # fmt: skip
    sized = [replace(arr, count=arr.count * k) for k in (1, 2, 3)]
    calls: list[int] = []
    real = Router.paths_csr

    def counted(self: Router, routes: object) -> object:
        calls.append(1)
        return real(self, routes)  # type: ignore[arg-type]

    symmetric_sim._ORBITS.clear()
    with monkeypatch.context() as m:
        m.setattr(Router, "paths_csr", counted)
        warm = [symmetric_sim._structure(s, topo, router) for s in sized]
    assert len(calls) == 1  # 3 before the memo
    for s, got in zip(sized, warm, strict=True):
        symmetric_sim._ORBITS.clear()
        cold = symmetric_sim._structure(s, topo, router)
        assert not isinstance(got, str) and not isinstance(cold, str)
        for a, b in zip(_fields(got), _fields(cold), strict=True):
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and np.array_equal(a, b)
            else:
                assert a == b


def test_no_schedule_run_between_grid_sizes_away_from_edges(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Between two grid sizes whose synthesized files both won, the neighbours' files are
    timed and the schedules' times rank nothing: none is simulated there (the tree before
    session 12 simulated every tried finalist in every protocol there)."""
    topo = load_cluster("syccl-a800-16")
    sizes = [1 << k for k in range(10, 31)]
    at: list[int] = []
    real = engine.simulate

    def counted(arr: object, topo_: object, size: int, *a: object, **k: object) -> object:
        at.append(size)
        return real(arr, topo_, size, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "simulate", counted)
    res = engine.synthesize(topo, "allgather", sizes, workers=1)
    grid, _ = evaluation_order(len(sizes))
    chosen = {s.size_bytes: s.chosen for s in res.sizes}
    inner = [
        sizes[i]
        for i in range(len(sizes))
        if i not in grid
        and all(
            not chosen[sizes[j]].startswith("nccl:")
            for j in (max(g for g in grid if g < i), min(g for g in grid if g > i))
        )
    ]
    assert len(inner) >= 3  # the premise: there are such sizes (1 MiB and up here)
    assert not set(inner) & set(at)


def test_read_back_arrays_kept_for_the_files_of_a_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seven read-backs asked in turn at three sizes (a 64-rank ReduceScatter's files) are
    made arrays once each while they are small; above the byte bound four are kept, as before
    session 12 (a 512-rank ring file's arrays are hundreds of MB)."""
    from types import SimpleNamespace

    from ccltune.model.formats.msccl import slicing
    from ccltune.model.schedule.ir import Schedule, ScheduleArrays, Transfer

    def read_back(i: int) -> SimpleNamespace:
        s = Schedule(f"f{i}", "allgather", 4, 1)
        for t in range(i + 1):
            s.add(Transfer(t % 4, (t + 1) % 4, t % 4))
        return SimpleNamespace(schedule=s, timed=None)

    rbs = [read_back(i) for i in range(7)]
    made: list[int] = []
    real = ScheduleArrays.from_schedule

    def counted(s: Schedule) -> ScheduleArrays:
        made.append(1)
        return real(s)

    monkeypatch.setattr(ScheduleArrays, "from_schedule", staticmethod(counted))
    for small_bytes, want in ((slicing._ARRAYS_SMALL_BYTES, 7), (0, 21)):
        monkeypatch.setattr(slicing, "_ARRAYS_SMALL_BYTES", small_bytes)
        slicing._ARRAYS.clear()
        made.clear()
        for _ in range(3):
            for rb in rbs:
                got = slicing._arrays(rb)  # type: ignore[arg-type]
                assert np.array_equal(got.src, real(rb.schedule).src)
        assert len(made) == want  # one per miss
        assert len(slicing._ARRAYS) == (7 if want == 7 else 4)
    slicing._ARRAYS.clear()
