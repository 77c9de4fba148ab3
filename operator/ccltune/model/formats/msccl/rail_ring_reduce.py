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
ring (AllReduce (2S - 1) x p / R). Where that passes 64 (AllReduce on 64 servers), `lower`'s
`block` moves several servers' chunks a NVSwitch step and `both` runs the ring both ways round
in S steps a way (rail_ring_both.py; docs/synthesis.md, "Session 12: rail AllReduce within 64
steps").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Schedule, ScheduleArrays, dep_csr
from .direct import OneDepThreadblock, add_rank
from .limits import MAX_STEPS
from .rail_ring_both import BACKWARD, FORWARD, BothWays, BothWaysScatter
from .writer import Item, Loc, MscclFormatError, MscclLowering, _Layout, _Step

Unit = tuple[int, int]  # (q, piece j): the q-th block the rings need; block 1: ring step q



def ring_order(s: int, servers: int) -> list[int]:
    """Servers whose chunks GPU s's ring step t carries: s-1, s-2, .., s (its own last)."""
    return [(s - 1 - t) % servers for t in range(servers)]


class Plan:
    """The order of work every GPU of a server shares; it depends on no GPU's index, and with
    `block` 1 on no server's either (a unit is then a ring step)."""

    def __init__(self, servers: int, gpus: int, pieces: int, rings: int,
                 taper: bool = False, block: int = 1, both: bool = False,
                 scatter: bool = False) -> None:  # fmt: skip
        if servers < 2 or gpus < 2:
            raise ValueError("a rail ring needs >= 2 servers of >= 2 GPUs")
        if pieces < 1 or rings < 1 or pieces % rings:
            raise ValueError(f"{pieces} pieces do not deal over {rings} rings")
        if block < 1 or servers % block:
            raise ValueError(f"blocks of {block} servers do not tile {servers}")
        self.servers, self.gpus, self.pieces, self.rings = servers, gpus, pieces, rings
        self.block, self.blocks = block, servers // block
        # both ways: AllReduce's pair exchange, or (`scatter`) ReduceScatter's two sums at the owner
        self.ways: BothWays | BothWaysScatter | None = None
        if both:
            self.ways = BothWaysScatter(servers) if scatter else BothWays(servers)
        self._need: dict[int, list[int]] = {}  # server -> blocks in the order its rings need them
        # unit (q, j): piece j of the q-th block of servers its rings need; the server reduces
        # units in the order the rings take them
        self.units: list[Unit] = sorted(((q, j) for q in range(self.blocks) for j in range(pieces)),
                                        key=lambda u: ((u[1] // rings) * self.blocks + u[0],
                                                       u[1] % rings))  # fmt: skip
        self.index = {unit: u for u, unit in enumerate(self.units)}
        self.size = len(self.units)
        self.column = _tapered(self) if taper else None

    def chunk(self, d: int, j: int, g: int) -> int:
        """Chunk index of piece j of chunk (d, g); with blocks lane-major, so a block of
        servers' chunks of one lane and piece is contiguous (one step of cnt `block`)."""
        if self.block == 1:
            return (d * self.gpus + g) * self.pieces + j
        return (g * self.pieces + j) * self.servers + d

    def needed(self, s: int) -> list[int]:
        """Blocks in the order server s's rings need them (both ways: `BothWays.need`)."""
        if s not in self._need:
            ways, b = self.ways, self.block
            assert ways is not None
            self._need[s] = sorted(range(self.blocks), key=lambda x: (
                min(ways.need(s, d) for d in range(x * b, x * b + b)), x))  # fmt: skip
        return self._need[s]

    def first_server(self, s: int, q: int) -> int:
        """The first server of the q-th block server s's rings need: one way, blocks are
        aligned, so the block of s-1 comes first, then the ones below it (mod S)."""
        if self.ways is not None:
            return self.needed(s)[q] * self.block
        return ((s - 1) // self.block - q) % self.blocks * self.block

    def unit_of(self, s: int, d: int, j: int) -> int:
        """Index (in `units`) of the unit holding piece j of chunk (d, .) on server s."""
        if self.ways is not None:
            return self.index[(self.needed(s).index(d // self.block), j)]
        return self.index[(((s - 1) // self.block - d // self.block) % self.blocks, j)]

    def arrival(self, s: int, d: int) -> int:
        """When chunk d is complete on server s, in ring steps: one way, the own chunk at the
        end of the reduce, server s - k at the all-gather's k-th hop."""
        if self.ways is not None:
            assert isinstance(self.ways, BothWays)
            return self.ways.completes(s, d)[1]
        return (s - d) % self.servers

    def spread(self, s: int) -> list[tuple[int, int, int, int]]:
        """AllReduce on server s: (first server, servers, piece, the server whose chunk is
        complete on s last) of each block in the order the rings complete them (`arrival`);
        both ways, a block whose chunks two ways complete goes as a run per way (each waits
        for its way's step: a step waits for one)."""
        out = []
        for b in range(self.blocks):
            runs: list[list[int]] = []
            for d in range(b * self.block, (b + 1) * self.block):
                way = self.ways.completes(s, d)[0] if isinstance(self.ways, BothWays) else 0
                if runs and runs[-1][0] == way:
                    runs[-1].append(d)
                else:
                    runs.append([way, d])
            for _, *ds in runs:
                last = max(ds, key=lambda d: self.arrival(s, d))
                out += [(ds[0], len(ds), j, last) for j in range(self.pieces)]
        return sorted(out, key=lambda x: (x[2] // self.rings, self.arrival(s, x[3]),
                                          x[2] % self.rings))  # fmt: skip

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
    size, chain, last = plan.size, plan.gpus - 1, plan.blocks - 1
    hops = [last - q for q, _ in plan.units]  # ring hops after the own chunk's (blocks)
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
          paired: bool = False, taper: bool = False, block: int = 1,
          split: bool = False, both: bool = False) -> tuple[ScheduleArrays, MscclLowering]:  # fmt: skip
    """The schedule (for the simulator) and the file's lowering; MscclFormatError where it
    does not fit the executor (64 steps per threadblock, XML nodes). `paired`: each peer's
    sends and receives share one threadblock (G-1 fewer, for more rings); `taper`: the
    server reduces in the tapered order (`_tapered`), not the Latin square. AllReduce only:
    `block`: each NVSwitch step moves that many servers' chunks (cnt `block`, the buffer
    lane-major), so a threadblock holds S / block units, not S; `split`: each ring's
    all-gather hops run on a threadblock of their own (channel rings + c, the same peers), its
    first send waiting for the reduce's last hop, so a ring of S servers needs S steps a piece
    on each, not 2S - 1 on one; `both`: the ring goes both ways round (rail_ring_both.py, the
    backward way on channel rings + c), S steps a piece on each way and ~S hops a chunk;
    ReduceScatter (`both` only, one server a block): each chunk reduced from both sides of the
    ring into its owner (rail_ring_both.BothWaysScatter), ~S/2 steps a piece on each way."""
    if coll not in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        raise ValueError(f"{coll} has no reduction")
    allreduce = coll == Collective.ALLREDUCE
    if (block > 1 or split) and not allreduce:
        raise ValueError("blocks and split rings need AllReduce's free layout")
    if split and both:
        raise ValueError("a ring both ways has no all-gather of its own to split")
    plan = Plan(servers, gpus, pieces, rings, taper, block, both, scatter=not allreduce)
    # before building: steps of an NVSwitch threadblock and of a ring
    ring_steps = servers if split or both or not allreduce else 2 * servers - 1
    if both and not allreduce:  # the forward way's hf + 1 steps a piece (hf >= hb)
        ring_steps = servers // 2 + 1
    spread = max(len(plan.spread(s)) for s in range(servers)) if allreduce else 0
    most = max((plan.size + spread) * (1 + paired), ring_steps * pieces // rings)
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
            return plan.chunk(d, j, g)

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
        gather_tbs = [OneDepThreadblock(prv if both else nxt, nxt if both else prv, plan.rings + c)
                      for c in range(plan.rings)] if split or both else ring_tbs  # fmt: skip
        recv = [OneDepThreadblock(-1, s * gpus + k) for k in peers]
        send = {k: OneDepThreadblock(s * gpus + k, -1) for k in peers}
        # receives: chain position i takes units in its rotated order, each after the unit's
        # previous reduce (a lower "time", so no threadblock waits for a later step of its own)
        done_at: dict[tuple[int, int], _Step] = {}
        prev: dict[int, _Step] = {}
        steps: dict[tuple[int, int], tuple[Loc, Loc, _Step | None]] = {}
        for i, u in plan.ops():
            q, j = plan.units[u]
            d = plan.first_server(s, q)
            src = ("i", chunk(d, j)) if u not in prev else partial(d, j)
            steps[(i, u)] = (src, partial(d, j), prev.get(u))
            prev[u] = _Step(r, ("copy", -1, 0), (), "rrc", src, partial(d, j), plan.block)
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
                q, j = plan.units[u]
                send[k].add(r, "s", ("i", chunk(plan.first_server(s, q), j, k)), ("o", -1), None,
                            plan.block)  # fmt: skip
        last = {u: prev[u] for u in range(plan.size)}
        done: dict[tuple[int, int], _Step] = {}  # AllReduce: the step completing chunk (d, l)
        for c, ring in enumerate(ring_tbs):
            if both and not allreduce:
                _both_ways_scatter(r, plan, (ring, gather_tbs[c]), c, last, partial)
                continue
            if both:
                _both_ways(r, plan, (ring, gather_tbs[c]), c, last, done, partial)
                continue
            for j in plan.ring(c):
                for t, d in enumerate(order):
                    at = partial(d, j)
                    typ = ("s" if t == 0 else "rrs" if t < servers - 1 else
                           "rrcs" if allreduce and not split else "rrc")  # fmt: skip
                    done[(d, j)] = ring.add(r, typ, at, at, last[plan.unit_of(s, d, j)])
                if not allreduce:
                    continue
                gather = gather_tbs[c]  # this piece's AllGather: own chunk first, s+1 last
                if split:
                    own = partial(s, j)
                    gather.add(r, "s", own, own, done[(s, j)])
                for t, d in enumerate(order[:-1]):
                    typ = "rcs" if t < servers - 2 else "r"
                    done[(d, j)] = gather.add(r, typ, ("i", -1), ("o", chunk(d, j)), None)
        if allreduce:
            for i, k in enumerate(peers):
                for d, cnt, j, last_in in plan.spread(s):
                    at = ("o", chunk(d, j))
                    send[k].add(r, "s", at, at, done[(last_in, j)], cnt)
                    recv[i].add(r, "r", ("i", -1), ("o", chunk(d, j, k)), None, cnt)
        if paired:  # one threadblock per peer: its sends one ahead of its receives, per phase
            for i, k in enumerate(peers):
                recv[i].meta = (s * gpus + k, s * gpus + k, 0)
                recv[i].items = _one_ahead(send[k].items, recv[i].items, plan.size)
            every = [*ring_tbs, *recv]
        else:
            every = [*ring_tbs, *recv, *send.values()]
        if split or both:
            every[len(ring_tbs) : len(ring_tbs)] = gather_tbs
        add_rank(every, tb_meta, items_of)
        scratch.append(dict.fromkeys(range(len(slots)), 0))
    channels = plan.rings * (2 if split or both else 1)
    sched = Schedule(name, coll, n, n * p if allreduce else p, [], channels=channels)
    low = MscclLowering(sched, lay, scratch, tb_meta, items_of, channels)
    low.require(max_steps=MAX_STEPS)
    return _arrays(coll, plan, name, split), low


def _both_ways_arrays(plan: Plan, add: Callable[..., int],
                      last: dict[tuple[int, int], int]) -> dict[tuple[int, int], tuple[int, ...]]:  # fmt: skip
    """The rings both ways round as transfers (`_arrays`' `add`); per (rank, chunk) the
    transfer that completes it there. The pair's exchange (L from d to d+1, R from d+1 to d)
    reads and writes both ends, which whole transfers cannot do both ways at once: here R
    completes the chunk at d and L carries the complete chunk on to d+1 after it (the file runs
    them at once)."""
    ways, gpus, servers = plan.ways, plan.gpus, plan.servers
    assert ways is not None
    n = servers * gpus
    hf, hb = ways.reduce_hops
    back = 1 - FORWARD
    # hops in an order where each comes after what it waits for
    hops = sorted([(2 * k, FORWARD, k) for k in range(servers - 1)] +
                  [(2 * (k + hf - hb) - 1, back, k) for k in range(servers - 1)])  # fmt: skip
    into: dict[tuple[int, int, int], int] = {}  # (rank, chunk, way) -> the hop into it
    tail: dict[tuple[int, int], int] = {}  # (rank, channel) -> the ring's last hop into it
    completed: dict[tuple[int, int], tuple[int, ...]] = {}
    for c in range(plan.rings):
        for j in plan.ring(c):
            for _, way, k in hops:  # hop k: from the way's step k to its step k + 1
                h, ch = ways.reduce_hops[way], c + way * plan.rings
                for r in range(n):
                    s, loc = divmod(r, gpus)
                    to = (s + 1 if way == FORWARD else s - 1) % servers * gpus + loc
                    d = ways.chunk(s, way, k)
                    ck = plan.chunk(d, j, loc)
                    after: tuple[int, ...] = ()
                    if k <= h:  # it sends the server's partial, or a sum with it
                        after += (last[(r, plan.unit_of(s, d, j))],)
                    if k:
                        after += (into[(r, ck, way)],)
                    elif (r, ch) in tail:  # the ring's previous piece, in program order
                        after += (tail[(r, ch)],)
                    if k == h and way == FORWARD:  # L: the chunk R completed here
                        after += (into[(r, ck, back)],)
                    if k + 1 <= h:  # the receiver adds its partial (`rrs`, `rrcs`)
                        after += (last[(to, plan.unit_of(to // gpus, d, j))],)
                    elif k == h and way == back:  # R: the receiver adds L, stored there
                        after += (into[(to, ck, FORWARD)],)
                    red = k < h or (k == h and way == back)
                    into[(to, ck, way)] = tail[(to, ch)] = add(r, to, ck, red, after, ch)
                    if k >= h:
                        completed[(to, ck)] = (into[(to, ck, way)],)
    return completed


def _both_ways(r: int, plan: Plan, tbs: tuple[OneDepThreadblock, OneDepThreadblock], c: int,
               last: dict[int, _Step], done: dict[tuple[int, int], _Step],
               partial: Callable[[int, int], Loc]) -> None:  # fmt: skip
    """Ring c's pieces both ways round on rank r (rail_ring_both.py): the steps that read the
    server's partial wait for its last reduce; the step that completes a chunk waits for the
    other way's store on this GPU."""
    ways = plan.ways
    assert ways is not None
    s = r // plan.gpus
    for j in plan.ring(c):
        stored: dict[int, _Step] = {}  # way -> its step that stored the way's sum here
        for k in range(plan.servers):
            for way, tb in enumerate(tbs):
                d, typ, h = ways.chunk(s, way, k), ways.kind(way, k), ways.reduce_hops[way]
                at = partial(d, j)
                dep = last[plan.unit_of(s, d, j)] if k <= h else \
                    stored[1 - way] if k == h + 1 else None  # fmt: skip
                src = ("i", -1) if typ in ("rcs", "r") else at
                step = tb.add(r, typ, src, at, dep)
                if k == h:
                    stored[way] = step
                if k > h:
                    done[(d, j)] = step


def _both_ways_scatter(r: int, plan: Plan, tbs: tuple[OneDepThreadblock, OneDepThreadblock],
                       c: int, last: dict[int, _Step],
                       partial: Callable[[int, int], Loc]) -> None:  # fmt: skip
    """Ring c's pieces both ways round into their owners on rank r (ReduceScatter): each step
    waits for the server's last reduce of what it reads, except the forward way's `rrc` into
    the own chunk, which waits for the backward way's (its output holds that sum then)."""
    ways = plan.ways
    assert isinstance(ways, BothWaysScatter)
    s = r // plan.gpus
    for j in plan.ring(c):
        stored: _Step | None = None  # the backward way's rrc into the own chunk
        for way in (BACKWARD, FORWARD):
            for k in range(ways.reduce_hops[way] + 1):
                d, typ = ways.chunk(s, way, k), ways.kind(way, k)
                at = partial(d, j)
                dep = stored if typ == "rrc" and way == FORWARD else last[plan.unit_of(s, d, j)]
                step = tbs[way].add(r, typ, at, at, dep)
                if typ == "rrc":
                    stored = step


def _both_ways_scatter_arrays(plan: Plan, add: Callable[..., int],
                              last: dict[tuple[int, int], int]) -> None:  # fmt: skip
    """ReduceScatter's rings both ways round as transfers (`_arrays`' `add`): the forward way's
    last hop into the owner after the backward way's, as the file orders their `rrc`s."""
    ways, gpus, servers = plan.ways, plan.gpus, plan.servers
    assert isinstance(ways, BothWaysScatter)
    n = servers * gpus
    into: dict[tuple[int, int, int], int] = {}  # (rank, chunk, way) -> the hop into it
    tail: dict[tuple[int, int], int] = {}  # (rank, channel) -> the way's last hop into it
    # hop k of a way: its step k to the next server's step k + 1; backward first at each k
    hops = sorted(((k, way) for way in (FORWARD, BACKWARD) for k in range(ways.reduce_hops[way])),
                  key=lambda x: (x[0], x[1] != BACKWARD))  # fmt: skip
    for c in range(plan.rings):
        for j in plan.ring(c):
            for k, way in hops:
                h, ch = ways.reduce_hops[way], c + way * plan.rings
                for r in range(n):
                    s, loc = divmod(r, gpus)
                    ts = (s + 1 if way == FORWARD else s - 1) % servers
                    to = ts * gpus + loc
                    d = ways.chunk(s, way, k)
                    ck = plan.chunk(d, j, loc)
                    after: tuple[int, ...] = (last[(r, plan.unit_of(s, d, j))],
                                              last[(to, plan.unit_of(ts, d, j))])  # fmt: skip
                    if k:
                        after += (into[(r, ck, way)],)
                    elif (r, ch) in tail:  # the way's previous piece, in program order
                        after += (tail[(r, ch)],)
                    if k + 1 == h and way == FORWARD:  # the owner's output holds backward's sum
                        after += (into[(to, ck, BACKWARD)],)
                    into[(to, ck, way)] = tail[(to, ch)] = add(r, to, ck, True, after, ch)


def _arrays(coll: Collective, plan: Plan, name: str, split: bool = False) -> ScheduleArrays:
    """What the simulator times: the file's transfers and waits (one connection queue per
    (sender, receiver, channel), one transfer in flight), piece by piece."""
    allreduce = coll == Collective.ALLREDUCE
    servers, gpus, p, block = plan.servers, plan.gpus, plan.pieces, plan.block
    n = servers * gpus
    rows: list[tuple[int, int, int, bool, int, int]] = []
    deps: list[tuple[int, ...]] = []
    queue: dict[tuple[int, int, int], int] = {}

    def add(u: int, v: int, k: int, red: bool, after: tuple[int, ...], c: int = 0,
            cnt: int = 1) -> int:  # fmt: skip
        prev = queue.get((u, v, c))
        rows.append((u, v, k, red, c, cnt))
        deps.append(after if prev is None else (*after, prev))
        queue[(u, v, c)] = len(rows) - 1
        return len(rows) - 1

    def rank(s: int, loc: int) -> int:
        return s % servers * gpus + loc % gpus

    last: dict[tuple[int, int], int] = {}  # (rank, unit) -> the server's last reduce into it
    for r in range(n):
        s, loc = divmod(r, gpus)
        prev: dict[int, int] = {}
        for i, u in plan.ops():
            q, j = plan.units[u]
            k = plan.chunk(plan.first_server(s, q), j, loc)
            prev[u] = add(rank(s, loc + 1 + i), r, k, True, (prev[u],) if u in prev else (),
                          cnt=block)  # fmt: skip
            last[(r, u)] = prev[u]
    final: dict[tuple[int, int], int] = {}  # (rank, chunk) -> the transfer completing it there
    tail: dict[tuple[int, int], int] = {}  # (rank, ring) -> the ring's last transfer into it
    for c in range(plan.rings if plan.ways is None else 0):
        for j in plan.ring(c):
            for t in range(servers - 1):
                for r in range(n):
                    s, loc = divmod(r, gpus)
                    nxt, d = rank(s + 1, loc), (s - 1 - t) % servers
                    k = plan.chunk(d, j, loc)
                    after: tuple[int, ...] = (last[(r, plan.unit_of(s, d, j))],
                                              last[(nxt, plan.unit_of(s + 1, d, j))])  # fmt: skip
                    if t:
                        after = (*after, final[(r, k)])
                    elif (r, c) in tail:  # the ring's previous piece, in program order
                        after = (*after, tail[(r, c)])
                    final[(nxt, k)] = tail[(nxt, c)] = add(r, nxt, k, True, after, c)
            if allreduce:  # chunk (d, l) leaves d at t = 0 and goes round the ring
                gc = plan.rings + c if split else c
                for t in range(servers - 1):
                    for r in range(n):
                        s, loc = divmod(r, gpus)
                        nxt, k = rank(s + 1, loc), plan.chunk((s - t) % servers, j, loc)
                        after = (final[(r, k)],)
                        if split and not t:  # split: nxt takes it after its own send, its rrc
                            after = (*after, final[(nxt, plan.chunk((s + 1) % servers, j, loc))])
                        final[(nxt, k)] = tail[(nxt, gc)] = add(r, nxt, k, False, after, gc)
    completed: dict[tuple[int, int], tuple[int, ...]] = {}  # both ways: what completes it
    if isinstance(plan.ways, BothWaysScatter):
        _both_ways_scatter_arrays(plan, add, last)
    elif plan.ways is not None:
        completed = _both_ways_arrays(plan, add, last)
    if allreduce:
        for r in range(n):
            s, loc = divmod(r, gpus)
            for d, run, j, last_in in plan.spread(s):
                k = plan.chunk(last_in, j, loc)
                after = completed[(r, k)] if completed else (final[(r, k)],)
                for i in range(gpus - 1):
                    add(r, rank(s, loc + 1 + i), plan.chunk(d, j, loc), False, after, cnt=run)
    src, dst, chunks, red, chan, cnt = (list(x) for x in zip(*rows, strict=True))
    ptr, idx = dep_csr(deps)
    return ScheduleArrays(
        name=name, collective=coll, nranks=n, chunks_per_rank=n * p if allreduce else p,
        src=np.asarray(src, dtype=np.int32), dst=np.asarray(dst, dtype=np.int32),
        chunk=np.asarray(chunks, dtype=np.int64), count=np.asarray(cnt, dtype=np.int32),
        reduce=np.asarray(red, dtype=bool), channel=np.asarray(chan, dtype=np.int32),
        dep_ptr=ptr, dep_idx=idx, channels=plan.rings * (2 if split or plan.ways else 1),
    )  # fmt: skip


__all__ = ["Plan", "lower", "ring_order"]
