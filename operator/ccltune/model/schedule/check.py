"""Semantic checker: proves a schedule implements its collective, or names the first flaw.

Each (rank, chunk) buffer is tracked as a bitset (a Python int) of the rank contributions it
holds: bit r set = rank r's input is summed in (for allgather/alltoall/broadcast the single bit of
the chunk's origin means "holds the chunk"). Transfers are applied in a topological order of the
dependency DAG, which is exact because every write of a buffer must be ordered by the DAG against
every other read or write of that buffer (checked; otherwise the result would depend on timing,
a race). Postconditions per collective are those in ir.py's docstring.

`reduces_commute=True` lets reduces into one buffer run in any order among themselves (reads and
plain stores must still be ordered against each of them): sums do not depend on their order, so
this is exact for a runtime that serializes the additions itself - MSCCL programs that receive
each contribution into its own scratch slot and add them with a local `re` chain, which
msccl_reader.py has already proven slot by slot. ccltune's writer puts each reduce straight into
the destination (rrc), so schedules it lowers are checked without it; the scratch-reduce files
(formats/msccl/scratch.py) are that shape, and their read-back is proven slot by slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ...api.common import Collective
from ...api.errors import InternalError
from .ir import Schedule


class ScheduleError(InternalError):
    """The schedule does not implement its collective; the message names transfer/rank/chunk."""


def _ranks(bits: int) -> str:
    out, r = [], 0
    while bits:
        if bits & 1:
            out.append(r)
        bits >>= 1
        r += 1
    if len(out) > 8:
        return "{" + ", ".join(map(str, out[:8])) + f", ... ({len(out)} ranks)}}"
    return "{" + ", ".join(map(str, out)) + "}"


def _validate(s: Schedule) -> None:
    n, total = s.nranks, s.total_chunks
    if n < 1 or s.chunks_per_rank < 1:
        raise ScheduleError(
            f"schedule {s.name!r}: nranks ({n}) and chunks_per_rank ({s.chunks_per_rank}) must be >= 1"
        )
    if s.collective == Collective.BROADCAST and not 0 <= s.root < n:
        raise ScheduleError(f"schedule {s.name!r}: broadcast root {s.root} not in 0..{n - 1}")
    ntr = len(s.transfers)
    for i, t in enumerate(s.transfers):
        for what, r in (("src", t.src), ("dst", t.dst)):
            if not 0 <= r < n:
                raise ScheduleError(f"transfer {i}: {what} rank {r} not in 0..{n - 1}")
        if t.src == t.dst:
            raise ScheduleError(f"transfer {i}: rank {t.src} sends to itself")
        if t.count < 1 or t.chunk < 0 or t.chunk + t.count > total:
            raise ScheduleError(
                f"transfer {i}: chunks {t.chunk}..{t.chunk + t.count - 1} outside 0..{total - 1} "
                f"({s.collective} on {n} ranks x {s.chunks_per_rank} chunks)"
            )
        for d in t.deps:
            if not 0 <= d < ntr or d == i:
                raise ScheduleError(f"transfer {i}: dependency {d} is not another transfer")


def topological_order(s: Schedule) -> list[int]:
    """Kahn's order (lowest index first among ready transfers); a cycle is a deadlock."""
    ntr = len(s.transfers)
    indeg = [len(t.deps) for t in s.transfers]
    succ: list[list[int]] = [[] for _ in range(ntr)]
    for i, t in enumerate(s.transfers):
        for d in t.deps:
            succ[d].append(i)
    ready = deque(i for i in range(ntr) if indeg[i] == 0)
    order: list[int] = []
    while ready:
        u = ready.popleft()
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) < ntr:
        raise ScheduleError(_cycle_message(s, {i for i in range(ntr) if indeg[i] > 0}))
    return order


def _cycle_message(s: Schedule, stuck: set[int]) -> str:
    # Every stuck transfer has a stuck dep, so walking deps inside `stuck` must revisit a node.
    u = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    while u not in seen:
        seen[u] = len(path)
        path.append(u)
        u = next(d for d in s.transfers[u].deps if d in stuck)
    cycle = path[seen[u] :]
    cycle.reverse()  # deps point backwards; print in execution order
    shown = " -> ".join(map(str, [*cycle, cycle[0]]))
    named = "; ".join(
        f"{i}: rank {s.transfers[i].src} -> {s.transfers[i].dst} chunk {s.transfers[i].chunk}"
        for i in cycle[:6]
    )
    more = ", ..." if len(cycle) > 6 else ""
    return (
        f"deadlock: dependency cycle {shown} ({named}{more}; "
        f"{len(stuck)} transfers can never start)"
    )


class _Reach:
    """Is a an ancestor of b in the DAG? Backward search pruned by topological position."""

    def __init__(self, s: Schedule, pos: list[int]) -> None:
        self.deps = [t.deps for t in s.transfers]
        self.pos = pos

    def before(self, a: int, b: int) -> bool:
        if a == b:
            return False
        pa = self.pos[a]
        if pa >= self.pos[b]:
            return False
        deps, pos = self.deps, self.pos
        if a in deps[b]:
            return True
        seen = {b}
        stack = [b]
        while stack:
            u = stack.pop()
            for d in deps[u]:
                if d == a:
                    return True
                if d not in seen and pos[d] > pa:
                    seen.add(d)
                    stack.append(d)
        return False


def _initial(s: Schedule) -> Callable[[int, int], int]:
    n, c = s.nranks, s.chunks_per_rank
    coll = s.collective
    if coll == Collective.ALLGATHER:
        return lambda r, k: 1 << r if k // c == r else 0
    if coll in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        return lambda r, k: 1 << r
    if coll == Collective.ALLTOALL:
        return lambda r, k: 1 << r if k // (n * c) == r else 0
    if coll == Collective.BROADCAST:
        return lambda r, k: 1 << r if r == s.root else 0
    raise ScheduleError(f"schedule {s.name!r}: unknown collective {coll!r}")


def _postconditions(s: Schedule) -> list[tuple[int, int, int]]:
    """(rank, chunk, required contribution bitset) for every buffer the collective defines."""
    n, c = s.nranks, s.chunks_per_rank
    full = (1 << n) - 1
    coll = s.collective
    if coll == Collective.ALLGATHER:
        return [(r, k, 1 << (k // c)) for r in range(n) for k in range(n * c)]
    if coll == Collective.REDUCESCATTER:
        return [(r, k, full) for r in range(n) for k in range(r * c, r * c + c)]
    if coll == Collective.ALLREDUCE:
        return [(r, k, full) for r in range(n) for k in range(c)]
    if coll == Collective.ALLTOALL:
        out: list[tuple[int, int, int]] = []
        for src in range(n):
            for dst in range(n):
                base = (src * n + dst) * c
                out.extend((dst, k, 1 << src) for k in range(base, base + c))
        return out
    return [(r, k, 1 << s.root) for r in range(n) for k in range(c)]


def check_schedule(schedule: Schedule, *, reduces_commute: bool = False) -> None:
    """Raise ScheduleError unless `schedule` provably implements its collective, race-free."""
    s = schedule
    _validate(s)
    order = topological_order(s)
    pos = [0] * len(order)
    for p, ti in enumerate(order):
        pos[ti] = p
    reach = _Reach(s, pos)
    init = _initial(s)
    reducing = s.collective in (Collective.REDUCESCATTER, Collective.ALLREDUCE)
    state: dict[tuple[int, int], int] = {}
    # writes not yet ordered before each other: one, or several commuting reduces
    writes: dict[tuple[int, int], list[int]] = {}
    reads: dict[tuple[int, int], list[int]] = {}

    def value(key: tuple[int, int]) -> int:
        v = state.get(key)
        return init(*key) if v is None else v

    for i in order:
        t = s.transfers[i]
        for k in range(t.chunk, t.chunk + t.count):
            src_key, dst_key = (t.src, k), (t.dst, k)
            for w in writes.get(src_key, ()):
                if not reach.before(w, i):
                    raise ScheduleError(
                        f"race: transfer {i} reads rank {t.src} chunk {k} while transfer {w} may "
                        f"still be writing it (no dependency path {w} -> {i})"
                    )
            data = value(src_key)
            if data == 0:
                raise ScheduleError(
                    f"transfer {i}: rank {t.src} sends chunk {k} but holds no data for it yet "
                    f"(missing dependency or missing transfer)"
                )
            reads.setdefault(src_key, []).append(i)
            concurrent = [w for w in writes.get(dst_key, ()) if not reach.before(w, i)]
            commuting = reduces_commute and t.reduce
            for w in concurrent:
                if not (commuting and s.transfers[w].reduce):
                    raise ScheduleError(
                        f"race: transfers {w} and {i} both write rank {t.dst} chunk {k} "
                        f"with no dependency path between them"
                    )
            for r in reads.get(dst_key, ()):
                if not reach.before(r, i):
                    raise ScheduleError(
                        f"race: transfer {i} writes rank {t.dst} chunk {k} while transfer {r} "
                        f"may still be reading it (no dependency path {r} -> {i})"
                    )
            old = value(dst_key)
            if t.reduce:
                if old == 0:
                    raise ScheduleError(
                        f"transfer {i}: reduces chunk {k} into rank {t.dst}, which holds no data "
                        f"for it (adds to garbage)"
                    )
                if old & data:
                    raise ScheduleError(
                        f"transfer {i}: reduce into rank {t.dst} chunk {k} double-counts "
                        f"contributions of ranks {_ranks(old & data)}"
                    )
                if not reducing:
                    raise ScheduleError(
                        f"transfer {i}: reduce of chunk {k} in a {s.collective}, which combines "
                        f"different chunks' data"
                    )
                state[dst_key] = old | data
            else:
                state[dst_key] = data
            writes[dst_key] = [*concurrent, i]
            reads[dst_key] = []

    for r, k, want in _postconditions(s):
        got = value((r, k))
        if got != want:
            missing, extra = want & ~got, got & ~want
            what = []
            if missing:
                what.append(f"missing contributions of ranks {_ranks(missing)}")
            if extra:
                what.append(f"unexpected data from ranks {_ranks(extra)}")
            raise ScheduleError(
                f"{s.collective} {s.name!r}: rank {r} ends with chunk {k} wrong: " + "; ".join(what)
            )
