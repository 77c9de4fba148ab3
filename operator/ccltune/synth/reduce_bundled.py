"""ReduceScatter and AllReduce from a bundled AllGather (assemble.allgather_bundled): the only
schedules within 16 threadblocks and 64 steps on h800-rail-512 (docs/synthesis.md, "ReduceScatter
and AllReduce at scale").

`assemble.reverse` chains the reduces into one (GPU, chunk) by a transfer's first chunk; a bundle
carries a run of chunks, and runs reduced into one GPU in different stages overlap (a GPU forwards
its node's 8 chunks in one stage, 64 including those 8 in the next). Here every chunk of a run is
chained, and the order is one every translate of the refined fabric shares, so the symmetric
simulator still times the result.
"""

from __future__ import annotations

import numpy as np

from ..api.common import Collective
from ..model.schedule.ir import ScheduleArrays
from ..model.sim.arrays import sorted_unique
from ..model.sim.symmetric_sim import refined_sizes
from ..model.sim.translations import Translations

BUNDLED = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
# The executor's steps over this: the most steps of the AllGather's busiest send stream
# (`assemble.bundled_steps`) a bundle may have. 2 where the writer pairs a send with a receive
# (docs/synthesis.md, "Bundled AllGather"). AllReduce runs each stream in both phases (4), and
# the waits across phases add nops: 8 x 16 within 8 threadblocks needed 80 steps at 4.
STREAMS_PER_THREADBLOCK = {Collective.ALLGATHER: 2, Collective.REDUCESCATTER: 2,
                           Collective.ALLREDUCE: 8}  # fmt: skip


def from_allgather(coll: Collective, ag: ScheduleArrays, sizes: list[int],
                   name: str) -> ScheduleArrays:  # fmt: skip
    """`coll` built from the bundled AllGather `ag` on a fabric of `sizes`."""
    if coll == Collective.ALLGATHER:
        return ag
    rs = reverse_bundled(ag, name, sizes)
    if coll == Collective.REDUCESCATTER:
        return rs
    if coll == Collective.ALLREDUCE:
        return allreduce_bundled(rs, ag, name)
    raise ValueError(f"{coll.value} is not built from an AllGather")


def _edges(arr: ScheduleArrays) -> tuple[np.ndarray, np.ndarray]:
    """(transfer, one of its deps) for every dependency."""
    owner = np.repeat(np.arange(len(arr), dtype=np.int64), np.diff(arr.dep_ptr))
    return owner, arr.dep_idx.astype(np.int64)


def _depths(arr: ScheduleArrays) -> np.ndarray:
    """Longest dependency path to each transfer (every edge raises it by one)."""
    owner, dep = _edges(arr)
    depth = np.zeros(len(arr), dtype=np.int64)
    indeg = np.bincount(owner, minlength=len(arr))
    by_dep = np.argsort(dep, kind="stable")
    succ_ptr = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(np.bincount(dep, minlength=len(arr)), out=succ_ptr[1:])
    succ = owner[by_dep]
    front = np.flatnonzero(indeg == 0)
    seen = 0
    while len(front):
        seen += len(front)
        nxt = np.concatenate([succ[succ_ptr[i] : succ_ptr[i + 1]] for i in front])
        np.maximum.at(depth, nxt, depth[np.repeat(front, np.diff(succ_ptr)[front])] + 1)
        np.subtract.at(indeg, nxt, 1)
        front = np.unique(nxt[indeg[nxt] == 0])
    if seen != len(arr):
        raise AssertionError("the AllGather's dependencies have a cycle")
    return depth


def _csr(n: int, owner: np.ndarray, dep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    e = sorted_unique(owner * n + dep)
    e = e[e // n != e % n]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(e // n, minlength=n), out=ptr[1:])
    return ptr, e % n


def reverse_bundled(ag: ScheduleArrays, name: str, sizes: list[int]) -> ScheduleArrays:
    """The bundled AllGather run backwards: each run reversed into a reduce of the same chunks,
    each reduce waiting for the reduces its AllGather run fed (so a GPU passes a chunk on only
    once every partial sum of it has arrived), and for the previous reduce into the same GPU of
    every chunk it carries (the executor must not run two reduces into one buffer at once).

    Reduces are ordered deepest AllGather run first (the last stage's reduces run first), then
    by the peer's offset in the refined fabric's translations and the sender: an order every
    translate shares, so the chains are the same on every GPU relative to it."""
    grp = Translations(refined_sizes(ag, sizes))
    t = len(ag)
    depth = _depths(ag)
    peer = grp.sub(ag.dst.astype(np.int64), ag.src.astype(np.int64))
    order = np.lexsort((ag.src, peer, -depth))
    new_of = np.empty(t, dtype=np.int64)
    new_of[order] = np.arange(t, dtype=np.int64)
    owner, dep = _edges(ag)
    # AllGather's i waits for d: reversed, d's reduce waits for i's.
    parts_o, parts_d = [new_of[dep]], [new_of[owner]]
    chunks = ag.nranks * ag.chunks_per_rank
    last = np.full((ag.nranks, chunks), -1, dtype=np.int64)
    into, first, count = ag.src[order], ag.chunk[order], ag.count[order]
    for pos in range(t):
        held = last[into[pos], first[pos] : first[pos] + count[pos]]
        prev = np.unique(held[held >= 0])
        parts_o.append(np.full(len(prev), pos, dtype=np.int64))
        parts_d.append(prev)
        held[:] = pos
    ptr, idx = _csr(t, np.concatenate(parts_o), np.concatenate(parts_d))
    return ScheduleArrays(
        name=name, collective=Collective.REDUCESCATTER, nranks=ag.nranks,
        chunks_per_rank=ag.chunks_per_rank, src=ag.dst[order].astype(np.int32),
        dst=ag.src[order].astype(np.int32), chunk=ag.chunk[order].astype(np.int64),
        count=ag.count[order].astype(np.int32), reduce=np.ones(t, dtype=bool),
        channel=ag.channel[order].astype(np.int32), dep_ptr=ptr, dep_idx=idx,
        channels=ag.channels,
    )  # fmt: skip


def allreduce_bundled(rs: ScheduleArrays, ag: ScheduleArrays, name: str) -> ScheduleArrays:
    """ReduceScatter then AllGather on the same chunks. A run carrying its sender's own chunk
    waits for that chunk's last reduce into the sender; every other chunk a GPU sends, the
    AllGather brought it after its owner sent it. A GPU's chunk is overwritten only after it
    passed its partial sum on: that reduce is an ancestor of the owner's last one."""
    r, cpr = len(rs), ag.chunks_per_rank
    final = np.full((ag.nranks, ag.nranks * cpr), -1, dtype=np.int64)
    for i in range(r):  # a chain's members come in index order: the last one stands
        final[rs.dst[i], rs.chunk[i] : rs.chunk[i] + rs.count[i]] = i
    ro, rd = _edges(rs)
    ao, ad = _edges(ag)
    parts_o, parts_d = [ro, ao + r], [rd, ad + r]
    lo = ag.chunk.astype(np.int64)
    hi = lo + ag.count
    own_lo = ag.src.astype(np.int64) * cpr
    carries = (lo < own_lo + cpr) & (own_lo < hi)
    for k in np.flatnonzero(carries):
        a, b = int(max(lo[k], own_lo[k])), int(min(hi[k], own_lo[k] + cpr))
        got = np.unique(final[ag.src[k], a:b])
        got = got[got >= 0]
        parts_o.append(np.full(len(got), r + k, dtype=np.int64))
        parts_d.append(got)
    n = r + len(ag)
    ptr, idx = _csr(n, np.concatenate(parts_o), np.concatenate(parts_d))
    cat = np.concatenate
    return ScheduleArrays(
        name=name, collective=Collective.ALLREDUCE, nranks=ag.nranks,
        chunks_per_rank=ag.nranks * cpr, src=cat([rs.src, ag.src]).astype(np.int32),
        dst=cat([rs.dst, ag.dst]).astype(np.int32), chunk=cat([rs.chunk, ag.chunk]).astype(np.int64),
        count=cat([rs.count, ag.count]).astype(np.int32),
        reduce=cat([np.ones(r, dtype=bool), np.zeros(len(ag), dtype=bool)]),
        channel=cat([rs.channel, ag.channel]).astype(np.int32), dep_ptr=ptr, dep_idx=idx,
        channels=max(rs.channels, ag.channels),
    )  # fmt: skip
