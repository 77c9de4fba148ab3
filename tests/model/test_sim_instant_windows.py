"""The batch engine without lookahead (queue deps, no latency): a window where nothing starts
reuses the rates it found the window's end with (docs/synthesis-scale.md, "Session 10: the
512-GPU sweep")."""

from __future__ import annotations

import numpy as np
import pytest

from ccltune.api.cluster import ClusterNode, ClusterTopology, Link
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import ProtocolCost
from ccltune.model.schedule.ir import Schedule, ScheduleArrays, Transfer
from ccltune.model.sim import simulate as sim
from ccltune.model.sim.routing import Router


def _star(n: int) -> ClusterTopology:
    return ClusterTopology(
        name="star", gpus_per_node=n, nodes=[ClusterNode(name="n0", gpus=n)],
        links=[Link(a=f"n0/gpu{i}", b="sw", kind="nvlink", bandwidth_gbps=100.0, latency_us=0.0)
               for i in range(n)],
    )  # fmt: skip


def _fan_out(n: int) -> Schedule:
    """GPU 0 sends 1..n-1 chunks to each other GPU at once: they share its uplink and end one
    by one, nothing arriving in between; then each receiver forwards one chunk back."""
    s = Schedule("fan", Collective.ALLGATHER, n, 1)
    for d in range(1, n):
        s.add(Transfer(0, d, 0, count=d))
    for d in range(1, n):
        s.add(Transfer(d, 0, 0, deps=(d - 1,)))
    return s


def test_windows_without_arrivals_do_not_re_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 7
    topo, s = _star(n), _fan_out(n)
    proto = ProtocolCost("x", 1.0, 0.0)  # no step latency, no path latency: no lookahead
    router = Router(topo)
    heap = sim.simulate(s, topo, 1e6, proto, router, engine="heap")
    calls: list[int] = []
    real = sim._fluid

    def counted(*args: object) -> object:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(sim, "_fluid", counted)
    batch = sim.simulate(ScheduleArrays.from_schedule(s), topo, 1e6, proto, router,
                         engine="batch")  # fmt: skip
    assert np.allclose(batch.finish_us, heap.finish_us, rtol=1e-12)
    assert np.allclose(batch.start_us, heap.start_us, rtol=1e-12)
    # the n-1 sends contend on GPU 0's uplink and end in n-1 windows; the returns share GPU 0's
    # downlink and start where a send ends: only windows where something starts re-rate
    assert len(calls) <= n, len(calls)
