"""The heap engine with its re-rating inlined gives the engine's old times bit for bit
(docs/synthesis-scale.md, "Session 12: the 16- and 64-GPU sweeps"): the old engine is kept here
as the reference, and both run the same prepared schedules, with and without giving up."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ccltune.api.cluster import ClusterNode, ClusterTopology, Link
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import ProtocolCost
from ccltune.model.schedule.ir import Schedule, ScheduleArrays, Transfer
from ccltune.model.sim import simulate as sim
from ccltune.model.sim.routing import Router


def _old_heap_engine(p: sim._Prepared, stop: tuple[float, float] = (np.inf, 0.0),
                     ) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """simulate._heap_engine as of 5cbfe35 (re-rating in a nested function)."""
    n = p.n
    rows = [tuple(r for r in row if r != p.pad) for row in p.res.T.tolist()]
    class_of_res: dict[tuple[int, ...], int] = {}
    cls = [class_of_res.setdefault(row, len(class_of_res)) for row in rows]
    cres = list(class_of_res)
    ncls = len(cres)
    cap = p.cap.tolist()
    alpha, nbytes = p.alpha.tolist(), p.nbytes.tolist()
    succ_ptr, succ_idx, succ_gap = p.succ_ptr.tolist(), p.succ_idx.tolist(), p.succ_gap.tolist()
    indeg = p.indeg.tolist()
    ready = alpha[:]
    on_res: list[set[int]] = [set() for _ in range(len(cap))]
    nflows = [0] * len(cap)
    share = cap[:]
    rate = [0.0] * ncls
    served = [0.0] * ncls
    last = [0.0] * ncls
    version = [0] * ncls
    queue: list[list[tuple[float, int]]] = [[] for _ in range(ncls)]
    start = [np.nan] * n
    finish = [np.nan] * n
    heap: list[tuple[float, int, int, int]] = []
    for t in range(n):
        if indeg[t] == 0:
            heap.append((alpha[t], 1, t, 0))
    heapq.heapify(heap)
    events = 0
    changed: set[int] = set()

    def rerate(classes: set[int], now: float) -> None:
        for c in classes:
            r_old = rate[c]
            served[c] += r_old * (now - last[c])
            last[c] = now
            if not queue[c]:
                rate[c] = 0.0
                continue
            r_new = min(map(share.__getitem__, cres[c]))
            if r_new == r_old and c not in changed:
                continue
            rate[c] = r_new
            version[c] += 1
            left = max(queue[c][0][0] - served[c], 0.0)
            heapq.heappush(heap, (now + left / r_new, 0, c, version[c]))

    while heap:
        now, kind, x, ver = heapq.heappop(heap)
        if kind == 1:
            t, c = x, cls[x]
            events += 1
            start[t] = now
            touched = {c}
            for r in cres[c]:
                touched |= on_res[r]
                on_res[r].add(c)
                nflows[r] += 1
                share[r] = cap[r] / nflows[r]
            served[c] += rate[c] * (now - last[c])
            last[c] = now
            head = queue[c][0] if queue[c] else None
            heapq.heappush(queue[c], (served[c] + nbytes[t], t))
            changed = {c} if queue[c][0] != head else set()
            rerate(touched, now)
            continue
        c = x
        if ver != version[c]:
            continue
        events += 1
        _, t = heapq.heappop(queue[c])
        finish[t] = now
        if now + stop[1] >= stop[0]:
            raise sim.Slower(now + stop[1])
        touched = {c}
        for r in cres[c]:
            nflows[r] -= 1
            share[r] = cap[r] / nflows[r] if nflows[r] else cap[r]
            if not queue[c]:
                on_res[r].discard(c)
            touched |= on_res[r]
        changed = {c}
        rerate(touched, now)
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            u = succ_idx[k]
            ready[u] = max(ready[u], now + succ_gap[k])
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (ready[u], 1, u, 0))
    return np.asarray(start, dtype=np.float64), np.asarray(finish, dtype=np.float64), events


def _topo() -> ClusterTopology:
    return ClusterTopology(
        name="two-tier", gpus_per_node=6, nodes=[ClusterNode(name="n0", gpus=6)],
        links=[Link(a=f"n0/gpu{i}", b=f"sw{i % 2}", kind="nvlink", bandwidth_gbps=10 + 5 * (i % 3),
                    latency_us=0.1 * (i % 2)) for i in range(6)]
        + [Link(a="sw0", b="sw1", kind="nvlink", bandwidth_gbps=7, latency_us=0.3)],
    )  # fmt: skip


@st.composite
def _dags(draw: st.DrawFn) -> Schedule:
    """Contended DAGs: few ranks and channels, so flows share links and threadblocks, with
    counts that tie (equal rates, simultaneous finishes) as often as not."""
    n = draw(st.integers(2, 6))
    s = Schedule("rand", Collective.ALLREDUCE, n, 4)
    for i in range(draw(st.integers(1, 60))):
        src = draw(st.integers(0, n - 1))
        dst = draw(st.integers(0, n - 2))
        dst += dst >= src
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        s.add(Transfer(src, dst, draw(st.integers(0, 3)), count=draw(st.integers(1, 3)),
                       deps=tuple(deps), channel=draw(st.integers(0, 1))))  # fmt: skip
    return s


def _same(p: sim._Prepared, stop: tuple[float, float]) -> None:
    try:
        want: tuple[np.ndarray, np.ndarray, int] | float = _old_heap_engine(p, stop)
    except sim.Slower as exc:
        want = exc.bound_us
    try:
        got: tuple[np.ndarray, np.ndarray, int] | float = sim._heap_engine(p, stop)
    except sim.Slower as exc:
        got = exc.bound_us
    if isinstance(want, float) or isinstance(got, float):
        assert got == want  # the same bound, given up at the same finish
        return
    assert want[0].tobytes() == got[0].tobytes()
    assert want[1].tobytes() == got[1].tobytes()
    assert want[2] == got[2]


@settings(max_examples=150, deadline=None)
@given(_dags(), st.sampled_from([1.0, 777.0, 2**20]), st.booleans(), st.sampled_from([0.0, 0.7]),
       st.sampled_from([np.inf, 0.5, 0.9]))  # fmt: skip
def test_heap_engine_gives_the_old_times_bit_for_bit(s: Schedule, size: float, cap: bool,
                                                     step: float, give_up: float) -> None:  # fmt: skip
    topo = _topo()
    proto = ProtocolCost("x", 0.9, step, tb_gbps=6.0 if cap else None)
    p = sim._prepare(ScheduleArrays.from_schedule(s), Router(topo), size, proto)
    full = _old_heap_engine(p)[1]
    # give up at a fraction of the run's time: mid-run, where the two must stop alike
    at = float(np.nanmax(full)) * give_up if len(full) else np.inf
    _same(p, (at, 0.25))


def test_heap_engine_is_exact_on_a_symmetric_quotient() -> None:
    """Representatives crowd onto few orbit resources (many classes per resource)."""
    from ccltune.model.sim.symmetric_sim import prepare_symmetric
    from ccltune.synth.engine import synthesize
    from ccltune.topology.load import load_cluster

    topo = load_cluster("syccl-a800-16")
    router = Router(topo)
    res = synthesize(topo, "allgather", [1 << 20], evaluate=False)
    proto = ProtocolCost("x", 0.9, 0.5, tb_gbps=40.0)
    seen = 0
    for arr in list(res.schedules.values())[:6]:
        q = prepare_symmetric(arr, topo, router, proto)
        if isinstance(q, str):
            continue
        seen += 1
        for size in (4096.0, 64.0 * 2**20):
            _same(sim._prepare_quotient(arr, q, size, proto), (np.inf, 0.0))
    assert seen


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
