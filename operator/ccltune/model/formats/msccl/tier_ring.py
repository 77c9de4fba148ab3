"""AllGather as two rings per rail and a two-stage NVSwitch spread (issue 18, session 11;
docs/synthesis.md, "Session 11: the 3-tier fabric").

Fabric: S servers x L GPUs, rank = server * L + lane, the servers numbered innermost tier first.
On astra-3tier-128 (8 x 4 x 4) a "rail" is the 16 GPUs of one lane across leaf x spine, all behind
one NIC each, so a ring s -> s+1 crosses a leaf's uplink only where s wraps there (4 of 16
hops). The rings are rail_ring.py's. rail_ring's direct spread takes 2 + 2 (L-1) threadblocks
(16), over the 3-tier's budget (12); paired (one threadblock per peer, sends one ahead) it ran
5% slower than this spread (64 MiB: 422.7 against 401.7 us, simulated). Here lane = g * B + i,
L = A x B:
- stage 1: GPU (s, g, i) sends each chunk its rings bring (and its own) to its A-1 "partners"
  (s, g', i), each send waiting on the ring step that received the chunk;
- stage 2: it sends those S chunks and the A-1 partners' S chunks each to its B-1 group peers
  (s, g, i'), each send waiting on the step that received the chunk.
Every GPU still receives each foreign chunk once, (L-1) S over NVLink, as the direct spread;
2 + 2 (A-1) + 2 (B-1) threadblocks (10 on 8 = 2 x 4), A x S steps on a stage-2 one.
"""

from __future__ import annotations

from ....api.common import Collective
from ...schedule.ir import Schedule, ScheduleArrays
from .direct import OneDepThreadblock, add_rank
from .limits import MAX_STEPS
from .rail_ring import Chained, arrival, ring_hops, ring_order
from .writer import Item, Loc, MscclLowering, _Layout, _Step


def groups(local: int) -> tuple[int, int] | None:
    """(A, B): A groups of B lanes with the fewest peers A + B - 2 (A <= B), None under 4 lanes
    or a prime count (no second stage to gain)."""
    best = None
    for a in range(2, int(local**0.5) + 1):
        if local % a == 0 and (best is None or a + local // a < sum(best)):
            best = (a, local // a)
    return best


def threadblocks(local: int) -> int:
    a, b = groups(local) or (1, local)
    return 2 + 2 * (a - 1) + 2 * (b - 1)


class _Fabric:
    def __init__(self, servers: int, local: int) -> None:
        got = groups(local)
        if servers < 2 or got is None:
            raise ValueError("a tier ring needs >= 2 servers of a composite lane count")
        self.servers, self.local = servers, local
        self.a, self.b = got
        self.order = arrival(servers)  # servers back, in the order chunks reach a GPU

    def rank(self, s: int, lane: int) -> int:
        return (s % self.servers) * self.local + lane

    def back(self, r: int, k: int) -> int:
        """The rank k servers before r on its rail (chunk index = rank of origin)."""
        s, lane = divmod(r, self.local)
        return self.rank(s - k, lane)

    def partners(self, r: int) -> list[int]:
        s, lane = divmod(r, self.local)
        g, i = divmod(lane, self.b)
        return [self.rank(s, h * self.b + i) for h in range(self.a) if h != g]

    def peers(self, r: int) -> list[int]:
        s, lane = divmod(r, self.local)
        g, i = divmod(lane, self.b)
        return [self.rank(s, g * self.b + j) for j in range(self.b) if j != i]

    def forwarded(self, r: int) -> list[tuple[int, int]]:
        """(rail owner, servers back) of the chunks r sends in stage 2, in order: per arrival
        step its own rail's chunk, then each partner's."""
        return [(o, k) for k in self.order for o in (r, *self.partners(r))]


def tier_ring_allgather(servers: int, local: int, name: str,
                        budget: int) -> tuple[ScheduleArrays, MscclLowering]:  # fmt: skip
    """The schedule (for the simulator) and the file's lowering; MscclFormatError when it does
    not fit `budget` threadblocks or the executor's step limit."""
    fab = _Fabric(servers, local)
    coll, n = Collective.ALLGATHER, servers * local
    tb_meta: list[list[tuple[int, int, int]]] = []
    items_of: list[dict[int, list[Item]]] = []
    for r in range(n):
        got: dict[tuple[int, int], _Step] = {}  # (rail owner, servers back) -> receiving step
        rings = []
        for sign, hops in zip((1, -1), ring_hops(servers), strict=True):
            if not hops:
                continue
            tb = OneDepThreadblock(fab.back(r, -sign), fab.back(r, sign))
            for op, k in ring_order(hops):
                if op == "s":
                    tb.add(r, "s", ("i", 0), ("o", r))
                else:
                    at = ("o", fab.back(r, sign * k))
                    got[(r, sign * k)] = tb.add(r, op, at, at)
            rings.append(tb)
        rings[0].add(r, "cpy", ("i", 0), ("o", r))
        stage1 = []
        for p in fab.partners(r):
            out, into = OneDepThreadblock(p, -1), OneDepThreadblock(-1, p)
            for k in fab.order:
                src: Loc = ("i", 0) if k == 0 else ("o", fab.back(r, k))
                out.add(r, "s", src, ("o", fab.back(r, k)), got.get((r, k)))
                at = ("o", fab.back(p, k))
                got[(p, k)] = into.add(r, "r", at, at)
            stage1 += [out, into]
        stage2 = []
        for q in fab.peers(r):
            out, into = OneDepThreadblock(q, -1), OneDepThreadblock(-1, q)
            for o, k in fab.forwarded(r):
                src = ("i", 0) if (o, k) == (r, 0) else ("o", fab.back(o, k))
                out.add(r, "s", src, ("o", fab.back(o, k)), got.get((o, k)))
            for o, k in fab.forwarded(q):
                at = ("o", fab.back(o, k))
                into.add(r, "r", at, at)
            stage2 += [out, into]
        add_rank([*rings, *stage1, *stage2], tb_meta, items_of)
    sched = Schedule(name, coll, n, 1, [], channels=1)
    low = MscclLowering(sched, _Layout(coll, n, 1), [{} for _ in range(n)], tb_meta, items_of, 1)
    low.require(max_threadblocks=budget, max_steps=MAX_STEPS)
    return _arrays(fab, name), low


def _arrays(fab: _Fabric, name: str) -> ScheduleArrays:
    """What the simulator times: ring hops chained, each spread send after the step that
    brought its chunk; one transfer in flight per connection."""
    n = fab.servers * fab.local
    add = (chained := Chained()).add
    into: dict[tuple[int, int], int] = {}  # (receiving rank, chunk) -> the transfer
    for sign, hops in zip((1, -1), ring_hops(fab.servers), strict=True):
        for k in range(1, hops + 1):
            for r in range(n):
                prev = fab.back(r, sign)
                before = (into[(prev, fab.back(r, sign * k))],) if k > 1 else ()
                into[(r, fab.back(r, sign * k))] = add(prev, r, fab.back(r, sign * k), before)
    for k in fab.order:
        for r in range(n):
            chunk = fab.back(r, k)
            for p in fab.partners(r):
                into[(p, chunk)] = add(r, p, chunk, (into[(r, chunk)],) if k else ())
    for r in range(n):
        for o, k in fab.forwarded(r):
            chunk = fab.back(o, k)
            for q in fab.peers(r):
                add(r, q, chunk, (into[(r, chunk)],) if chunk != r else ())
    return chained.allgather(name, n)




__all__ = ["groups", "threadblocks", "tier_ring_allgather"]
