"""The batch engine takes a window's one fluid step itself where flows arrive as others end
(queue deps: no latency gap), instead of `_fluid` (docs/synthesis-scale.md, "Session 11: the
64- and 512-GPU sweeps")."""

from __future__ import annotations

import numpy as np
import pytest

from ccltune.api.cluster import ClusterNode, ClusterTopology, Link
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import ProtocolCost
from ccltune.model.schedule.ir import Schedule, ScheduleArrays, Transfer
from ccltune.model.sim import simulate as sim
from ccltune.model.sim.routing import Router


def _star(n: int, latency_us: float) -> ClusterTopology:
    return ClusterTopology(
        name="star", gpus_per_node=n, nodes=[ClusterNode(name="n0", gpus=n)],
        links=[Link(a=f"n0/gpu{i}", b="sw", kind="nvlink", bandwidth_gbps=100.0,
                    latency_us=latency_us) for i in range(n)],
    )  # fmt: skip


def _relay(n: int) -> Schedule:
    """GPU 0 sends d chunks to each GPU d at once (they share its uplink and end one by one);
    as each ends, its receiver sends one chunk back to GPU 0 (sharing GPU 0's downlink with
    the others' returns), so flows arrive at the instant others end."""
    s = Schedule("relay", Collective.ALLGATHER, n, 1)
    for d in range(1, n):
        s.add(Transfer(0, d, 0, count=d))
    for d in range(1, n):
        s.add(Transfer(d, 0, 0, count=2, deps=(d - 1,)))
    return s


def _fluid_calls(monkeypatch: pytest.MonkeyPatch, topo: ClusterTopology, s: Schedule,
                 proto: ProtocolCost) -> tuple[int, sim.SimResult]:  # fmt: skip
    calls: list[int] = []
    real = sim._fluid

    def counted(*args: object) -> object:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(sim, "_fluid", counted)
        got = sim.simulate(ScheduleArrays.from_schedule(s), topo, 1e6, proto, Router(topo),
                           engine="batch")  # fmt: skip
    return len(calls), got


def test_arrivals_at_an_end_take_one_step_without_fluid(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 9
    topo, s = _star(n, 0.0), _relay(n)
    proto = ProtocolCost("x", 1.0, 0.0)  # no latency at all: no lookahead, one instant a window
    heap = sim.simulate(s, topo, 1e6, proto, Router(topo), engine="heap")
    calls, batch = _fluid_calls(monkeypatch, topo, s, proto)
    assert np.allclose(batch.finish_us, heap.finish_us, rtol=1e-12)
    assert np.allclose(batch.start_us, heap.start_us, rtol=1e-12)
    assert calls == 0  # the tree before this change called it in every window with an arrival


def test_windows_with_lookahead_still_evolve_in_fluid(monkeypatch: pytest.MonkeyPatch) -> None:
    """With latency a window spans time and flows end inside it: `_fluid` steps through them,
    and the result still agrees with the heap engine."""
    n = 9
    topo, s = _star(n, 1.0), _relay(n)
    proto = ProtocolCost("x", 1.0, 0.5)
    heap = sim.simulate(s, topo, 1e6, proto, Router(topo), engine="heap")
    calls, batch = _fluid_calls(monkeypatch, topo, s, proto)
    assert np.allclose(batch.finish_us, heap.finish_us, rtol=1e-9)
    assert calls > 0
