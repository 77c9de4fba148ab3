"""NCCL's rings are built in numpy (model/nccl/baselines.py `_chains`): the arrays must be the
transfers, chains and per-connection windows that building them one transfer at a time with
`_Builder` gives, in the same order (the simulators break ties by it)."""

from __future__ import annotations

import numpy as np
import pytest

from ccltune.api.common import Collective
from ccltune.model.nccl import baselines as b
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.topology.presets import load_preset

FIELDS = ("src", "dst", "chunk", "count", "reduce", "channel", "dep_ptr", "dep_idx")


def _one_by_one(coll: Collective, topo, chunks: int, channels: int, window: int) -> ScheduleArrays:
    """The rings hop by hop: per chunk (allreduce: per loop of N segments) and hop, every rank."""
    n = topo.world_size
    rings = [b.ring_order(topo, c) for c in range(channels)]
    out = b._Builder(window)
    cpr = chunks * channels
    for j in range(cpr):
        ring = rings[j % channels]
        if coll == Collective.ALLREDUCE:
            hops = [(s + h, ring[s] * cpr + j, True) for h in range(1, n) for s in range(n)]
            hops += [(s + h - 1, ring[s] * cpr + j, False) for h in range(1, n) for s in range(n)]
        else:
            shift = 1 if coll == Collective.REDUCESCATTER else 0
            hops = [(ring.index(o) + h - 1 + shift, o * cpr + j, shift == 1)
                    for h in range(1, n) for o in range(n)]  # fmt: skip
        last: dict[int, int] = {}
        for at, chunk, red in hops:
            last[chunk] = out.add(ring[at % n], ring[(at + 1) % n], chunk, (last.get(chunk, -1),),
                                  reduce=red, channel=j % channels)  # fmt: skip
    per_rank = n * cpr if coll == Collective.ALLREDUCE else cpr
    return out.arrays("ref", coll, n, per_rank, channels=channels)


@pytest.mark.parametrize("preset", ["dgx-h100-1", "syccl-a800-16", "a40-pcie-8", "mi300x-8"])
@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                  Collective.ALLREDUCE])  # fmt: skip
@pytest.mark.parametrize(("chunks", "channels", "window"), [(1, 1, 0), (2, 3, 0), (3, 2, 2)])
def test_rings_equal_the_one_by_one_build(preset: str, coll: Collective, chunks: int,
                                          channels: int, window: int) -> None:  # fmt: skip
    topo = load_preset(preset)
    got = b.nccl_schedule_arrays(coll, "ring", topo, chunks=chunks, channels=channels,
                                 in_flight=window)  # fmt: skip
    want = _one_by_one(coll, topo, chunks, channels, window)
    assert (got.nranks, got.chunks_per_rank, got.channels) == (want.nranks,
                                                              want.chunks_per_rank, channels)
    for f in FIELDS:
        x, y = getattr(got, f), getattr(want, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
