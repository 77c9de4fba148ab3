"""NCCL's default as the reference at every size: its schedule is built once per shape and
topology (model/nccl/default.py `_schedule`), with the same simulated times as built afresh."""

from __future__ import annotations

import pytest

from ccltune.api.common import Collective
from ccltune.model.nccl import default as nccl_default
from ccltune.topology.presets import load_preset

SIZES = [1 << k for k in range(10, 31, 2)]


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.ALLREDUCE,
                                  Collective.ALLTOALL])  # fmt: skip
def test_cached_schedules_time_as_built_afresh(coll: Collective,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    topo = load_preset("dgx-h100-2")
    built: list[tuple[object, ...]] = []
    build = nccl_default.nccl_schedule_arrays

    def counting(*args: object, **kw: object) -> object:
        built.append((*args[:2], kw["chunks"], kw["channels"]))
        return build(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(nccl_default, "nccl_schedule_arrays", counting)
    nccl_default._SCHEDULES.clear()
    cached = [nccl_default.default_estimate(coll, s, topo).time_us for s in SIZES]
    assert len(built) == len(set(built)) < len(SIZES)  # each shape once, and shapes repeat
    fresh = []
    for s in SIZES:
        nccl_default._SCHEDULES.clear()
        fresh.append(nccl_default.default_estimate(coll, s, topo).time_us)
    assert cached == fresh
    # another topology (even an equal one) never reuses these arrays
    other = load_preset("dgx-h100-2")
    n = len(built)
    nccl_default.default_estimate(coll, SIZES[0], other)
    assert len(built) == n + 1
