"""What the user waits for (docs/synthesis-scale.md, "Session 9"): the same results computed
for less CPU. The simulator's equal-share rates and one Schedule per variant's lowerings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ccltune.api.common import Collective
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim import simulate as sim
from ccltune.synth import engine
from ccltune.topology.presets import load_preset


def _shares_by_definition(res: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Per flow (column), the smallest cap / flows-on-it over the resources it uses."""
    flows = {r: int((res == r).sum()) for r in np.unique(res).tolist()}
    return np.array([min(cap[r] / flows[r] for r in res[:, j].tolist())
                     for j in range(res.shape[1])])  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("ncap", "width", "flows"), [(300, 2, 20), (20, 8, 200), (9, 1, 9)])
def test_rates_are_the_per_link_equal_share_bit_for_bit(seed: int, ncap: int, width: int,
                                                        flows: int) -> None:  # fmt: skip
    """The same division per resource and the same minimum: equal, not close (a tie in the
    batch engine turns on the last bit). More resources than the flows' entries, fewer, as
    many; resources repeat within a flow's column, and the pad (inf capacity, every short
    path) is shared by many flows."""
    rng = np.random.default_rng(seed)
    cap = np.concatenate([rng.uniform(1.0, 500.0, ncap - 1), [np.inf]])
    res = rng.integers(0, ncap, size=(width, flows)).astype(np.int32)
    res[rng.random(res.shape) < 0.3] = ncap - 1  # the pad
    got = sim._rates(np.ascontiguousarray(res), cap)
    assert got.dtype == np.float64
    assert np.array_equal(got, _shares_by_definition(res, cap))


def _two_schedules() -> tuple[ScheduleArrays, ScheduleArrays]:
    res = engine.synthesize(load_preset("dgx-h100-2"), Collective.ALLGATHER, [1 << 20],
                            evaluate=False)  # fmt: skip
    a = next(iter(res.schedules.values()))
    # the same name, size and dependencies, another channel: a key by name or shape is wrong
    return a, replace(a, channel=(a.channel + 1).astype(a.channel.dtype))


def test_last_schedule_is_built_once_and_only_for_its_own_arrays() -> None:
    a, b = _two_schedules()
    last = engine.LastSchedule()
    first = last(a)
    assert last(a) is first
    other = last(b)
    assert other is not first
    assert [t.channel for t in other.transfers] == b.channel.tolist()
    assert last(a) is not first  # one held: rebuilt, equal
    assert last(a).transfers == first.transfers


def test_lowerings_of_one_variant_share_its_schedule(tmp_path: Path, monkeypatch) -> None:
    """Consecutive lowerings of one variant (pairings, early and time-ordered) get one
    Schedule; the files and every number are those of a build per lowering."""
    made: dict[int, tuple[ScheduleArrays, object]] = {}  # a Schedule's id: its arrays
    real_build = ScheduleArrays.to_schedule

    def build(arr):  # type: ignore[no-untyped-def]
        sched = real_build(arr)
        made[id(sched)] = (arr, sched)  # both held: no id is reused
        return sched

    seen: list[tuple[int, int]] = []  # per lowering: (its arrays, its Schedule)
    real_lower, real_timed = engine.lower_msccl, engine.timed.lower_timed

    def lower(sched, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append((id(made[id(sched)][0]), id(sched)))
        return real_lower(sched, *a, **kw)

    def lower_timed(sched, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append((id(made[id(sched)][0]), id(sched)))
        return real_timed(sched, *a, **kw)

    monkeypatch.setattr(ScheduleArrays, "to_schedule", build)
    monkeypatch.setattr(engine, "lower_msccl", lower)
    monkeypatch.setattr(engine.timed, "lower_timed", lower_timed)
    sizes = [1 << k for k in range(10, 31, 4)]
    topo = load_preset("dgx-h100-2")
    shared = engine.synthesize(topo, Collective.ALLGATHER, sizes, out_dir=tmp_path / "a")
    again = [i for i in range(1, len(seen)) if seen[i][0] == seen[i - 1][0]]
    assert again, "no variant was lowered twice in a row: the test proves nothing"
    assert all(seen[i][1] == seen[i - 1][1] for i in again)

    class Fresh(engine.LastSchedule):
        def __call__(self, arr):  # type: ignore[no-untyped-def]
            return arr.to_schedule()

    monkeypatch.setattr(engine, "LastSchedule", Fresh)
    fresh = engine.synthesize(topo, Collective.ALLGATHER, sizes, out_dir=tmp_path / "b")
    assert [(s.chosen, s.protocol, s.estimate.time_us) for s in shared.sizes] == [
        (s.chosen, s.protocol, s.estimate.time_us) for s in fresh.sizes
    ]
    files = [r.xml_file for r in shared.ranges if r.xml_file]
    assert files
    for fa, fb in zip(files, [r.xml_file for r in fresh.ranges if r.xml_file], strict=True):
        assert Path(fa or "").read_bytes() == Path(fb or "").read_bytes()
