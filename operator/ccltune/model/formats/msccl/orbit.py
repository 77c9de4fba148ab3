"""Read back a file that is its own translates once per orbit, not once per rank (issue 18).

Rank r's steps are rank 0's moved by a rank map P_r (translates.py). Where P_a P_s = P_{P_a(s)}
for every s (`automorphisms`), P_a maps the program onto itself: rank s's steps onto rank
P_a(s)'s, a connection's k-th send onto its image's k-th, flags onto flags. Those a form a
group (all N for the synthesized spread files; the server shifts for a rail ring, whose maps
also swap rails), happens-before is equivariant under it, and so is everything the reader
derives: what a send carries (chunks and ranks moved by P_a), whether a receive is combined, a
transfer's deps (nearest receives and sends, write-after-read orderings). So the proof and the
transfers are computed for the representatives' steps (one rank per orbit of ranks) and moved
to every rank; the run (`execute`: deadlock, completion order, which numbers the transfers)
and the happens-before queries stay on the whole program.

The representatives' steps are visited in an order of the orbit graph. It is a DAG: a cycle of
orbits lifts to a path from a step x to P(x), which repeated |P| times closes a cycle of the
program, and `execute` has just run it to completion. That order is all ranks run in lockstep,
one orbit at a time: a linear extension of happens-before, in which the proof (order-free:
docs/synthesis-scale.md, "Reading translates back") holds on every rank exactly when it holds
on the representatives. Anything unexpected returns None and the caller reads rank by rank
(the reference): docs/synthesis-scale.md, "Session 12: reading back once per orbit".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Transfer
from .executor import SEND_TYPES, Program, XStep
from .replay import Reach, Value, prove
from .writer import _Layout

_EMPTY: frozenset[int] = frozenset()

_ROWS = 1 << 15  # transfers whose deps `_moved` numbers at a time


def automorphisms(maps: list[np.ndarray]) -> np.ndarray | None:
    """The ranks a whose map P_a moves every rank s's values onto rank P_a(s)'s (P_a P_s =
    P_{P_a(s)} for every s: then P_a maps the program onto itself); None if some map is not a
    permutation. They form a group acting freely on the ranks (closure: P_{P_a(b)} = P_a P_b;
    P_a(s) = s gives P_a = P_0, the identity, so a = P_a(0) = 0). So each a found brings the
    group it generates with it: a full check (N^2) for a few generators, not for every rank."""
    m = np.stack(maps)
    n = len(m)
    if m.shape != (n, n) or not (np.sort(m, axis=1) == np.arange(n)).all():
        return None
    found = {0}
    if n < 2:
        return np.zeros(1, dtype=np.int64)
    maybe = np.flatnonzero((m[:, m[1]] == m[m[:, 1]]).all(axis=1))  # s = 1 for every a at once
    for a in maybe.tolist():
        if a in found or not np.array_equal(m[a][m], m[m[a]]):
            continue
        found.add(a)
        while True:  # P_x(y) for x, y found
            have = np.array(sorted(found), dtype=np.int64)
            more = set(np.unique(m[have][:, have]).tolist())
            if more <= found:
                break
            found |= more
    return np.array(sorted(found), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Orbits:
    """The group and how it moves chunks (by translation blocks, as translates.Translator)."""

    maps: np.ndarray  # [N, N]: maps[r] = P_r
    steps: int  # steps per GPU: rank r's step at local position L has uid r * steps + L
    coll: Collective
    block: int  # chunks per translation block
    elems: np.ndarray  # the group: a for each automorphism P_a
    reps: np.ndarray  # the least rank of each orbit of ranks, ascending
    rep_of: np.ndarray  # per rank s: its orbit's least rank b
    elem_of: np.ndarray  # per rank s: the a with P_a(b) = s

    def twin(self, x: XStep) -> tuple[int, int]:
        """(uid of the representative of step x's orbit, the a moving it onto x)."""
        g = x.gpu
        return x.uid + (int(self.rep_of[g]) - g) * self.steps, int(self.elem_of[g])

    @property
    def n(self) -> int:
        return len(self.maps)

    def chunk(self, k: int, r: int) -> int:
        """Chunk k of the collective's chunk space moved by P_r."""
        p, b, n = self.maps[r], self.block, self.n
        blk, j = divmod(k, b)
        if self.coll == Collective.ALLTOALL:
            s, d = divmod(blk, n)
            return (int(p[s]) * n + int(p[d])) * b + j
        return int(p[blk]) * b + j

    def chunks(self, k: np.ndarray, r: np.ndarray) -> np.ndarray:
        """`chunk` on arrays (k and r broadcast)."""
        m, b, n = self.maps, self.block, self.n
        blk, j = np.divmod(k, b)
        if self.coll == Collective.ALLTOALL:
            s, d = np.divmod(blk, n)
            return (m[r, s] * n + m[r, d]) * b + j
        return m[r, blk] * b + j

    def bits(self, bits: int, r: int) -> int:
        p = self.maps[r]
        out = 0
        while bits:
            low = bits & -bits
            out |= 1 << int(p[low.bit_length() - 1])
            bits ^= low
        return out


def orbits_of(maps: list[np.ndarray], prog: Program, lay: _Layout) -> Orbits | None:
    """The orbits of a program whose rank r is rank 0 moved by maps[r] (None: not a group, or
    a layout without translation blocks)."""
    n = len(prog.tbs)
    if len(maps) != n or len(prog.steps) % n:
        return None
    elems = automorphisms(maps)
    if elems is None or len(elems) < 2:
        return None
    m = np.stack(maps)
    rep_of = m[elems].min(axis=0)
    hit = m[elems][:, rep_of] == np.arange(n)[None, :]
    elem_of = elems[hit.argmax(axis=0)]
    if lay.coll in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL):
        block = lay.c
    elif lay.coll == Collective.ALLREDUCE and lay.c % n == 0:
        block = lay.c // n
    else:
        return None
    return Orbits(m, len(prog.steps) // n, lay.coll, block, elems, np.unique(rep_of), rep_of,
                  elem_of)  # fmt: skip


def orbit_order(prog: Program, preds: list[list[XStep]], orb: Orbits) -> list[XStep] | None:
    """The representatives' steps (those of `orb.reps`), each after the representatives of its
    predecessors (None: the orbits' graph has a cycle, which an equivariant program run to
    completion cannot have)."""
    mine = [u for b in orb.reps.tolist() for u in range(b * orb.steps, (b + 1) * orb.steps)]
    indeg: dict[int, int] = dict.fromkeys(mine, 0)
    succ: dict[int, list[int]] = {u: [] for u in mine}
    for u in mine:
        for p in preds[u]:
            succ[orb.twin(p)[0]].append(u)
            indeg[u] += 1
    ready = deque(u for u in mine if not indeg[u])
    out: list[XStep] = []
    while ready:
        u = ready.popleft()
        out.append(prog.steps[u])
        for v in succ[u]:
            indeg[v] -= 1
            if not indeg[v]:
                ready.append(v)
    return out if len(out) == len(mine) else None


def orbit_prove(prog: Program, walk: list[XStep], orb: Orbits, before: Callable[[int, int], bool],
                lay: _Layout, inplace: bool) -> tuple[dict[int, list[Value]], set[int]]:  # fmt: skip
    """`prove` on the representatives' buffers, in orbit order: a receive gets what the
    representative of its sender carried, moved onto the sender."""

    def received(snd: XStep, sent: dict[int, list[Value]]) -> list[Value]:
        u, a = orb.twin(snd)
        return [(orb.chunk(k, a), orb.bits(b, a)) for k, b in sent[u]]

    return prove(prog, walk, before, lay, inplace, ranks=orb.reps.tolist(), received=received)


@dataclass(slots=True)
class Moved:
    """The reader's transfers built per orbit (reader.py `_transfers` has the same meaning)."""

    transfers: list[Transfer]
    timed: list[Transfer]  # [] without local operations
    send_tb: np.ndarray
    recv_tb: np.ndarray
    send_step: np.ndarray
    recv_step: np.ndarray
    local_tb: np.ndarray | None
    local_step: np.ndarray | None
    local_traffic: np.ndarray | None
    senders: tuple[int, ...]


def orbit_transfers(
    prog: Program, order: list[XStep], preds: list[list[XStep]], reach: Reach, walk: list[XStep],
    orb: Orbits, sent: dict[int, list[Value]], combined: set[int],
    local_ops: Callable[[Program], tuple[list[list[XStep]], dict[int, int]]],
    consecutive: Callable[[list[int]], Iterator[tuple[int, int]]],
    acyclic: Callable[[list[list[int]]], bool],
) -> Moved | None:
    """reader.py `_transfers` for the representatives' steps (`sent`, `combined`:
    `orbit_prove`'s), moved to every rank and numbered as there (sends in completion order
    `order`, each send's runs in chunk order; local operations after them, GPU by GPU). A
    transfer is named t * N + a: P_a's image of representative transfer t. None: a send's runs
    of consecutive chunks are not the same on every rank (their count would differ)."""
    n, maps = orb.n, orb.maps
    inv = np.argsort(maps, axis=1)  # P_a^-1 = P_b with b = inv[a, 0]
    # the representatives' transfers: one per run of each send, numbered in orbit order
    ids: dict[int, list[int]] = {}
    raw: list[tuple[XStep, int, int, bool]] = []
    firsts: list[bool] = []  # per chunk sent: does a run start there
    begins: list[bool] = []  # ... a send
    chunks: list[int] = []
    for x in walk:
        if x.type in SEND_TYPES:
            ks = [k for k, _ in sent[x.uid]]
            rx = prog.receiver_of[x.uid]
            ids[x.uid] = []
            for first, cnt in consecutive(ks):
                ids[x.uid].append(len(raw))
                raw.append((x, ks[first], cnt, orb.twin(rx)[0] in combined))
                firsts += [True] + [False] * (cnt - 1)
            chunks += ks
            begins += [True] + [False] * (len(ks) - 1)
    if chunks:  # the runs of an image: its chunks moved, cut where they stop being consecutive
        moved = orb.chunks(np.array(chunks, dtype=np.int64)[None, :], orb.elems[:, None])
        starts = np.array(begins)[None, :].repeat(len(orb.elems), axis=0)
        starts[:, 1:] |= moved[:, 1:] != moved[:, :-1] + 1
        if not (starts == np.array(firsts)[None, :]).all():
            return None
    m = len(raw)
    ops, op_of = local_ops(prog)
    q = len(ops) // n  # per GPU, in the same order on every GPU
    if len(ops) != q * n or any(ops[i][0].gpu != i // q for i in range(0, len(ops), max(q, 1))):
        return None
    rep_index = {b: i for i, b in enumerate(orb.reps.tolist())}
    rep_ops = [ops[b * q + j] for b in orb.reps.tolist() for j in range(q)]
    base = m * n  # names at or above: local operations, (m + o) * n + a

    def op_name(i: int, gpu: int) -> int:
        """Name of local operation i (`ops`) of `gpu`."""
        b = int(orb.rep_of[gpu])
        return (m + rep_index[b] * q + i - gpu * q) * n + int(orb.elem_of[gpu])

    held = {x.uid: frozenset((op_name(op_of[x.uid], x.gpu),)) for x in walk if x.uid in op_of}
    first_of = {op[0].uid: o for o, op in enumerate(rep_ops)}
    empty: frozenset[int] = frozenset()
    op_deps: list[frozenset[int]] = [empty] * len(rep_ops)

    def move(names: frozenset[int], a: int) -> frozenset[int]:
        if not a or not names:
            return names
        p = maps[a]
        return frozenset(e - e % n + int(p[e % n]) for e in names)

    seen: dict[int, frozenset[int]] = {}

    def through(deps: frozenset[int]) -> frozenset[int]:
        if not q:
            return deps
        return through_local_ops(deps, base, lambda d: move(op_deps[d // n - m], d % n), seen)

    # the receive of each representative transfer: its GPU and its uid less the GPU's first
    recv_gpu = [prog.receiver_of[x.uid].gpu for x, _, _, _ in raw]
    recv_at = [prog.receiver_of[x.uid].uid - g * orb.steps for (x, _, _, _), g in
               zip(raw, recv_gpu, strict=True)]  # fmt: skip

    def recv_uid(name: int) -> int:
        t, a = divmod(name, n)
        return int(maps[a, recv_gpu[t]]) * orb.steps + recv_at[t]

    readers: dict[int, int] = {}
    sender_of = prog.sender_of
    for x in walk:
        snd = sender_of.get(x.uid)
        for p in preds[x.uid]:
            if p is not snd:
                readers[p.uid] = readers.get(p.uid, 0) + 1
    got: dict[int, frozenset[int]] = {}
    put: dict[int, frozenset[int]] = {}
    sending: dict[int, tuple[frozenset[int], frozenset[int], frozenset[int]]] = {}
    both: list[list[int]] = [[] for _ in range(m)]  # names as seen from each transfer's own
    wars: dict[int, frozenset[int]] = {}
    waits: dict[int, tuple[frozenset[int], frozenset[int]]] = {}
    for x in walk:
        u = x.uid
        snd = sender_of.get(u)
        gb, sb = merged_preds(preds[u], snd, got, put, readers)
        op = first_of.get(u)
        if op is not None:
            op_deps[op] = gb
        mine = frozenset(t * n for t in ids[u]) if u in ids else None
        if snd is not None:
            twin, a = orb.twin(snd)
            got_u = frozenset(t * n + a for t in ids[twin])
        else:
            got_u = held.get(u, gb)
        if readers.get(u):
            got[u] = got_u
            put[u] = sb if mine is None else mine
        if mine is not None:
            sending[u] = (mine, got_u, sb)
        if snd is None:
            continue
        _, s_got, s_sent = sending.pop(twin)
        wait = move(s_got, a) | gb
        dep = through(wait)
        earlier = (move(s_sent, a) | sb) - dep
        war: frozenset[int] = empty
        if earlier:
            after = reach.reached(snd.uid, [recv_uid(t) for t in earlier])
            war = frozenset(t for t in earlier if recv_uid(t) not in after)
        back = int(inv[a, 0])  # to the representative's frame
        for t in ids[twin]:
            i = t * n + a
            both[t] = sorted(move((dep | war) - {i}, back))
            if war:
                wars[t] = move(war, back)
            if dep is not wait:  # `through` replaced a local operation
                waits[t] = (move(wait - {i}, back), move(war, back))
    if sending:
        return None
    keep_war = acyclic([[e // n for e in row] for row in both])
    if not keep_war:
        both = [[e for e in row if e not in wars[t]] if t in wars else row
                for t, row in enumerate(both)]  # fmt: skip
    return _moved(prog, order, orb, raw, ids, both, rep_ops, q, op_deps, waits, keep_war, sent,
                  op_name)  # fmt: skip


def _moved(prog: Program, order: list[XStep], orb: Orbits, raw: list[tuple[XStep, int, int, bool]],
           ids: dict[int, list[int]], both: list[list[int]], rep_ops: list[list[XStep]], q: int,
           op_deps: list[frozenset[int]], waits: dict[int, tuple[frozenset[int], frozenset[int]]],
           keep_war: bool, sent: dict[int, list[Value]],
           op_name: Callable[[int, int], int]) -> Moved | None:  # fmt: skip
    """Every rank's transfers from the representatives', numbered as `_transfers` numbers them."""
    n, steps, maps = orb.n, orb.steps, orb.maps
    m = len(raw)
    # numbers: sends in completion order, each send's runs in order; then local operations,
    # GPU by GPU
    number = np.full((m + len(rep_ops)) * n, -1, dtype=np.int64)
    of_full: list[int] = []  # per transfer number: its name
    sent_by = [x for x in order if x.type in SEND_TYPES]
    for lo in range(0, len(sent_by), _ROWS):  # `twin` of each, on arrays, a block at a time
        block = sent_by[lo : lo + _ROWS]
        gpu = np.array([x.gpu for x in block], dtype=np.int64)
        rep_uid = np.array([x.uid for x in block], dtype=np.int64) + (orb.rep_of[gpu] - gpu) * steps
        for u, a in zip(rep_uid.tolist(), orb.elem_of[gpu].tolist(), strict=True):
            for t in ids[u]:
                of_full.append(t * n + a)
    names = np.array(of_full, dtype=np.int64)
    if len(names) != m * len(orb.elems) or len(np.unique(names)) != len(names):
        return None
    number[names] = np.arange(len(names))
    nsends = len(names)
    op_names = np.array([op_name(g * q + j, g) for g in range(n) for j in range(q)],
                        dtype=np.int64)  # fmt: skip
    number[op_names] = nsends + np.arange(len(op_names))
    t_of, a_of = names // n, names % n
    ints = np.array(list(range(nsends + len(op_names))), dtype=object)  # an int object a number

    def rows(deps: list[list[int]], at: np.ndarray, elem: np.ndarray) -> list[tuple[int, ...]]:
        """deps[at[i]] (names seen from their representative) moved by elem[i] and numbered,
        sorted; `_ROWS` at a time (a 512-rank ring file has 7.5M deps: its temporaries at once
        took the read's peak ~100 MB past the rank-by-rank read's)."""
        ptr = np.zeros(len(deps) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in deps], out=ptr[1:])
        flat = np.fromiter(chain.from_iterable(deps), dtype=np.int64, count=int(ptr[-1]))
        out: list[tuple[int, ...]] = []
        for lo in range(0, len(at), _ROWS):
            t, a = at[lo : lo + _ROWS], elem[lo : lo + _ROWS]
            lens = ptr[t + 1] - ptr[t]
            first = np.cumsum(lens) - lens
            e = flat[np.repeat(ptr[t] - first, lens) + np.arange(int(lens.sum()))]
            owner = np.repeat(np.arange(len(t)), lens)
            num = number[e - e % n + maps[np.repeat(a, lens), e % n]]
            # each row's numbers sorted by one sort of (row, number) keys, in place (cheaper
            # than np.lexsort, and no key arrays of its own)
            owner *= len(ints)
            owner += num
            owner.sort()
            owner %= len(ints)
            shared = ints[owner].tolist()  # the same int objects
            ends = (first + lens).tolist()
            out += [tuple(shared[i:j]) for i, j in zip(first.tolist(), ends, strict=True)]
        return out

    deps = rows(both, t_of, a_of)
    x_of = [raw[t][0] for t in range(m)]
    rx_of = [prog.receiver_of[x.uid] for x in x_of]
    gpu0 = np.array([x.gpu for x in x_of], dtype=np.int64)
    src = maps[a_of, gpu0[t_of]]
    dst = maps[a_of, np.array([x.send for x in x_of], dtype=np.int64)[t_of]]
    chunk = orb.chunks(np.array([raw[t][1] for t in range(m)], dtype=np.int64)[t_of], a_of)
    cnt = [raw[t][2] for t in range(m)]
    red = [raw[t][3] for t in range(m)]
    chan = [x.chan for x in x_of]
    rank_ints = np.array(range(n), dtype=object)  # one int object a rank, a chunk, a uid
    transfers = [
        Transfer(r, d, k, cnt[t], red[t], dd, chan[t])
        for t, r, d, k, dd in zip(t_of.tolist(), rank_ints[src].tolist(),
                                  rank_ints[dst].tolist(), _shared(chunk), deps, strict=True)
    ]  # fmt: skip

    def column(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int32)[t_of]

    at0 = np.array([x.uid - x.gpu * steps for x in x_of], dtype=np.int64)
    senders = tuple(_shared(src * steps + at0[t_of], [x.uid for x in prog.steps]))
    timed: list[Transfer] = []
    local_tb = local_step = local_traffic = None
    if q:
        sends = list(transfers)
        for t, (w, war) in waits.items():
            wt = list(w | war if keep_war else w)
            at = np.flatnonzero(t_of == t)
            for i, dd in zip(at.tolist(), rows([wt], np.zeros(len(at), dtype=np.int64), a_of[at]),
                             strict=True):  # fmt: skip
                was = transfers[i]
                sends[i] = Transfer(was.src, was.dst, was.chunk, was.count, was.reduce, dd,
                                    was.channel)  # fmt: skip
        o_of, a_op = op_names // n - m, op_names % n
        op_rows = rows([sorted(d) for d in op_deps], o_of, a_op)
        k0 = np.array([sent[op[0].uid][0][0] for op in rep_ops], dtype=np.int64)
        ks = orb.chunks(k0[o_of], a_op).tolist()
        g_of = np.arange(len(op_names)) // q
        timed = sends + [
            Transfer(g, g, k, rep_ops[o][0].cnt, rep_ops[o][0].type == "re", dd, rep_ops[o][0].chan)
            for o, g, k, dd in zip(o_of.tolist(), g_of.tolist(), ks, op_rows, strict=True)
        ]  # fmt: skip
        first = rep_ops[:q]  # rank 0's: every GPU's are the same threadblocks and steps
        local_tb = np.tile(np.array([op[0].tb for op in first], dtype=np.int32), n)
        local_step = np.tile(np.array([op[-1].idx for op in first], dtype=np.int32), n)
        # cpy: 1 read + 1 write; a fused reduction also reads its destination
        local_traffic = np.tile(np.array([2 if op[0].type == "cpy" else len(op) + 2
                                          for op in first], dtype=np.int32), n)  # fmt: skip
    return Moved(
        transfers, timed, column([x.tb for x in x_of]), column([rx.tb for rx in rx_of]),
        column([x.idx for x in x_of]), column([rx.idx for rx in rx_of]), local_tb, local_step,
        local_traffic, senders,
    )


def _shared(values: np.ndarray, table: list[int] | None = None) -> list[int]:
    """`values.tolist()` with equal values one int object (`table[v]` if given, which holds
    v at v): a 512-rank file's transfers held ~400k ints of their own."""
    top = int(values.max(initial=-1)) + 1
    if table is None:
        if top > 2 * len(values) + 256 or int(values.min(initial=0)) < 0:
            return values.tolist()
        table = list(range(top))
    return np.array(table, dtype=object)[values].tolist()



def merged_preds(preds: list[XStep], snd: XStep | None, got: dict[int, frozenset[int]],
                 put: dict[int, frozenset[int]], readers: dict[int, int] | list[int]
                 ) -> tuple[frozenset[int], frozenset[int]]:  # fmt: skip
    """The union of a step's predecessors' received and sent transfer sets (its own
    receive's sender aside), each predecessor's dropped once its last reader has it. A single
    predecessor's sets are shared, not copied (frozensets)."""
    gb = sb = _EMPTY
    for p in preds:
        if p is snd:
            continue
        pu = p.uid
        g, s = got[pu], put[pu]
        gb = g if not gb else gb | g
        sb = s if not sb else sb | s
        readers[pu] -= 1
        if not readers[pu]:
            del got[pu], put[pu]
    return gb, sb


def through_local_ops(deps: frozenset[int], base: int,
                      waits_of: Callable[[int], frozenset[int]],
                      seen: dict[int, frozenset[int]]) -> frozenset[int]:  # fmt: skip
    """`deps` with each local operation (a name >= `base`) replaced by what it waits for
    (`waits_of`), recursively; `seen` memoises the replaced ones."""
    if max(deps, default=-1) < base:
        return deps
    out: set[int] = set()
    for d in deps:
        if d < base:
            out.add(d)
            continue
        if d not in seen:
            seen[d] = through_local_ops(waits_of(d), base, waits_of, seen)
        out |= seen[d]
    return frozenset(out)

__all__ = ["Moved", "Orbits", "automorphisms", "merged_preds", "orbit_order", "orbit_prove",
           "orbit_transfers", "orbits_of", "through_local_ops"]  # fmt: skip
