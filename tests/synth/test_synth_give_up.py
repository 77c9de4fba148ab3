"""A run given up once its time is known to be at least a threshold (simulate's `give_up_at`):
the engine only keeps a faster file, so a file whose run already loses is not simulated to the
end (docs/synthesis-scale.md, "Session 11: the 64- and 512-GPU sweeps")."""

from __future__ import annotations

import math

import numpy as np
import pytest
from synth_helpers import make_cluster

from ccltune.api.cluster import ClusterNode, ClusterTopology, Link
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import ProtocolCost
from ccltune.model.schedule.ir import Schedule, Transfer
from ccltune.model.sim import simulate as sim
from ccltune.model.sim.routing import Router
from ccltune.synth import engine, grid


def _star(n: int) -> ClusterTopology:
    return ClusterTopology(
        name="star", gpus_per_node=n, nodes=[ClusterNode(name="n0", gpus=n)],
        links=[Link(a=f"n0/gpu{i}", b="sw", kind="nvlink", bandwidth_gbps=100.0, latency_us=1.0)
               for i in range(n)],
    )  # fmt: skip


def _chains(n: int) -> Schedule:
    """GPU 0 sends to every other GPU (contending on its uplink), each forwards the chunk on."""
    s = Schedule("chains", Collective.ALLGATHER, n, 1)
    for d in range(1, n):
        s.add(Transfer(0, d, 0, count=d))
    for d in range(1, n):
        s.add(Transfer(d, d % (n - 1) + 1, 0, deps=(d - 1,)))
    return s


@pytest.mark.parametrize("engine_name", ["heap", "batch"])
def test_a_run_given_up_is_at_least_the_threshold_and_no_more_than_its_time(
        engine_name: str) -> None:  # fmt: skip
    topo, s = _star(6), _chains(6)
    proto = ProtocolCost("x", 1.0, 0.5, launch_us=3.0)
    router = Router(topo)
    full = sim.simulate(s, topo, 1e6, proto, router, engine=engine_name)  # type: ignore[arg-type]
    ends = sorted(set(full.finish_us.tolist()))
    assert len(ends) > 3
    for x in [ends[0] - 1.0, *ends, (ends[-2] + ends[-1]) / 2]:
        with pytest.raises(sim.Slower) as got:
            sim.simulate(s, topo, 1e6, proto, router, engine=engine_name,  # type: ignore[arg-type]
                         give_up_at=x)  # fmt: skip
        # a finish seen (launch included): at least the threshold, at most the run's time
        assert x <= got.value.bound_us <= full.time_us
        assert got.value.bound_us in ends
    if engine_name == "heap":  # one finish at a time: the first at or after the threshold
        with pytest.raises(sim.Slower) as got:
            sim.simulate(s, topo, 1e6, proto, router, engine="heap", give_up_at=ends[1])
        assert got.value.bound_us == ends[1]
    above = sim.simulate(s, topo, 1e6, proto, router, engine=engine_name,  # type: ignore[arg-type]
                         give_up_at=np.nextafter(full.time_us, math.inf))  # fmt: skip
    assert above.time_us == full.time_us
    assert np.array_equal(above.finish_us, full.finish_us)


TOPO = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 26, 1 << 28]


def _sweep(monkeypatch: pytest.MonkeyPatch, give_up: bool) -> tuple[object, list[tuple[object, ...]]]:
    """The synthesis, and every file timed: (text, size, threshold, result)."""
    seen: list[tuple[object, ...]] = []
    real = grid.file_time

    def spy(coll: Collective, size: int, topo: ClusterTopology, router: Router, text: str,
            give_up_at: float = math.inf) -> float | str:  # fmt: skip
        limit = give_up_at if give_up else math.inf
        got = real(coll, size, topo, router, text, limit)
        seen.append((text, size, limit, got))
        return got

    monkeypatch.setattr(engine, "file_time", spy)
    res = engine.synthesize(TOPO, Collective.ALLGATHER, SIZES, max_threadblocks=4)
    return res, seen


def _picks(res: engine.SynthesisResult) -> list[object]:
    return [[(s.size_bytes, s.chosen, s.protocol, s.estimate, s.synthesized, s.reason)
             for s in res.sizes], [(r.label, r.protocol, r.min_bytes, r.max_bytes, r.kind)
                                   for r in res.ranges], res.notes, res.work]  # fmt: skip


def test_files_given_up_lose_and_nothing_picked_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    whole, whole_seen = _sweep(monkeypatch, give_up=False)
    cut, cut_seen = _sweep(monkeypatch, give_up=True)
    assert isinstance(whole, engine.SynthesisResult) and isinstance(cut, engine.SynthesisResult)
    assert _picks(cut) == _picks(whole)
    # the same files at the same sizes, each given up only where it loses
    assert [(t, s) for t, s, _, _ in cut_seen] == [(t, s) for t, s, _, _ in whole_seen]
    given_up = [(i, x, got) for i, (_, _, x, got) in enumerate(cut_seen)
                if isinstance(got, grid.AtLeast)]  # fmt: skip
    assert given_up, "no file was given up: the test no longer covers the cut"
    for i, x, got in given_up:
        full = whole_seen[i][3]
        assert isinstance(full, float) and x <= got <= full
    for (_, _, _, a), (_, _, _, b) in zip(cut_seen, whole_seen, strict=True):
        assert isinstance(a, grid.AtLeast) or a == b
