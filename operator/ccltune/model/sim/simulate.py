"""Event-driven simulation of a schedule on a topology, with link contention.

Model (units: us, bytes, GB/s = 1e3 bytes/us):
- A transfer becomes ready when every transfer in its `deps` has finished (ir.py semantics).
- It then waits alpha = `protocol.step_latency_us` x its step count (one per started
  `protocol.step_bytes`, NCCL's buffer / NCCL_STEPS) + the latency of its path, and then its
  `count * chunk_bytes` bytes flow along the path.
- A dep into the same destination rank only orders the receiver's work (its FIFO, or the order
  of reduces into one buffer); the bytes were already on their way (NCCL's FIFO slots), so the
  alpha overlaps: start >= finish(dep) for such deps, >= finish(dep) + alpha for the others,
  and always >= alpha (no flow before its own latency).
- Contention: each directed channel carries `capacity * protocol.efficiency` payload GB/s (on
  NVLink also x `protocol.nvlink_efficiency`: SM stores reach ~80% of line rate), split in
  equal shares among the flows active on it; a flow moves at the smallest share along its path
  (per-link equal share).
- Threadblocks (`protocol.tb_gbps`, cost/gpu.py): a transfer is run by a threadblock on its
  sender and one on its receiver (the schedule's `tb`: NCCL's channel, an MSCCL file's tb; else
  one per (channel, peer)); each side is a resource of `tb_gbps` payload shared by every
  transfer that threadblock sends (receives). sim/capacity.py builds these resources.
- A transfer from a rank to itself is local work on its GPU (an MSCCL `cpy` or `re`, read back
  by formats/msccl/slicing.py): it crosses no link and pays no alpha, and only its threadblock
  sides cap it. Without threadblock physics (`tb_gbps` None) it costs nothing.
- The call costs `protocol.launch_us` (kernel launch, NCCL's baseLat) before any flow, and at
  least `protocol.floor_us` in all.
- Rates are recomputed whenever a flow starts or ends (a fluid model): only flows sharing a
  channel with the changed flow are touched, so a schedule without contention costs O(E log E).

Why per-link equal share and not max-min progressive filling: it updates in O(path) per event
instead of re-solving the whole network, and each flow's equal-share rate is a lower bound on its
max-min rate (a link saturates in progressive filling no earlier than at level cap/nflows), so the
simulated time errs on the slow side. On the symmetric schedules ccltune builds, flows that meet
on a channel are bottlenecked there alike and the two coincide.

Two engines implement the same model: an exact heap-driven one (one event at a time; best for
small or irregular schedules) and a windowed numpy one over flat arrays (`_batch_engine`; best
for large schedules such as a 512-rank ring). They agree to 1e-9 on random DAGs (tested). On
large schedules with many exactly tied flows, rounding decides tie order and the makespan can
move by a few 1e-3 relative (the heap engine alone shows the same spread when the size changes
by 1e-12), so compare schedules by differences larger than that.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ...api.cluster import ClusterTopology
from ...api.common import Source
from ...api.errors import InternalError
from ..cost.protocols import SIMPLE, ProtocolCost
from ..schedule.ir import Schedule, ScheduleArrays
from .arrays import sorted_unique
from .capacity import link_capacity, step_count, threadblock_ports, threadblocks_per_rank
from .routing import Router
from .symmetric_sim import Quotient, prepare_symmetric

Engine = Literal["auto", "heap", "batch", "symmetric"]
_AUTO_BATCH_MIN = 20_000  # transfers; below this the heap engine's lower constant wins
_QUOTIENT_BATCH_MIN = 200
_TOL = 1e-12  # relative: events this close are one instant in the batch engine


class SimulationError(InternalError):
    """The schedule cannot run: bad sizes, ranks or deps, or a dependency cycle (deadlock)."""


class Slower(Exception):
    """`simulate(..., give_up_at=x)`: a transfer finished (launch included) at `bound_us` >= x,
    so the run's time, the latest finish, is at least that; the rest was not simulated."""

    def __init__(self, bound_us: float) -> None:
        super().__init__(f"the run takes at least {bound_us} us")
        self.bound_us = bound_us


@dataclass(frozen=True, slots=True)
class ChannelLoad:
    channel: int
    name: str
    bytes: float
    utilization: float  # bytes / (capacity * time): fraction of the run the channel was busy


@dataclass(slots=True)
class SimResult:
    time_us: float
    rank_finish_us: np.ndarray  # last finish of a transfer each rank sends or receives
    events: int  # flow starts + flow finishes processed
    transfers: int
    busiest: list[ChannelLoad]
    simulated_start: np.ndarray = field(repr=False)  # per simulated transfer
    simulated_finish: np.ndarray = field(repr=False)
    engine: str = "heap"
    source: Source = Source.SIMULATED
    note: str = ""  # why the symmetric engine fell back to a full simulation
    # symmetric engine: per transfer, its representative (expanded only when asked: a 512-rank
    # schedule has millions of transfers and synthesis reads only time_us)
    rep_of: np.ndarray | None = field(default=None, repr=False)
    # SMs the call occupies: the most threadblocks one rank runs (0 when threadblocks are not
    # modelled, i.e. `protocol.tb_gbps` is None).
    threadblocks: int = 0

    @property
    def start_us(self) -> np.ndarray:
        """Per transfer: when its bytes began to flow."""
        s = self.simulated_start
        return s if self.rep_of is None else s[self.rep_of]

    @property
    def finish_us(self) -> np.ndarray:
        """Per transfer: completion time."""
        f = self.simulated_finish
        return f if self.rep_of is None else f[self.rep_of]


@dataclass(slots=True)
class _Prepared:
    n: int
    nbytes: np.ndarray  # per transfer
    alpha: np.ndarray  # per transfer: step latency + path latency
    res: np.ndarray  # [L, n] resource ids per transfer (int32), padded with `pad`
    cap: np.ndarray  # payload bytes/us per resource, inf for the pad
    pad: int
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    succ_gap: np.ndarray  # per successor edge: alpha of the successor, 0 into the same rank
    indeg: np.ndarray
    pair: np.ndarray  # per transfer index into the unique routes (src, dst, NIC slot)
    pair_off: np.ndarray
    pair_chans: np.ndarray
    solo: np.ndarray  # per transfer: payload bytes/us when alone on its path (an upper bound)


def _prepare(
    s: ScheduleArrays, router: Router, size_bytes: float, protocol: ProtocolCost
) -> _Prepared:
    n = len(s)
    if not size_bytes > 0:
        raise SimulationError(f"size must be positive, got {size_bytes} bytes")
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return _Prepared(
            0, np.zeros(0), np.zeros(0), np.zeros((1, 0), dtype=np.int32), np.array([np.inf]),
            0, np.zeros(1, dtype=np.int64), empty, np.zeros(0), empty, empty,
            np.zeros(1, dtype=np.int64), empty, np.zeros(0),
        )  # fmt: skip
    for arr, what in ((s.src, "src"), (s.dst, "dst")):
        bad = np.flatnonzero((arr < 0) | (arr >= s.nranks))
        if len(bad):
            i = int(bad[0])
            raise SimulationError(
                f"transfer {i}: {what} rank {int(arr[i])} not in 0..{s.nranks - 1}"
            )
    local = s.src == s.dst
    if s.nranks > router.nranks:
        raise SimulationError(
            f"schedule has {s.nranks} ranks but cluster {router.topo.name!r} has {router.nranks}"
        )
    if len(s.dep_idx):
        bad = np.flatnonzero((s.dep_idx < 0) | (s.dep_idx >= n))
        if len(bad):
            i = int(np.searchsorted(s.dep_ptr, bad[0], side="right") - 1)
            raise SimulationError(
                f"transfer {i}: dependency {int(s.dep_idx[bad[0]])} does not exist"
            )

    # Unique routes -> paths. A route is (src, dst, NIC slot): between nodes NCCL picks the NIC
    # by channel (routing.py); the slot is 0 elsewhere, so routes stay (src, dst) pairs there.
    key = s.src.astype(np.int64) * s.nranks + s.dst
    period = router.nic_period
    ukeys, pair = np.unique(key * period + router.nic_slots(s.src, s.dst, s.channel),
                            return_inverse=True)  # fmt: skip
    upair, uslot = ukeys // period, ukeys % period
    usrc, udst = upair // s.nranks, upair % s.nranks
    pair_off, pair_chans, pair_lat = router.paths_csr(
        zip(usrc.tolist(), udst.tolist(), uslot.tolist(), strict=True)
    )
    pair_msg = router.message_us(usrc, udst)  # host-offloaded transports: per network message
    plen = np.diff(pair_off)
    width = int(plen.max())
    nch = router.nchannels
    cap_list = [link_capacity(router, protocol)]
    tb_gbps = protocol.tb_gbps
    tb_res = threadblock_ports(s) if tb_gbps is not None else None
    extra = 0
    if tb_gbps is not None and tb_res is not None:
        extra = int(tb_res.max()) + 1
        cap_list.append(np.full(extra, tb_gbps * 1e3))
        width += 2
    free = tb_res is None and bool(local.any())
    if free:  # local work, uncharged: zero bytes on a resource of its own (a flow needs one)
        extra, width = 1, width + 1
        cap_list.append(np.ones(1))
    pad = nch + extra
    cap = np.concatenate([*cap_list, [np.inf]])
    pair_res = np.full((len(ukeys), width), pad, dtype=np.int64)
    cols = np.arange(len(pair_chans)) - np.repeat(pair_off[:-1], plen)
    pair_res[np.repeat(np.arange(len(ukeys)), plen), cols] = pair_chans
    # Resources as [width, n] rows: reductions over the short path axis run as vector ops.
    res = np.ascontiguousarray(pair_res.T[:, pair]).astype(np.int32)
    if tb_res is not None:
        res[-2:] = nch + tb_res
    if free:
        res[-1] = np.where(local, nch, pad)

    # Successor CSR from the dep CSR.
    deps_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(s.dep_ptr))
    order = np.argsort(s.dep_idx, kind="stable")
    succ_idx = deps_of[order]
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(s.dep_idx, minlength=n), out=succ_ptr[1:])
    indeg = np.diff(s.dep_ptr).astype(np.int64)
    nbytes = s.count.astype(np.float64) * s.chunk_bytes(size_bytes)
    alpha = (protocol.step_latency_us + pair_msg[pair]) * step_count(nbytes, protocol) + pair_lat[pair]
    alpha[local] = 0.0
    if free:
        nbytes[local] = 0.0
    same_dst = s.dst[succ_idx] == s.dst[s.dep_idx[order]]
    succ_gap = np.where(same_dst, 0.0, alpha[succ_idx])
    solo = cap[pair_res].min(axis=1)[pair] if n else np.zeros(0)
    if protocol.tb_gbps is not None:
        solo = np.minimum(solo, protocol.tb_gbps * 1e3)
    if free:
        solo[local] = 1.0
    return _Prepared(
        n, nbytes, alpha, res, cap, pad, succ_ptr, succ_idx, succ_gap, indeg, pair, pair_off,
        pair_chans, solo,
    )  # fmt: skip


def _prepare_quotient(s: ScheduleArrays, q: Quotient, size_bytes: float,
                      protocol: ProtocolCost) -> _Prepared:  # fmt: skip
    """The representatives of a symmetric schedule as a schedule of their own (symmetric_sim)."""
    if not size_bytes > 0:
        raise SimulationError(f"size must be positive, got {size_bytes} bytes")
    m = len(q.reps)
    succ_owner = np.repeat(np.arange(m, dtype=np.int64), np.diff(q.dep_ptr))
    order = np.argsort(q.dep_idx, kind="stable")
    succ_ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(q.dep_idx, minlength=m), out=succ_ptr[1:])
    nbytes = s.count[q.reps].astype(np.float64) * s.chunk_bytes(size_bytes)
    alpha = (protocol.step_latency_us + q.msg_us) * step_count(nbytes, protocol) + q.alpha_path
    alpha[s.src[q.reps] == s.dst[q.reps]] = 0.0  # local work (see `_prepare`)
    solo = q.cap[q.res].min(axis=0)
    empty = np.zeros(0, dtype=np.int64)
    succ_idx = succ_owner[order]
    succ_gap = np.where(q.dep_same_dst[order], 0.0, alpha[succ_idx])
    return _Prepared(
        m, nbytes, alpha, q.res, q.cap, q.pad, succ_ptr, succ_idx, succ_gap,
        np.diff(q.dep_ptr).astype(np.int64), empty, np.zeros(1, dtype=np.int64), empty, solo,
    )  # fmt: skip


def _heap_engine(p: _Prepared, stop: tuple[float, float] = (np.inf, 0.0),
                 ) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """One event at a time, over classes of flows with the same resources. `stop`: (x,
    launch): Slower as soon as a transfer finishes at or after x with the launch added.

    Flows of one class always move at the same rate, so a class keeps its service so far
    (bytes each of its flows has moved since the class began) and a heap of its flows by the
    service at which each completes; only the class's first finish is an event. A start or
    finish re-rates the classes sharing a resource with it, not their flows: on synthesized
    schedules thousands of flows share a few orbit resources.
    """
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
    on_res: list[set[int]] = [set() for _ in range(len(cap))]  # active classes per resource
    nflows = [0] * len(cap)
    share = cap[:]  # cap / flows on it, kept current as flows come and go
    share_of = share.__getitem__
    rate = [0.0] * ncls
    served = [0.0] * ncls  # service of the class up to `last`
    last = [0.0] * ncls
    version = [0] * ncls
    queue: list[list[tuple[float, int]]] = [[] for _ in range(ncls)]  # (service at finish, tid)
    start = [np.nan] * n
    finish = [np.nan] * n
    # (time, kind 0=class finish 1=start, class or tid, version)
    heap = [(alpha[t], 1, t, 0) for t in range(n) if indeg[t] == 0]
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop
    give_up, launch = stop
    events = 0
    while heap:
        now, kind, x, ver = pop(heap)
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
            q = queue[c]
            head = q[0] if q else None
            push(q, (served[c] + nbytes[t], t))
            moved = c if q[0] != head else -1  # the class whose first finish moved, if any
        else:
            c = x
            if ver != version[c]:
                continue  # superseded by a re-rate
            events += 1
            q = queue[c]
            _, t = pop(q)
            finish[t] = now
            if now + launch >= give_up:
                raise Slower(now + launch)
            touched = {c}
            for r in cres[c]:
                nflows[r] -= 1
                share[r] = cap[r] / nflows[r] if nflows[r] else cap[r]
                if not q:
                    on_res[r].discard(c)
                touched |= on_res[r]
            moved = c
        # Re-rate the classes sharing a resource with c (inline: one call per event cost 10%).
        for d in touched:
            r_old = rate[d]
            served[d] += r_old * (now - last[d])
            last[d] = now
            qd = queue[d]
            if not qd:
                rate[d] = 0.0
                continue
            r_new = min(map(share_of, cres[d]))
            if r_new == r_old and d != moved:
                continue  # its pending finish event still holds
            rate[d] = r_new
            version[d] += 1
            left = max(qd[0][0] - served[d], 0.0)
            push(heap, (now + left / r_new, 0, d, version[d]))
        if kind == 0:
            for k in range(succ_ptr[t], succ_ptr[t + 1]):
                u = succ_idx[k]
                ready[u] = max(ready[u], now + succ_gap[k])
                indeg[u] -= 1
                if indeg[u] == 0:
                    push(heap, (ready[u], 1, u, 0))
    return np.asarray(start, dtype=np.float64), np.asarray(finish, dtype=np.float64), events


def _push_groups(
    pending: list[tuple[float, int, np.ndarray]], seq: int, tids: np.ndarray, times: np.ndarray
) -> int:
    """Queue transfers to start at `times`, one heap entry per distinct time."""
    if not len(tids):
        return seq
    if times.min() == times.max():
        heapq.heappush(pending, (float(times[0]), seq, tids))
        return seq + 1
    order = np.argsort(times, kind="stable")
    tids, times = tids[order], times[order]
    cuts = np.flatnonzero(np.diff(times)) + 1
    edges = [0, *cuts.tolist(), len(tids)]
    for lo, hi in itertools.pairwise(edges):
        heapq.heappush(pending, (float(times[lo]), seq, tids[lo:hi]))
        seq += 1
    return seq


def _rates(res: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Per-link equal share: each flow gets the smallest cap/nflows along its resources."""
    return _counted_rates(res, cap)[1]


def _counted_rates(res: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flows on each resource, and `_rates`."""
    # cap / count per resource, the same division either way (so the same bits): over every
    # resource where they are fewer than the flows' entries, else only at the entries (a
    # 512-rank read-back: ~21,000 resources, windows of ~1,500 flows on 8 each).
    counts = np.bincount(res.ravel(), minlength=len(cap))
    return counts, _shares(res, cap, counts)


def _shares(res: np.ndarray, cap: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`_rates` from the flows' counts (those of any set of flows that holds every flow on
    these flows' resources: the counts there are the same)."""
    flat = res.ravel()
    if len(cap) <= len(flat):
        share = np.take(cap / np.maximum(counts, 1), flat)
    else:
        share = np.take(cap, flat) / np.take(counts, flat)
    return np.minimum.reduce(share.reshape(res.shape), axis=0)


def _fluid(
    now: float,
    t0: np.ndarray,
    rem: np.ndarray,
    res: np.ndarray,
    cap: np.ndarray,
    horizon: float,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact fluid evolution of contending flows (no arrivals other than at `t0`) until horizon.

    Event by event, re-rating the whole group at each event: on the synchronized schedules that
    reach here most flows change at every event anyway, and measured on the 512-rank NCCL ring
    this beat an incremental channel -> flows index by 2.7x. Returns finish times (nan = still
    running), remaining bytes at the end, and the number of sub-steps.
    """
    k = len(t0)
    fin = np.full(k, np.nan)
    rem = rem.copy()
    alive = np.ones(k, dtype=bool)
    t = now
    steps = 0
    while True:
        steps += 1
        tol = _TOL * max(abs(t), 1.0)
        started = np.flatnonzero(alive & (t0 <= t + tol))
        waiting = alive & (t0 > t + tol)
        t_s = float(t0[waiting].min()) if waiting.any() else np.inf
        if len(started):
            rate = _rates(res[:, started], cap)
            left = rem[started] / rate
            t_next = min(t + float(left.min()), t_s, horizon)
            rem[started] -= rate * (t_next - t)
            done = started[left <= (t_next - t) + _TOL * max(abs(t_next), 1.0)]
            fin[done] = t_next
            alive[done] = False
        else:
            t_next = min(t_s, horizon)
        t = t_next
        if t >= horizon or not alive.any():
            break
    rem[~alive] = 0.0
    return fin, rem, steps


def _batch_engine(p: _Prepared, stop: tuple[float, float] = (np.inf, 0.0),
                  ) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """Windowed conservative engine over flat arrays.

    Every transfer flows at least `lookahead` = min(alpha, gaps) after the finish of any of its
    deps, so nothing that finishes inside [t, t + lookahead) can start a flow inside it: all
    arrivals of the window are already queued. Flows that share no channel with any other flow of the window
    keep a constant rate, so they advance in one vectorized step; flows that contend are evolved
    exactly, event by event, by `_fluid`. With lookahead 0 the window shrinks to one instant.
    `stop`: as `_heap_engine`'s.
    """
    n = p.n
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    indeg = p.indeg.copy()
    cap, nbytes, alpha = p.cap, p.nbytes, p.alpha
    ready_at = alpha.copy()
    pad = p.pad
    lookahead = float(min(alpha.min(), p.succ_gap.min(initial=np.inf))) if n else 0.0
    pending: list[tuple[float, int, np.ndarray]] = []
    roots = np.flatnonzero(indeg == 0)
    seq = _push_groups(pending, 0, roots, alpha[roots])
    act = np.zeros(0, dtype=np.int64)
    rem = np.zeros(0)
    res = np.zeros((p.res.shape[0], 0), dtype=np.int32)
    now = 0.0
    events = 0
    while pending or len(act):
        t_first = pending[0][0] if pending else np.inf
        act_counts = None  # without lookahead: the flows on each resource of `act`
        if len(act):
            # With lookahead the window may start at any time <= the first event: the solo rate
            # bounds every flow's rate from above, so rem/solo never overshoots its finish.
            if lookahead > 0:
                rates = p.solo[act]
            else:
                act_counts, rates = _counted_rates(res, cap)
            t_first = min(t_first, now + float((rem / rates).min()))
        horizon = t_first + lookahead
        tol = _TOL * max(abs(t_first), 1.0)
        limit = horizon if lookahead > 0 else t_first + tol
        s_tids: list[np.ndarray] = []
        s_times: list[np.ndarray] = []
        while pending and (pending[0][0] < limit if lookahead > 0 else pending[0][0] <= limit):
            t, _, tids = heapq.heappop(pending)
            s_tids.append(tids)
            s_times.append(np.full(len(tids), t))
        if s_tids:
            new = np.concatenate(s_tids)
            new_t = np.concatenate(s_times)
            start[new] = new_t
            events += len(new)
            g_tid = np.concatenate([act, new])
            g_t0 = np.concatenate([np.full(len(act), now), new_t])
            g_rem = np.concatenate([rem, nbytes[new]])
            g_res = np.concatenate([res, p.res[:, new]], axis=1)
        else:
            g_tid, g_t0, g_rem, g_res = act, np.full(len(act), now), rem, res
        if lookahead == 0:
            horizon = t_first
        # One instant and nothing new (most windows of a 512-rank read-back: ~2,000 flows
        # running, a few ending): the group is `act`, already counted and rated above.
        instant = act_counts is not None and not s_tids
        counts = (act_counts if act_counts is not None and instant
                  else np.bincount(g_res.ravel(), minlength=len(cap)))  # fmt: skip
        pads, counts[pad] = counts[pad], 0
        contended = (np.take(counts, g_res) > 1).any(axis=0)  # take: ~40% faster than indexing
        counts[pad] = pads
        g_fin = np.full(len(g_tid), np.nan)
        single = np.flatnonzero(~contended)
        if len(single):
            rate = p.solo[g_tid[single]]
            t0 = g_t0[single]
            f = t0 + g_rem[single] / rate
            done = f <= horizon + _TOL * max(abs(horizon), 1.0)
            g_fin[single[done]] = f[done]
            g_rem[single] = np.where(done, 0.0, g_rem[single] - rate * (horizon - t0))
        many = np.flatnonzero(contended)
        # `_fluid`'s first step, bit for bit, where it is its only one (below): the flows
        # starting now and their rates. A shared resource carries contended flows only, so
        # the counts over the flows that start are those of a set holding them all.
        step, rate = many, None
        if len(many):
            now_tol = now + _TOL * max(abs(now), 1.0)
            late = many[many >= len(act)]  # arrivals come after `act` in the group
            if act_counts is not None and not (len(late) and float(g_t0[late].min()) <= now_tol):
                # only the running flows start (`act` counted above; arrivals wait)
                step = many[: len(many) - len(late)]
                rate = rates[step]
            elif float(g_t0[many].max()) <= now_tol:  # every contended flow starts now
                rate = _shares(g_res[:, many], cap, counts)
        left = None if rate is None else g_rem[step] / rate
        if left is not None and (not len(left) or now + float(left.min()) >= horizon):
            # no flow ends before the horizon: one step reaches it
            r = g_rem[step] - rate * (horizon - now)
            done = left <= (horizon - now) + _TOL * max(abs(horizon), 1.0)
            r[done] = 0.0
            g_fin[step[done]] = horizon
            g_rem[step] = r
        elif len(many):
            f, r, _ = _fluid(now, g_t0[many], g_rem[many], g_res[:, many], cap, horizon)
            g_fin[many] = f
            g_rem[many] = r
        finished = ~np.isnan(g_fin)
        if finished.any():
            ftids = g_tid[finished]
            ftimes = g_fin[finished]
            finish[ftids] = ftimes
            events += len(ftids)
            last = float(ftimes.max()) + stop[1]
            if last >= stop[0]:
                raise Slower(last)
            lo, hi = p.succ_ptr[ftids], p.succ_ptr[ftids + 1]
            lens = hi - lo
            total = int(lens.sum())
            if total:
                offs = np.repeat(lo - np.cumsum(lens) + lens, lens) + np.arange(total)
                succ = p.succ_idx[offs]
                np.maximum.at(ready_at, succ, np.repeat(ftimes, lens) + p.succ_gap[offs])
                np.subtract.at(indeg, succ, 1)
                ready = sorted_unique(succ[indeg[succ] == 0])
                seq = _push_groups(pending, seq, ready, ready_at[ready])
            keep = ~finished
            act, rem, res = g_tid[keep], g_rem[keep], g_res[:, keep]
        else:
            act, rem, res = g_tid, g_rem, g_res
        now = horizon
    return start, finish, events


def simulate(
    schedule: Schedule | ScheduleArrays,
    topo: ClusterTopology,
    size_bytes: float,
    protocol: ProtocolCost = SIMPLE,
    router: Router | None = None,
    *,
    engine: Engine = "auto",
    top_channels: int = 5,
    fallback: Engine = "auto",
    give_up_at: float = np.inf,
) -> SimResult:
    """Completion time of `schedule` moving `size_bytes` (nccl-tests' size) on `topo`.

    `fallback` is the engine used when `engine="symmetric"` does not apply (see `note`).
    `give_up_at`: raise Slower once the time is known to be at least that (a caller that only
    asks whether the run beats it): the time is the latest finish, and a finish seen is a
    lower bound on it. Without the protocol's floor, which only raises the time further."""
    arrays = (
        schedule if isinstance(schedule, ScheduleArrays) else ScheduleArrays.from_schedule(schedule)
    )
    if router is None:
        router = Router(topo)
    elif router.topo is not topo and router.topo != topo:
        raise SimulationError(
            f"the router was built for cluster {router.topo.name!r}, not {topo.name!r}"
        )
    note = ""
    if engine == "symmetric":
        q = prepare_symmetric(arrays, topo, router, protocol)
        if not isinstance(q, str):
            return _simulate_quotient(arrays, q, size_bytes, protocol, give_up_at)
        note, engine = q, ("auto" if fallback == "symmetric" else fallback)
    p = _prepare(arrays, router, size_bytes, protocol)
    use = engine if engine != "auto" else ("batch" if p.n >= _AUTO_BATCH_MIN else "heap")
    start, finish, events = _run(p, use, (give_up_at, protocol.launch_us))
    start, finish = start + protocol.launch_us, finish + protocol.launch_us
    time_us = _call_time(finish, protocol)
    rank_finish = np.zeros(arrays.nranks)
    if p.n:
        np.maximum.at(rank_finish, arrays.src, finish)
        np.maximum.at(rank_finish, arrays.dst, finish)
    return SimResult(
        time_us=time_us,
        rank_finish_us=rank_finish,
        events=events,
        transfers=p.n,
        busiest=_busiest(p, router, time_us, top_channels),
        simulated_start=start,
        simulated_finish=finish,
        engine=use,
        note=note,
        threadblocks=threadblocks_per_rank(arrays) if protocol.tb_gbps is not None else 0,
    )


def _call_time(finish: np.ndarray, protocol: ProtocolCost) -> float:
    """The call's time: its last finish (launch included), at least the protocol's floor."""
    return max(float(finish.max()), protocol.floor_us) if len(finish) else 0.0


def _run(p: _Prepared, use: str, stop: tuple[float, float] = (np.inf, 0.0),
         ) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    if use == "heap":
        start, finish, events = _heap_engine(p, stop)
    elif use == "batch":
        start, finish, events = _batch_engine(p, stop)
    else:
        raise SimulationError(f"unknown engine {use!r} (auto, heap, batch or symmetric)")
    if p.n and np.isnan(finish).any():
        stuck = np.flatnonzero(np.isnan(finish))
        raise SimulationError(
            f"deadlock: {len(stuck)} transfers never became ready (dependency cycle through "
            f"transfer {int(stuck[0])})"
        )
    return start, finish, events


def _simulate_quotient(
    arrays: ScheduleArrays, q: Quotient, size_bytes: float, protocol: ProtocolCost,
    give_up_at: float = np.inf,
) -> SimResult:
    p = _prepare_quotient(arrays, q, size_bytes, protocol)
    # Representatives crowd onto few orbit resources: the vectorized engine wins early, unless
    # queue deps (no latency gap) shrink its window to one instant; then the heap engine is
    # faster (h800-rail-64 AllGather sweep: evaluation 2.0 s -> 1.5 s).
    windowed = p.n >= _QUOTIENT_BATCH_MIN and p.succ_gap.min(initial=np.inf) > 0
    start, finish, events = _run(p, "batch" if windowed else "heap", (give_up_at, protocol.launch_us))
    start, finish = start + protocol.launch_us, finish + protocol.launch_us
    time_us = _call_time(finish, protocol)
    if q.images == arrays.nranks:  # every rank is an image of every other
        rank_finish = np.full(arrays.nranks, time_us)
    else:  # a rank finishes with the representatives its H-orbit sends or receives
        per_class = np.zeros(arrays.nranks)
        for end in (arrays.src, arrays.dst):
            np.maximum.at(per_class, q.rank_class[end[q.reps]], finish)
        rank_finish = per_class[q.rank_class]
    return SimResult(
        time_us=time_us,
        rank_finish_us=rank_finish,
        events=events * q.images,  # events the full simulation would have processed
        transfers=len(arrays),
        busiest=[],
        simulated_start=start,
        simulated_finish=finish,
        engine="symmetric",
        rep_of=q.rep_of,
        threadblocks=threadblocks_per_rank(arrays) if protocol.tb_gbps is not None else 0,
    )


def _busiest(p: _Prepared, router: Router, time_us: float, k: int) -> list[ChannelLoad]:
    if p.n == 0 or k <= 0:
        return []
    pair_bytes = np.bincount(p.pair, weights=p.nbytes, minlength=len(p.pair_off) - 1)
    per_chan = np.bincount(
        p.pair_chans, weights=np.repeat(pair_bytes, np.diff(p.pair_off)), minlength=router.nchannels
    )
    top = np.argsort(-per_chan, kind="stable")[:k]
    out = []
    for c in top.tolist():
        if per_chan[c] <= 0:
            break
        busy = per_chan[c] / (router.capacity[c] * 1e3)
        out.append(
            ChannelLoad(c, router.channel_name(c), float(per_chan[c]), float(busy / time_us))
        )
    return out
