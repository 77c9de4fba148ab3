"""A lower bound on an MSCCL file's published time, from its lowering alone (no read-back).

`published_estimate` (evaluate.py) reads a file back, slices it (formats/msccl/slicing.py) and
simulates it. Reading back costs more than the rest, so a caller that keeps only a faster file
asks `published_lower_bound` first: when the bound already reaches the best time so far, the
file cannot win and is neither read nor simulated. Why the simulator can never report less is
written out in docs/synthesis-scale.md, "Session 12: files that cannot win"; in short, over the
first K' iterations of the K the evaluator simulates (K' <= K):
- a send's transfers start after the transfers its threadblock has received by then, or the
  steps its depid names (plus their step latency), and after those the receiving threadblock
  has received before its receive (no latency: the same destination);
- iteration j's sends start after the threadblock's last send of iteration j-1 and (plus
  their latency) its last receive of j-1;
- a flow moves no faster than the least capacity on its path or its threadblock's rate, and
  the flows on one resource share its capacity, so it carries its bytes no faster;
plus the launch, and the protocol's floor. Local operations (cpy, re) are left out: they only
add waits and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..api.common import Collective
from .cost.protocols import ProtocolCost
from .formats.msccl.executor import RECV_TYPES, SEND_TYPES
from .formats.msccl.slicing import iterations_to_simulate, slicing
from .formats.msccl.writer import MscclLowering
from .sim.capacity import link_capacity, step_count
from .sim.routing import Router

# The bound is lowered by this relative margin: the engines' event times carry float rounding
# (and the batch engine ends a flow within 1e-12 relative of its finish).
MARGIN = 1e-9


@dataclass(frozen=True, slots=True)
class FileShape:
    """What the bound reads of a lowering. Steps (nops included) are numbered rank by rank,
    threadblock by threadblock, in order; sends apart. -1: none."""

    chunks_per_loop: int
    before: np.ndarray  # [2, steps]: the step before it on its threadblock; its depid's step
    sender: np.ndarray  # per step: the send whose data it receives (-1: not a receive)
    levels: tuple[np.ndarray, ...]  # steps by depth along before and sender
    send_step: np.ndarray  # per send: its step (ascending)
    cnt: np.ndarray  # per send: chunks
    conn: np.ndarray  # per send: its connection (index into `routes`)
    tb_last_send: np.ndarray  # per send: its threadblock's last send
    tb_last_recv: np.ndarray  # per send: the send its threadblock's last receive receives
    routes: tuple[tuple[int, int, int], ...]  # (src, dst, chan) per connection
    transfers: tuple[int, int]  # the read-back's transfers lie in this range (runs of chunks)


_KIND = {t: (t in RECV_TYPES) + 2 * (t in SEND_TYPES) for t in (*RECV_TYPES, *SEND_TYPES)}


def file_shape(low: MscclLowering) -> FileShape | None:
    """The lowering's steps and what they wait for; None where a receive meets no send or the
    waits form a cycle (the read-back refuses such a file and says why)."""
    kind: list[int] = []  # per step: 1 receives, 2 sends, 3 both, 0 neither
    cnt: list[int] = []
    dep_tb: list[int] = []  # per step: its depid's threadblock (global number), position
    dep_at: list[int] = []
    sizes: list[int] = []  # per threadblock: steps
    send_key: list[tuple[int, int, int]] = []  # per threadblock: its connections
    recv_key: list[tuple[int, int, int]] = []
    get = _KIND.get
    for r, tbs in enumerate(low.tb_meta):
        items_of = low.items_of[r]
        base = len(sizes)
        for tb, (p, q, chan) in enumerate(tbs):
            items = items_of.get(tb, ())
            sizes.append(len(items))
            send_key.append((r, p, chan) if p >= 0 else (-1, -1, -1))
            recv_key.append((q, r, chan) if q >= 0 else (-1, -1, -1))
            kind += [0 if st is None else get(st.type, 0) for _, st, _ in items]
            cnt += [0 if st is None else st.cnt for _, st, _ in items]
            dep_tb += [-1 if on is None else base + on.tb for _, _, on in items]
            dep_at += [0 if on is None else on.index for _, _, on in items]
    n = len(kind)
    tb_len = np.asarray(sizes, dtype=np.int64)
    start = np.zeros(len(tb_len) + 1, dtype=np.int64)
    np.cumsum(tb_len, out=start[1:])
    tb_of = np.repeat(np.arange(len(tb_len)), tb_len)
    pos = np.arange(n) - start[tb_of]
    kinds = np.asarray(kind, dtype=np.int8)
    is_recv, is_send = (kinds & 1) > 0, (kinds & 2) > 0
    # connections numbered; the k-th send on one meets its k-th receive (one threadblock at
    # each end: the reader refuses two)
    keys = {k: i for i, k in enumerate(dict.fromkeys([*send_key, *recv_key]))}
    for side in (send_key, recv_key):
        if len(set(side) - {(-1, -1, -1)}) != sum(k != (-1, -1, -1) for k in side):
            return None  # two threadblocks on one connection
    none = keys.get((-1, -1, -1), -1)
    s_conn = np.asarray([keys[k] for k in send_key], dtype=np.int64)
    r_conn = np.asarray([keys[k] for k in recv_key], dtype=np.int64)
    sends = np.flatnonzero(is_send)
    recvs = np.flatnonzero(is_recv)
    if np.any(s_conn[tb_of[sends]] == none) or np.any(r_conn[tb_of[recvs]] == none):
        return None  # a step on a peer the threadblock does not have
    span = n + 1
    s_key = s_conn[tb_of[sends]] * span + _rank_in_group(tb_of[sends])
    r_key = r_conn[tb_of[recvs]] * span + _rank_in_group(tb_of[recvs])
    order = np.argsort(s_key, kind="stable")
    found = np.searchsorted(s_key[order], r_key)
    if len(r_key) != len(s_key) or np.any(found >= len(s_key)) or np.any(
            s_key[order][np.minimum(found, len(s_key) - 1)] != r_key):  # fmt: skip
        return None  # a receive no send meets, or a send no receive
    m = len(sends)
    sender = np.full(n, -1, dtype=np.int64)
    sender[recvs] = order[found]  # send numbers
    prev = np.where(pos > 0, np.arange(n) - 1, -1)
    dt = np.asarray(dep_tb, dtype=np.int64)
    dep = np.where(dt >= 0, start[np.maximum(dt, 0)] + np.asarray(dep_at, dtype=np.int64), -1)
    if np.any((dt >= 0) & (np.asarray(dep_at) >= tb_len[np.maximum(dt, 0)])):
        return None
    before = np.stack([prev, dep])
    levels = _levels(before, sender, sends)
    if levels is None:
        return None
    send_tb = tb_of[sends]
    last_send = np.full(len(tb_len), -1, dtype=np.int64)
    np.maximum.at(last_send, send_tb, np.arange(m))  # sends are numbered in step order
    last_recv = np.full(len(tb_len) + 1, -1, dtype=np.int64)
    np.maximum.at(last_recv, tb_of[recvs], recvs)
    last_recv = np.append(sender, -1)[last_recv[:-1]]  # step -1 (none): no send
    cnt_a = np.asarray(cnt, dtype=np.int64)[sends]
    routes = tuple(k for k in keys if k != (-1, -1, -1))
    conn = s_conn[send_tb]
    if none >= 0:  # route numbers without the placeholder
        conn = conn - (conn > none)
    return FileShape(low.chunks_per_loop, before, sender, levels, sends, cnt_a, conn,
                     last_send[send_tb], last_recv[send_tb], routes, (m, int(cnt_a.sum())))  # fmt: skip


def _rank_in_group(group: np.ndarray) -> np.ndarray:
    """Each element's position among the equal elements before it (`group` sorted)."""
    if not len(group):
        return group
    first = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
    return np.arange(len(group)) - np.repeat(first, np.diff(np.r_[first, len(group)]))


def _levels(before: np.ndarray, sender: np.ndarray, send_step: np.ndarray,
            ) -> tuple[np.ndarray, ...] | None:  # fmt: skip
    """Steps grouped by depth (Kahn's frontiers): after the steps `before` names and, for a
    receive, its sender's step; None on a cycle."""
    n = before.shape[1]
    via = np.where(sender >= 0, np.append(send_step, -1)[sender], -1)
    preds = np.concatenate([before, via[None, :]])
    owner = np.broadcast_to(np.arange(n), preds.shape)[preds >= 0]
    pred = preds[preds >= 0]
    order = np.argsort(pred, kind="stable")
    succ = owner[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pred, minlength=n), out=ptr[1:])
    indeg = np.bincount(owner, minlength=n)
    frontier = np.flatnonzero(indeg == 0)
    out: list[np.ndarray] = []
    done = 0
    while len(frontier):
        out.append(frontier)
        done += len(frontier)
        lo, hi = ptr[frontier], ptr[frontier + 1]
        lens = hi - lo
        total = int(lens.sum())
        if not total:
            break
        at = np.repeat(lo - np.cumsum(lens) + lens, lens) + np.arange(total)
        nxt = succ[at]
        np.subtract.at(indeg, nxt, 1)
        nxt = np.unique(nxt)
        frontier = nxt[indeg[nxt] == 0]
    return tuple(out) if done == n else None


def published_lower_bound(shape: FileShape, collective: Collective | str, size_bytes: int,
                          router: Router, cost: ProtocolCost) -> float:  # fmt: skip
    """A time (us) that `published_estimate` of the file at `size_bytes` with `cost`'s protocol
    never goes below (docs/synthesis-scale.md, "Session 12: files that cannot win")."""
    sl = slicing(cost.name, size_bytes, shape.chunks_per_loop, collective)
    # the fewest iterations its first run can have: every chunk counted as a transfer
    k = iterations_to_simulate(sl, shape.transfers[1])[0]
    # per-chunk bytes of each iteration: full slices, the last the call's remainder (at most a
    # slice: the simulated run's last iteration moves either); rint in slicing.with_slices
    per_chunk = np.full(k, float(sl.slice_bytes))
    per_chunk[-1] = sl.last_bytes
    cnt = shape.cnt.astype(np.float64)
    nbytes = np.maximum(per_chunk[:, None] * cnt[None, :] - 0.5 * cnt[None, :], 1.0)
    one_run = np.maximum(per_chunk - 0.5, 1.0)[:, None]  # a run is at least one chunk
    run_bytes = np.where(cnt[None, :] > 1, one_run, nbytes)
    src = np.fromiter((r[0] for r in shape.routes), dtype=np.int64, count=len(shape.routes))
    dst = np.fromiter((r[1] for r in shape.routes), dtype=np.int64, count=len(shape.routes))
    chan = np.fromiter((r[2] for r in shape.routes), dtype=np.int64, count=len(shape.routes))
    slots = router.nic_slots(src, dst, chan)
    off, chans, lat = router.paths_csr(zip(src.tolist(), dst.tolist(), slots.tolist(), strict=True))
    msg = router.message_us(src, dst)
    cap = link_capacity(router, cost)
    per_route_cap = np.full(len(src), np.inf)
    crosses = np.diff(off) > 0  # (every send's route crosses a link; an empty one caps nothing)
    if crosses.any():
        per_route_cap[crosses] = np.minimum.reduceat(cap[chans], off[:-1][crosses])
    tb_cap = np.inf if cost.tb_gbps is None else cost.tb_gbps * 1e3
    solo = np.minimum(per_route_cap, tb_cap)[shape.conn]
    r = shape.conn
    steps = step_count(run_bytes.ravel(), cost).reshape(run_bytes.shape)
    alpha = (cost.step_latency_us + msg[r])[None, :] * steps + lat[r][None, :]
    dur = nbytes / solo[None, :]
    # longest path, iteration by iteration, level by level: `got` per step is a time every
    # transfer its threadblock has received by then finished at (what a send there waits for)
    n, m = len(shape.sender), len(r)
    pred, dep = shape.before
    sender = shape.sender
    fin = np.full(m + 1, -np.inf)  # per send: its transfers' last finish; [-1]: none
    one = np.full(m + 1, -np.inf)  # per send: one of its runs' finish (the next iteration's waits)
    dur_one = np.where(cnt > 1, one_run / solo[None, :], dur)
    tls, tlr = shape.tb_last_send, shape.tb_last_recv
    chain = 0.0
    for j in range(k):
        got = np.full(n + 1, -np.inf)
        al, du = alpha[j], dur[j]
        floor_s = np.maximum(one[tls], one[tlr] + al) if j else np.full(m, -np.inf)
        start = np.empty(m)
        for idx in shape.levels:
            own = np.maximum(got[pred[idx]], got[dep[idx]])  # received before it, or released it
            x = sender[idx]
            recv = x >= 0
            got[idx] = own
            if recv.any():
                ri, xi = idx[recv], x[recv]
                a = al[xi]
                s = np.maximum(np.maximum(a, got[shape.send_step[xi]] + a), own[recv])
                s = np.maximum(s, floor_s[xi])
                start[xi] = s
                got[ri] = fin[xi] = s + du[xi]
        one[:m] = start + dur_one[j]
        chain = max(chain, float(fin[:m].max()))
    # each resource carries its bytes at no more than its capacity, after the first latency
    total = nbytes.sum(axis=0)
    per_route = np.bincount(r, weights=total, minlength=len(src))
    carried = np.bincount(chans, weights=np.repeat(per_route, np.diff(off)), minlength=len(cap))
    busy = float((carried / cap).max()) if len(cap) else 0.0
    per_conn = np.bincount(shape.conn, weights=total)
    busy = max(busy, float(per_conn.max()) / tb_cap)
    first = float(alpha.min())
    t = cost.launch_us + max(chain, first + busy)
    return max(t, cost.floor_us) * (1.0 - MARGIN)


__all__ = ["FileShape", "file_shape", "published_lower_bound"]
