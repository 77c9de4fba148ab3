"""Direct ReduceScatter / AllReduce on a full mesh with reduces into scratch (issue 18).

Every peer's contribution to a GPU's chunks arrives concurrently, each into a scratch slot of
its own (`r`), and is combined locally with `re` steps, instead of `rrc` steps chained one at a
time into one buffer (docs/synthesis.md, "Single-server meshes", session 8). Shape, GPU r of n:
- one threadblock per (peer p, channel c); pair (r, p) has `chans[(r, p)]` channels, the same
  both ways, and channel c carries the c-th contiguous block of the C chunks per rank;
- on it, per chunk j of the block: `s` of input chunk (p, j) to p, then the receive of p's
  contribution to chunk (r, j): `rrc` (reduced with r's own input into the output) from one
  peer per group, `r` into scratch from the others. Sends run one chunk ahead of receives and
  wait for nothing, so the two directions of a pair cannot fill each other's FIFO (2 chunks);
- reduce groups of m consecutive chunks, each after its last receive from every peer: nops
  carrying the peers' receive steps, then one `re` per scratch slot into the output, fused by
  the parser into one reduction (msccl_parser.cc: same dst, same srcbuf, depid=-1 continuing).
  Groups go to the threadblocks the SM budget leaves (in order of arrival), else to the peer
  threadblocks (after that threadblock's own receive of the group);
- AllReduce: then the reduced chunks sent directly to every peer on the same threadblocks, each
  send after its group's reduce.

Cost of the local steps in the executor model: none (the read-back times sends only); in
msccl-executor-nccl's kernel a `re` runs on its threadblock's threads (RCCL
src/device/msccl_kernel_impl.h, the MSCCL_REDUCE branch of mscclRunInterpreter: every thread
loads the destination and `numReductions` sources per 16-byte pack from local memory and stores
one). See docs/synthesis.md for what that leaves out.
"""

from __future__ import annotations

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Schedule, ScheduleArrays, dep_csr
from .direct import add_rank
from .limits import MAX_STEPS
from .writer import Item, MscclLowering, _Layout, _Step

Pair = tuple[int, int]


class _Tb:
    def __init__(self, send: int, recv: int, chan: int) -> None:
        self.meta = (send, recv, chan)
        self.items: list[Item] = []

    def add(self, rank: int, typ: str, src: tuple[str, int], dst: tuple[str, int], cnt: int,
            deps: list[_Step]) -> _Step:  # fmt: skip
        """A step after nops carrying all but the last of `deps` (the step holds that one)."""
        st = _Step(rank, ("copy", -1, 0), (), typ, src, dst, cnt)
        for d in deps[:-1]:
            d.hasdep = True
            self.items.append(("nop", None, d))
        if deps:
            deps[-1].hasdep = True
        st.index = len(self.items)
        self.items.append(("step", st, deps[-1] if deps else None))
        return st


def direct(coll: Collective, n: int, cpr: int, chans: dict[Pair, int], budget: int,
           group: int, name: str) -> tuple[ScheduleArrays, MscclLowering]:  # fmt: skip
    """The schedule (for the simulator) and the file's lowering; MscclFormatError when it does
    not fit the executor (steps, threadblocks, counts)."""
    if coll not in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        raise ValueError(f"{coll} has no reduction")
    if any((r, p) not in chans for r in range(n) for p in range(n) if r != p):
        raise ValueError("direct sends need every pair linked")
    # a reduce group lies within one channel's block of every pair
    if any(cpr % k or (cpr // k) % group for k in chans.values()):
        raise ValueError(f"{cpr} chunks per rank do not deal over channels in groups of {group}")
    allreduce = coll == Collective.ALLREDUCE
    total = n * cpr
    lay = _Layout(coll, n, total if allreduce else cpr)

    def out_off(r: int, j: int) -> int:  # rank r's reduced chunk j in its output buffer
        return r * cpr + j if allreduce else j

    def block(r: int, p: int, j: int) -> tuple[int, int]:  # (channel, position) of chunk j
        width = cpr // chans[(r, p)]
        return divmod(j, width)

    tb_meta: list[list[tuple[int, int, int]]] = []
    items_of: list[dict[int, list[Item]]] = []
    scratch: list[dict[int, int]] = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        tbs: dict[Pair, _Tb] = {(p, c): _Tb(p, p, c) for p in peers for c in range(chans[(r, p)])}
        spare = budget - len(tbs)
        reducers = [_Tb(-1, -1, 0) for _ in range(max(spare, 0))]
        groups = cpr // group
        first = [peers[g % len(peers)] for g in range(groups)]  # the peer received with rrc
        slots: dict[tuple[int, int], int] = {}
        for p in peers:
            if any(first[g] != p for g in range(groups)):
                for j in range(cpr):
                    if first[j // group] != p:
                        slots[(p, j)] = len(slots)
        got: dict[tuple[int, int], _Step] = {}  # (peer, chunk) -> its receive
        # per threadblock its block's sends one ahead of the receives: the send of chunk i + 1
        # does not wait for the receive of chunk i, and at most FIFO_CHUNKS (2) are unreceived
        for p in peers:
            width = cpr // chans[(r, p)]
            for c in range(chans[(r, p)]):
                tb = tbs[(p, c)]
                for kind, j in _one_ahead(list(range(c * width, (c + 1) * width))):
                    if kind == "s":
                        tb.add(r, "s", ("i", p * cpr + j), ("o", -1), 1, [])
                    elif first[j // group] == p:
                        got[(p, j)] = tb.add(r, "rrc", ("i", r * cpr + j), ("o", out_off(r, j)),
                                             1, [])  # fmt: skip
                    else:
                        got[(p, j)] = tb.add(r, "r", ("i", -1), ("s", slots[(p, j)]), 1, [])
        # the reduces, in order of arrival: by the position of the group's last chunk
        arrival = [(max(block(r, p, (g + 1) * group - 1)[1] for p in peers), g)
                   for g in range(groups)]  # fmt: skip
        done: dict[int, _Step] = {}
        late: dict[_Tb, list[tuple[int, list[Item]]]] = {}
        for k, (_, g) in enumerate(sorted(arrival)):
            last = (g + 1) * group - 1
            order = [first[g], *(p for p in peers if p != first[g])]
            deps = [got[(p, last)] for p in order]
            rest = [p for p in order if p != first[g]]
            if reducers:
                host = reducers[k % len(reducers)]
            else:  # the rrc's threadblock, right after that receive (spliced in below)
                host = _Tb(-1, -1, 0)
                deps = deps[1:]
            j0 = g * group
            if not rest:
                done[g] = got[(first[g], last)]
                continue
            # one fused reduction (msccl_parser.cc splits it every MSCCL_MAX_REDUCE_FUSION = 16
            # steps); only the first step waits, only the last signals
            steps = [host.add(r, "re", ("s", slots[(p, j0)]), ("o", out_off(r, j0)), group,
                              deps if i == 0 else [])
                     for i, p in enumerate(rest)]  # fmt: skip
            done[g] = steps[-1]
            if not reducers:
                tb = tbs[(first[g], block(r, first[g], last)[0])]
                late.setdefault(tb, []).append((got[(first[g], last)].index, host.items))
        for tb, inserts in late.items():
            _splice(tb, inserts)
        if allreduce:  # the reduced chunks to every peer, sends one ahead again
            for p in peers:
                width = cpr // chans[(r, p)]
                for c in range(chans[(r, p)]):
                    tb, mine = tbs[(p, c)], list(range(c * width, (c + 1) * width))
                    own = _steps_of(tb)
                    for kind, j in _one_ahead(mine):
                        if kind == "r":
                            tb.add(r, "r", ("i", -1), ("o", out_off(p, j)), 1, [])
                            continue
                        at, ready = ("o", out_off(r, j)), done[j // group]
                        tb.add(r, "s", at, at, 1, [] if ready in own else [ready])
        every = [*tbs.values(), *(t for t in reducers if t.items)]
        add_rank(every, tb_meta, items_of)
        scratch.append(dict.fromkeys(range(len(slots)), 0))
    sched = Schedule(name, coll, n, total if allreduce else cpr, [], channels=max(chans.values()))
    low = MscclLowering(sched, lay, scratch, tb_meta, items_of, max(chans.values()))
    low.require(max_threadblocks=budget, max_steps=MAX_STEPS)
    return _arrays(coll, n, cpr, chans, group, name), low


def _one_ahead(chunks: list[int]) -> list[tuple[str, int]]:
    """Sends and receives of `chunks` with every send one chunk ahead: s0 s1 r0 s2 r1 ..."""
    out = [("s", chunks[0])] if chunks else []
    for i, j in enumerate(chunks):
        if i + 1 < len(chunks):
            out.append(("s", chunks[i + 1]))
        out.append(("r", j))
    return out


def _steps_of(tb: _Tb) -> set[_Step]:
    return {st for _, st, _ in tb.items if st is not None}


def _splice(tb: _Tb, inserts: list[tuple[int, list[Item]]]) -> None:
    """Put each reduce's items right after the receive at its position in `tb`."""
    at = dict(inserts)
    out: list[Item] = []
    for pos, item in enumerate(tb.items):
        out.append(item)
        out.extend(at.get(pos, []))
    tb.items = out


class _Builder:
    """Transfers for the simulator: one queue per (sender, receiver, channel), one in flight."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, bool]] = []
        self.deps: list[tuple[int, ...]] = []
        self.queue: dict[tuple[int, int, int], int] = {}

    def add(self, u: int, v: int, k: int, c: int, reduce: bool, after: tuple[int, ...]) -> int:
        prev = self.queue.get((u, v, c))
        self.rows.append((u, v, k, c, reduce))
        self.deps.append(after if prev is None else (*after, prev))
        self.queue[(u, v, c)] = len(self.rows) - 1
        return len(self.rows) - 1

    def arrays(self, name: str, coll: Collective, n: int, cpr: int,
               channels: int) -> ScheduleArrays:  # fmt: skip
        src, dst, chunk, chan, red = (list(x) for x in zip(*self.rows, strict=True))
        ptr, idx = dep_csr(self.deps)
        return ScheduleArrays(
            name=name, collective=coll, nranks=n, chunks_per_rank=cpr,
            src=np.asarray(src, dtype=np.int32), dst=np.asarray(dst, dtype=np.int32),
            chunk=np.asarray(chunk, dtype=np.int64), count=np.ones(len(src), dtype=np.int32),
            reduce=np.asarray(red, dtype=bool), channel=np.asarray(chan, dtype=np.int32),
            dep_ptr=ptr, dep_idx=idx, channels=channels,
        )  # fmt: skip


def _arrays(coll: Collective, n: int, cpr: int, chans: dict[Pair, int], group: int,
            name: str) -> ScheduleArrays:  # fmt: skip
    """What the simulator times: every contribution a direct reduce (one connection queue per
    (sender, receiver, channel), one transfer in flight), AllReduce's sends after the group's
    reduces into the sender."""
    allreduce = coll == Collective.ALLREDUCE
    b = _Builder()
    into: dict[tuple[int, int], list[int]] = {}
    for v in range(n):
        for u in range(n):
            if u != v:
                for j in range(cpr):
                    c = j // (cpr // chans[(u, v)])
                    into.setdefault((v, j // group), []).append(
                        b.add(u, v, v * cpr + j, c, True, ()))  # fmt: skip
    if allreduce:
        for u in range(n):
            for v in range(n):
                if u != v:
                    for j in range(cpr):
                        c = j // (cpr // chans[(u, v)])
                        b.add(u, v, u * cpr + j, c, False, tuple(into[(u, j // group)]))
    return b.arrays(name, coll, n, n * cpr if allreduce else cpr, max(chans.values()))


__all__ = ["direct"]
