"""AllGather as two rings per rail and an NVSwitch spread (issue 18, session 9).

Fabric: S servers x L GPUs, rank = server * L + lane; GPU (s, lane) reaches (s', lane) through its
own NIC (the rail) and its server's GPUs through NVSwitch. One chunk per rank. Per GPU:
- two ring threadblocks on its rail, one each way round (receive from (s-1, lane), send to
  (s+1, lane), and the mirror). Each sends the GPU's own chunk (`s`, from the input), then
  forwards each chunk it receives (`rcs`: into the output and on, in one step) until the chunk
  is S // 2 (the other way round (S-1) // 2) servers from where it started, where it is only
  received (`r`). Each NIC carries S-1 chunks, the least an AllGather can; a chunk waits on at
  most S / 2 hops (one ring would chain S-1 hops at one threadblock's rate, 28 GB/s under a
  50 GB/s NIC). One chunk in flight per connection: every GPU sends before it receives, and a
  Simple FIFO holding two would leave each `rcs` waiting for room (the read-back deadlocks);
- per local peer q one send threadblock (its own chunk, then each chunk as the rings bring it,
  each `s` waiting on the ring step that received it) and one receive threadblock (q's, in the
  order q sends them);
- the own chunk's `cpy` from input to output, last on a ring threadblock (in place it copies a
  slot onto itself).
Total 2 + 2 (L - 1) threadblocks (16 on 8 GPUs a server); S steps on each spread threadblock,
S // 2 + 2 on the forward ring's.
"""

from __future__ import annotations

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Schedule, ScheduleArrays, dep_csr
from .direct import OneDepThreadblock, add_rank
from .limits import MAX_STEPS
from .writer import Item, MscclLowering, _Layout, _Step


def ring_order(hops: int) -> list[tuple[str, int]]:
    """One ring threadblock's steps on every GPU: ("s" | "rcs" | "r", servers the chunk has
    come)."""
    return [("s", 0), *(("rcs", b) for b in range(1, hops)), *([("r", hops)] if hops else [])]


def ring_hops(servers: int) -> tuple[int, int]:
    """Servers each way round a chunk travels: the forward ring takes the larger half."""
    return servers // 2, (servers - 1) // 2


def arrival(servers: int) -> list[int]:
    """The order chunks reach a GPU (servers back along its rail, negative the other way
    round): its own, then the two rings' alternately."""
    fwd, bwd = ring_hops(servers)
    out = [0]
    for b in range(1, fwd + 1):
        out += [b, -b] if b <= bwd else [b]
    return out



def rail_ring_allgather(servers: int, local: int, name: str,
                        budget: int) -> tuple[ScheduleArrays, MscclLowering]:  # fmt: skip
    """The schedule (for the simulator) and the file's lowering; MscclFormatError when it does
    not fit `budget` threadblocks or the executor's step limit."""
    if servers < 2 or local < 1:
        raise ValueError("a rail ring needs >= 2 servers of >= 1 GPU")
    coll, n = Collective.ALLGATHER, servers * local
    order = arrival(servers)

    def on_rail(r: int, back: int) -> int:  # the rank `back` servers before r on its rail
        s, lane = divmod(r, local)
        return ((s - back) % servers) * local + lane

    tb_meta: list[list[tuple[int, int, int]]] = []
    items_of: list[dict[int, list[Item]]] = []
    for r in range(n):
        s, lane = divmod(r, local)
        peers = [s * local + q for q in range(local) if q != lane]
        got: dict[int, _Step] = {}  # servers back -> the ring step that received that chunk
        rings = []
        for sign, hops in zip((1, -1), ring_hops(servers), strict=True):
            if not hops:
                continue
            tb = OneDepThreadblock(on_rail(r, -sign), on_rail(r, sign))
            for op, back in ring_order(hops):
                if op == "s":
                    tb.add(r, "s", ("i", 0), ("o", r))
                else:
                    at = ("o", on_rail(r, sign * back))
                    got[sign * back] = tb.add(r, op, at, at)
            rings.append(tb)
        rings[0].add(r, "cpy", ("i", 0), ("o", r))
        sends = []
        for q in peers:
            tb = OneDepThreadblock(q, -1)
            for back in order:
                src = ("i", 0) if back == 0 else ("o", on_rail(r, back))
                tb.add(r, "s", src, ("o", on_rail(r, back)), got.get(back))
            sends.append(tb)
        recvs = []
        for q in peers:
            tb = OneDepThreadblock(-1, q)
            for back in order:
                at = ("o", on_rail(q, back))
                tb.add(r, "r", at, at)
            recvs.append(tb)
        every = [*rings, *sends, *recvs]
        add_rank(every, tb_meta, items_of)
    sched = Schedule(name, coll, n, 1, [], channels=1)
    low = MscclLowering(sched, _Layout(coll, n, 1), [{} for _ in range(n)], tb_meta, items_of, 1)
    low.require(max_threadblocks=budget, max_steps=MAX_STEPS)
    return _arrays(servers, local, name, order), low


def _arrays(servers: int, local: int, name: str, order: list[int]) -> ScheduleArrays:
    """What the simulator times: each ring's hops chained (each after the hop that brought the
    chunk), the spread after the hop into its sender; one transfer in flight per connection."""
    n = servers * local
    add = (chained := Chained()).add

    def rank(s: int, lane: int) -> int:
        return (s % servers) * local + lane

    into: dict[tuple[int, int], int] = {}  # (receiving rank, servers back) -> its ring hop
    for sign, hops in zip((1, -1), ring_hops(servers), strict=True):
        for back in range(1, hops + 1):  # every rank's k-th receive at once
            for r in range(n):
                s, lane = divmod(r, local)
                before = (into[(rank(s - sign, lane), sign * (back - 1))],) if back > 1 else ()
                into[(r, sign * back)] = add(rank(s - sign, lane), r, rank(s - sign * back, lane),
                                             before)  # fmt: skip
    for back in order:
        for r in range(n):
            s, lane = divmod(r, local)
            after = (into[(r, back)],) if back else ()
            for q in range(local):
                if q != lane:
                    add(r, rank(s, q), rank(s - back, lane), after)
    return chained.allgather(name, n)


class Chained:
    """An AllGather's transfers as the simulator times a ring file's: one transfer in flight per
    connection, so each waits on the connection's previous one besides what it names."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []
        self.deps: list[tuple[int, ...]] = []
        self._last: dict[tuple[int, int], int] = {}

    def add(self, u: int, v: int, chunk: int, after: tuple[int, ...]) -> int:
        prev = self._last.get((u, v))
        self.rows.append((u, v, chunk))
        self.deps.append(after if prev is None else (*after, prev))
        self._last[(u, v)] = len(self.rows) - 1
        return len(self.rows) - 1

    def allgather(self, name: str, nranks: int) -> ScheduleArrays:
        src, dst, chunks = (np.asarray(x, dtype=np.int64) for x in zip(*self.rows, strict=True))
        ptr, idx = dep_csr(self.deps)
        m = len(self.rows)
        return ScheduleArrays(
            name=name, collective=Collective.ALLGATHER, nranks=nranks, chunks_per_rank=1,
            src=src.astype(np.int32), dst=dst.astype(np.int32), chunk=chunks,
            count=np.ones(m, dtype=np.int32), reduce=np.zeros(m, dtype=bool),
            channel=np.zeros(m, dtype=np.int32), dep_ptr=ptr, dep_idx=idx, channels=1,
        )  # fmt: skip


__all__ = ["Chained", "arrival", "rail_ring_allgather", "ring_hops", "ring_order"]
