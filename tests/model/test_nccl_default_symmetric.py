"""NCCL's default estimate through the symmetric simulator: the same simulated times, cheaper.

model/nccl/default.py simulates NCCL's rings through one representative of each orbit
(sim/symmetric_sim.py) where its premises hold: inside one node the ring is N translates of rank
0's transfers, across nodes the node shifts' translates of one node's. Every time must equal the
full simulation's (single-node allgather and reducescatter to the last bit, the rest within
1e-12 relative: the quotient adds the same terms in another order), and the ring's threadblock
numbering per (rank, channel) must model the same threadblocks as numbering them by channel.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from ccltune.api.common import Collective
from ccltune.model.nccl import default as nccl_default
from ccltune.model.nccl.baselines import nccl_schedule_arrays
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import SimResult, simulate
from ccltune.topology.presets import load_preset

SIZES = [1 << k for k in range(10, 31, 3)]
PRESETS = ("dgx-h100-1", "dgx-a100-1", "mi300x-8")
MULTI_NODE = ("dgx-h100-2", "syccl-a800-16", "syccl-a800-32", "h800-rail-64")
COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)


def _times(preset: str, coll: Collective, monkeypatch: pytest.MonkeyPatch,
           symmetric: bool) -> tuple[list[float], list[str]]:  # fmt: skip
    engines: list[str] = []

    def spy(*args: Any, **kw: Any) -> SimResult:
        res = simulate(*args, **kw)
        engines.append(res.engine)
        return res

    with monkeypatch.context() as m:
        m.setattr(nccl_default, "simulate", spy)
        if not symmetric:
            m.setattr(nccl_default, "_ring_may_be_symmetric", lambda *_: False)
        nccl_default._SCHEDULES.clear()
        topo = load_preset(preset)
        router = Router(topo)
        times = [nccl_default.default_estimate(coll, s, topo, router=router).time_us
                 for s in SIZES]  # fmt: skip
    return times, engines


@pytest.mark.parametrize("preset", PRESETS + MULTI_NODE)
@pytest.mark.parametrize("coll", COLLECTIVES)
def test_times_equal_the_full_simulation(preset: str, coll: Collective,
                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    fast, engines = _times(preset, coll, monkeypatch, symmetric=True)
    full, full_engines = _times(preset, coll, monkeypatch, symmetric=False)
    assert "symmetric" not in full_engines
    if preset in MULTI_NODE and coll != Collective.ALLREDUCE:  # allreduce: NCCL's tree
        assert engines == ["symmetric"] * len(SIZES)  # (a root node) at most sizes
    if preset in PRESETS and coll != Collective.ALLREDUCE:
        assert fast == full  # bit for bit
    else:
        # The quotient adds the same terms in another order: at most the last bits differ
        # (measured <= 1.6e-15 relative, docs/cli-startup.md).
        assert fast == pytest.approx(full, rel=1e-12, abs=0)


@pytest.mark.parametrize("coll", COLLECTIVES)
def test_single_node_ring_runs_on_one_orbit(coll: Collective,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # The case the path exists for: every size of an 8-GPU NVSwitch sweep (a TP group).
    _, engines = _times("dgx-h100-1", coll, monkeypatch, symmetric=True)
    assert engines == ["symmetric"] * len(SIZES)


@pytest.mark.parametrize("preset", ["syccl-a800-16", "h800-rail-64"])
def test_ring_across_nodes_is_one_node_per_orbit(preset: str) -> None:
    topo = load_preset(preset)
    router = Router(topo)
    channels = 2
    arr = nccl_schedule_arrays(Collective.ALLGATHER, "ring", topo, chunks=1, channels=channels)
    arr.tb = (arr.src.astype(np.int64) * channels + arr.channel).astype(np.int32)
    cost = nccl_default.nccl_protocol_cost(Collective.ALLGATHER, "ring", "Simple", 1 << 26,
                                           channels, topo)  # fmt: skip
    sym = simulate(arr, topo, 1 << 26, cost, router, engine="symmetric")
    full = simulate(arr, topo, 1 << 26, cost, router, engine="heap")
    assert sym.engine == "symmetric", sym.note
    assert len(sym.simulated_finish) == len(arr) // topo.node_count
    assert sym.events == full.events
    np.testing.assert_allclose(sym.finish_us, full.finish_us, rtol=1e-12)
    np.testing.assert_allclose(sym.rank_finish_us, full.rank_finish_us, rtol=1e-12)


def test_threadblocks_that_do_not_translate_fall_back() -> None:
    # Rank 9 (node 1) runs both channels on one threadblock, its node-0 image on two: the node
    # shift is not a symmetry of the threadblocks, so the full simulation runs, and says why.
    topo = load_preset("syccl-a800-16")
    router = Router(topo)
    arr = nccl_schedule_arrays(Collective.ALLGATHER, "ring", topo, chunks=1, channels=2)
    tb = arr.src.astype(np.int64) * 2 + arr.channel
    tb[arr.src == 9] = 18
    arr.tb = tb.astype(np.int32)
    cost = nccl_default.nccl_protocol_cost(Collective.ALLGATHER, "ring", "Simple", 1 << 26, 2,
                                           topo)  # fmt: skip
    sym = simulate(arr, topo, 1 << 26, cost, router, engine="symmetric")
    full = simulate(arr, topo, 1 << 26, cost, router)
    assert sym.engine != "symmetric"
    assert sym.note == "threadblocks do not translate with the transfers"
    assert sym.time_us == full.time_us


@pytest.mark.parametrize("preset", ["dgx-h100-1", "syccl-a800-16"])
@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.ALLREDUCE,
                                  Collective.BROADCAST])  # fmt: skip
def test_ring_threadblocks_per_rank_and_channel_are_the_channels(preset: str,
                                                                coll: Collective) -> None:  # fmt: skip
    topo = load_preset(preset)
    router = Router(topo)
    channels = 4
    arr = nccl_schedule_arrays(coll, "ring", topo, chunks=2, channels=channels)
    by_channel = replace(arr, tb=arr.channel.copy())
    by_rank = replace(arr, tb=(arr.src.astype(np.int64) * channels + arr.channel).astype(np.int32))
    cost = nccl_default.nccl_protocol_cost(coll, "ring", "Simple", 1 << 24, channels, topo)
    a = simulate(by_channel, topo, 1 << 24, cost, router, engine="heap")
    b = simulate(by_rank, topo, 1 << 24, cost, router, engine="heap")
    assert a.time_us == b.time_us
    assert np.array_equal(a.finish_us, b.finish_us)
    assert a.threadblocks == b.threadblocks == channels
