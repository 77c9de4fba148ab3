"""ReduceScatter / AllReduce on a rail fabric: the server reduces over NVSwitch, then rings along
each rail (issue 18; docs/synthesis.md, "Rail rings (session 9)").

S servers x G GPUs, GPU (s, l) = rank s*G + l, its NIC on rail l. Chunk (d, l) is rank
d*G + l's output, in p pieces (consecutive chunks). On GPU (s, l):
- G-1 send threadblocks, one per local peer k: its input pieces of every chunk (d, k) to (s, k);
  they wait for nothing;
- G-1 receive threadblocks, one per local peer: `rrc` of that peer's contribution to each piece
  of every chunk (d, l) into the server's partial sum (scratch; its own chunk into the output).
  The G-1 contributions to a piece are chained (each `rrc` waits by depid for the previous one
  of that piece): no race and no local reduce step (`re`, which the read-back does not charge).
  The chain's order rotates with the piece (a Latin square: threadblock i takes piece u at
  "time" u + i mod U), so every threadblock is busy from the start, with no pipeline ramp;
  or (`taper`) a list schedule that ends with the own chunk alone while the rings' last hops
  run (`_tapered`);
- R ring threadblocks (send to (s+1, l), receive from (s-1, l)), ring c on channel c with the
  pieces j = c mod R, one piece's ring after the other: `s` of the partial of (s-1, l), `rrs`
  of (s-2, l) .. (s+1, l) (receive, add the server's partial, send), `rrc` into the output;
  each step waits for the server's last reduce of that piece. One piece at a time per ring:
  a ring whose first step sends two Simple chunks fills the FIFO (8 slots, 4 a chunk) and its
  `rrs` could never send (executor.py). The server reduces pieces in the order rings take them.
The NIC carries S-1 chunks (the least any schedule can), NVLink (G-1) x S.
AllReduce: each piece's ring goes on as an AllGather (`rrcs` of its own chunk, `rcs`, then `r`);
each send threadblock then spreads the reduced pieces of (d, l) to its peer, each send waiting
for the ring step that completed it, in the order they complete; each receive threadblock takes
them. Steps per threadblock: S x p on the NVSwitch ones (AllReduce 2 S x p), S x p / R on a
ring (AllReduce (2S - 1) x p / R).
"""

from __future__ import annotations

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Schedule, ScheduleArrays, dep_csr
from .direct import OneDepThreadblock, add_rank
from .limits import MAX_STEPS
from .writer import Item, Loc, MscclFormatError, MscclLowering, _Layout, _Step

Unit = tuple[int, int]  # (ring step t, piece j): chunk (ring_order[t], l), piece j



def ring_order(s: int, servers: int) -> list[int]:
    """Servers whose chunks GPU s's ring step t carries: s-1, s-2, .., s (its own last)."""
    return [(s - 1 - t) % servers for t in range(servers)]


class Plan:
    """The order of work every GPU of the fabric shares (it depends on no GPU's index)."""

    def __init__(self, servers: int, gpus: int, pieces: int, rings: int,
                 taper: bool = False) -> None:  # fmt: skip
        if servers < 2 or gpus < 2:
            raise ValueError("a rail ring needs >= 2 servers of >= 2 GPUs")
        if pieces < 1 or rings < 1 or pieces % rings:
            raise ValueError(f"{pieces} pieces do not deal over {rings} rings")
        self.servers, self.gpus, self.pieces, self.rings = servers, gpus, pieces, rings
        # the server reduces units in the order the rings take them
        self.units: list[Unit] = sorted(((t, j) for t in range(servers) for j in range(pieces)),
                                        key=lambda u: ((u[1] // rings) * servers + u[0],
                                                       u[1] % rings))  # fmt: skip
        self.size = len(self.units)
        self.column = _tapered(self) if taper else None

    def time(self, u: int, i: int) -> tuple[int, int]:
        """When chain position i reduces unit u: u + i mod U (ties, where U < G-1, by i), or
        its column in the tapered order."""
        if self.column is not None:
            return (self.column[u][i], i)
        return ((u + i) % self.size, i)

    def ops(self) -> list[tuple[int, int]]:
        """Every (chain position, unit) in time order: each unit's reduces in chain order."""
        return sorted(((i, u) for u in range(self.size) for i in range(self.gpus - 1)),
                      key=lambda x: self.time(x[1], x[0]))  # fmt: skip

    def taken(self, i: int) -> list[int]:
        """Unit indices in the order chain position i's threadblock receives them."""
        return sorted(range(self.size), key=lambda u: self.time(u, i))

    def ring(self, c: int) -> list[int]:
        """Pieces ring c carries, one after the other."""
        return list(range(c, self.pieces, self.rings))

    def spread(self) -> list[Unit]:
        """AllReduce: (position in the ring's AllGather order, piece) in the order the rings
        complete them; position 0 is the GPU's own chunk, k > 0 ring_order[k - 1]."""
        return sorted(((k, j) for k in range(self.servers) for j in range(self.pieces)),
                      key=lambda x: (x[1] // self.rings, x[0], x[1] % self.rings))  # fmt: skip


# Columns of margin a unit keeps per ring hop that still follows it (the own chunk's, the last
# hop, keeps none): fitted on h800-rail-64 ReduceScatter p4r4 paired, files read back (64 /
# 256 MiB, us): 1 -> 424.2 / 1,607.0, 2 -> 415.2 / 1,606.9, 3 -> 405.4 / 1,580.0, 4 -> 412.5 /
# 1,617.3 (the Latin square: 422.8 / 1,640.7). docs/synthesis.md, "Session 11: rail-64
# ReduceScatter".
TAPER_COLUMNS = 3


def _tapered(plan: Plan) -> list[list[int]]:
    """Per unit, the column each chain position reduces it in: a list schedule, column by
    column, where each position takes (of the units it has not reduced and no other position
    takes in that column) the one with the least slack: its deadline, TAPER_COLUMNS earlier
    for every ring hop after it, less the reduces it still needs. Units the rings need late go
    last and the own chunk's last of all, so the server's final columns narrow to the own chunk
    while the rings' other hops run (ReduceScatter; the Latin square ends with 7 units done
    in one column, 3 of them two hops from the end)."""
    size, chain, last = plan.size, plan.gpus - 1, plan.servers - 1
    hops = [last - t for t, _ in plan.units]  # ring hops after the own chunk's
    column = [[-1] * chain for _ in range(size)]
    left = [set(range(size)) for _ in range(chain)]
    reduced = [0] * size
    tau = 0
    while any(left):
        taken: set[int] = set()
        # positions with the most left first, rotating ties so none always waits
        for i in sorted(range(chain), key=lambda i: (-len(left[i]), (i - tau) % chain)):
            free = [u for u in left[i] if u not in taken]
            if not free:
                continue
            u = min(free, key=lambda u: (reduced[u] - TAPER_COLUMNS * hops[u], u))
            taken.add(u)
            left[i].discard(u)
            reduced[u] += 1
            column[u][i] = tau
        tau += 1
    return column


def _one_ahead(sends: list[Item], recvs: list[Item], phase: int) -> list[Item]:
    """Each phase's `phase` sends and receives interleaved, sends one ahead: s0 s1 r0 s2 r1 ..
    (at most FIFO_CHUNKS = 2 sent and not yet taken, so two peers never block each other)."""
    out: list[Item] = []
    for at in range(0, len(sends), phase):
        ss, rs = sends[at : at + phase], recvs[at : at + phase]
        out.append(ss[0])
        for i in range(phase):
            if i + 1 < phase:
                out.append(ss[i + 1])
            out.append(rs[i])
    return out


def lower(coll: Collective, servers: int, gpus: int, pieces: int, rings: int, name: str,
          paired: bool = False, taper: bool = False) -> tuple[ScheduleArrays, MscclLowering]:  # fmt: skip
    """The schedule (for the simulator) and the file's lowering; MscclFormatError where it
    does not fit the executor (64 steps per threadblock, XML nodes). `paired`: each peer's
    sends and receives share one threadblock (G-1 fewer, for more rings); `taper`: the
    server reduces in the tapered order (`_tapered`), not the Latin square."""
    if coll not in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        raise ValueError(f"{coll} has no reduction")
    plan = Plan(servers, gpus, pieces, rings, taper)
    allreduce = coll == Collective.ALLREDUCE
    # before building: steps of an NVSwitch threadblock and of a ring
    most = max(servers * pieces * (1 + allreduce) * (1 + paired),
               (2 * servers - 1 if allreduce else servers) * pieces // rings)  # fmt: skip
    if most > MAX_STEPS:
        raise MscclFormatError(f"a threadblock needs {most} steps; the executor allows {MAX_STEPS}")
    n, p = servers * gpus, pieces
    lay = _Layout(coll, n, n * p if allreduce else p)
    tb_meta: list[list[tuple[int, int, int]]] = []
    items_of: list[dict[int, list[Item]]] = []
    scratch: list[dict[int, int]] = []
    for r in range(n):
        s, loc = divmod(r, gpus)
        order = ring_order(s, servers)

        def chunk(d: int, j: int, g: int = loc) -> int:
            return (d * gpus + g) * p + j

        slots: dict[tuple[int, int], int] = {}

        def partial(d: int, j: int, own: int = s, slots: dict[Unit, int] = slots) -> Loc:
            """Where the server's sum of chunk (d, l) is built."""
            if allreduce:
                return ("o", chunk(d, j))
            if d == own:
                return ("o", j)
            return ("s", slots.setdefault((d, j), len(slots)))

        peers = [(loc + 1 + i) % gpus for i in range(gpus - 1)]  # chain position -> peer
        nxt, prv = ((s + 1) % servers) * gpus + loc, ((s - 1) % servers) * gpus + loc
        ring_tbs = [OneDepThreadblock(nxt, prv, c) for c in range(plan.rings)]
        recv = [OneDepThreadblock(-1, s * gpus + k) for k in peers]
        send = {k: OneDepThreadblock(s * gpus + k, -1) for k in peers}
        # receives: chain position i takes units in its rotated order, each after the unit's
        # previous reduce (a lower "time", so no threadblock waits for a later step of its own)
        done_at: dict[tuple[int, int], _Step] = {}
        prev: dict[int, _Step] = {}
        steps: dict[tuple[int, int], tuple[Loc, Loc, _Step | None]] = {}
        for i, u in plan.ops():
            t, j = plan.units[u]
            d = order[t]
            src = ("i", chunk(d, j)) if u not in prev else partial(d, j)
            steps[(i, u)] = (src, partial(d, j), prev.get(u))
            prev[u] = _Step(r, ("copy", -1, 0), (), "rrc", src, partial(d, j), 1)
            done_at[(i, u)] = prev[u]
        for i in range(gpus - 1):
            for u in plan.taken(i):
                st = done_at[(i, u)]
                _, _, dep = steps[(i, u)]
                if dep is not None:
                    dep.hasdep = True
                recv[i].items.append(("step", st, dep))
        # sends to peer k, in the order k's receive threadblock for this GPU takes them
        for k in peers:
            mine = (loc - k - 1) % gpus  # this GPU's chain position on k
            for u in plan.taken(mine):
                t, j = plan.units[u]
                send[k].add(r, "s", ("i", chunk(order[t], j, k)), ("o", -1), None)
        last = {u: prev[u] for u in range(plan.size)}
        index = {unit: u for u, unit in enumerate(plan.units)}
        done: dict[tuple[int, int], _Step] = {}  # AllReduce: the step completing chunk (d, l)
        for c, ring in enumerate(ring_tbs):
            for j in plan.ring(c):
                for t, d in enumerate(order):
                    at = partial(d, j)
                    typ = ("s" if t == 0 else "rrs" if t < servers - 1 else
                           "rrcs" if allreduce else "rrc")  # fmt: skip
                    done[(d, j)] = ring.add(r, typ, at, at, last[index[(t, j)]])
                if allreduce:  # this piece's AllGather: own chunk sent above, s+1 last
                    for t, d in enumerate(order[:-1]):
                        typ = "rcs" if t < servers - 2 else "r"
                        done[(d, j)] = ring.add(r, typ, ("i", -1), ("o", chunk(d, j)), None)
        if allreduce:
            spread = [(([s, *order[:-1]])[k], j) for k, j in plan.spread()]
            for i, k in enumerate(peers):
                for d, j in spread:
                    at = ("o", chunk(d, j))
                    send[k].add(r, "s", at, at, done[(d, j)])
                    recv[i].add(r, "r", ("i", -1), ("o", chunk(d, j, k)), None)
        if paired:  # one threadblock per peer: its sends one ahead of its receives, per phase
            for i, k in enumerate(peers):
                recv[i].meta = (s * gpus + k, s * gpus + k, 0)
                recv[i].items = _one_ahead(send[k].items, recv[i].items, plan.size)
            every = [*ring_tbs, *recv]
        else:
            every = [*ring_tbs, *recv, *send.values()]
        add_rank(every, tb_meta, items_of)
        scratch.append(dict.fromkeys(range(len(slots)), 0))
    sched = Schedule(name, coll, n, n * p if allreduce else p, [], channels=plan.rings)
    low = MscclLowering(sched, lay, scratch, tb_meta, items_of, plan.rings)
    low.require(max_steps=MAX_STEPS)
    return _arrays(coll, plan, name), low


def _arrays(coll: Collective, plan: Plan, name: str) -> ScheduleArrays:
    """What the simulator times: the file's transfers and waits (one connection queue per
    (sender, receiver, channel), one transfer in flight), piece by piece."""
    allreduce = coll == Collective.ALLREDUCE
    servers, gpus, p = plan.servers, plan.gpus, plan.pieces
    n = servers * gpus
    rows: list[tuple[int, int, int, bool, int]] = []
    deps: list[tuple[int, ...]] = []
    queue: dict[tuple[int, int, int], int] = {}

    def add(u: int, v: int, k: int, red: bool, after: tuple[int, ...], c: int = 0) -> int:
        prev = queue.get((u, v, c))
        rows.append((u, v, k, red, c))
        deps.append(after if prev is None else (*after, prev))
        queue[(u, v, c)] = len(rows) - 1
        return len(rows) - 1

    def chunk(s: int, loc: int, t: int, j: int) -> int:
        return (ring_order(s, servers)[t] * gpus + loc) * p + j

    last: dict[tuple[int, int], int] = {}  # (rank, chunk) -> the server's last reduce into it
    for r in range(n):
        s, loc = divmod(r, gpus)
        prev: dict[int, int] = {}
        for i, u in plan.ops():
            k = chunk(s, loc, *plan.units[u])
            prev[u] = add(s * gpus + (loc + 1 + i) % gpus, r, k, True,
                          (prev[u],) if u in prev else ())  # fmt: skip
            last[(r, k)] = prev[u]
    final: dict[tuple[int, int], int] = {}  # (rank, chunk) -> the transfer completing it there
    tail: dict[tuple[int, int], int] = {}  # (rank, ring) -> the ring's last transfer into it
    for c in range(plan.rings):
        for j in plan.ring(c):
            for t in range(servers - 1):
                for r in range(n):
                    s, loc = divmod(r, gpus)
                    nxt = ((s + 1) % servers) * gpus + loc
                    k = chunk(s, loc, t, j)
                    after: tuple[int, ...] = (last[(r, k)], last[(nxt, k)])
                    if t:
                        after = (*after, final[(r, k)])
                    elif (r, c) in tail:  # the ring's previous piece, in program order
                        after = (*after, tail[(r, c)])
                    final[(nxt, k)] = tail[(nxt, c)] = add(r, nxt, k, True, after, c)
            if allreduce:  # chunk (d, l) leaves d at t = 0 and goes round the ring
                for t in range(servers - 1):
                    for r in range(n):
                        s, loc = divmod(r, gpus)
                        nxt = ((s + 1) % servers) * gpus + loc
                        k = ((s - t) % servers * gpus + loc) * p + j
                        final[(nxt, k)] = tail[(nxt, c)] = add(r, nxt, k, False,
                                                               (final[(r, k)],), c)  # fmt: skip
    if allreduce:
        for r in range(n):
            s, loc = divmod(r, gpus)
            ahead = [s, *ring_order(s, servers)[:-1]]
            for pos, j in plan.spread():
                k = (ahead[pos] * gpus + loc) * p + j
                for i in range(gpus - 1):
                    add(r, s * gpus + (loc + 1 + i) % gpus, k, False, (final[(r, k)],))
    src, dst, chunks, red, chan = (list(x) for x in zip(*rows, strict=True))
    ptr, idx = dep_csr(deps)
    return ScheduleArrays(
        name=name, collective=coll, nranks=n, chunks_per_rank=n * p if allreduce else p,
        src=np.asarray(src, dtype=np.int32), dst=np.asarray(dst, dtype=np.int32),
        chunk=np.asarray(chunks, dtype=np.int64), count=np.ones(len(src), dtype=np.int32),
        reduce=np.asarray(red, dtype=bool), channel=np.asarray(chan, dtype=np.int32),
        dep_ptr=ptr, dep_idx=idx, channels=plan.rings,
    )  # fmt: skip


__all__ = ["Plan", "lower", "ring_order"]
