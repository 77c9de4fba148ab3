"""Prove an MSCCL program's data movement by replaying it chunk slot by chunk slot.

Every input, output and scratch chunk slot of every GPU holds (chunk of the collective's chunk
space, set of ranks summed into it). Steps run in an order the executor can run them in
(msccl_exec.execute); a read must find data, a write must be ordered (happens-before: program
order, dependency flags, a send before its receive) against every other read and write of its
slot, reductions must combine the same chunk without counting a rank twice, and every output
slot must end with its chunk of every rank the collective gives it. In place, the input is part
of the output buffer as NCCL lays it out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from ....api.common import Collective
from .executor import (
    LOCAL_TYPES,
    RECV_TYPES,
    REDUCING_TYPES,
    SEND_TYPES,
    WRITES_DST,
    Program,
    XStep,
)
from .writer import MscclFormatError, _Layout

Value = tuple[int, int]  # (chunk of the collective's chunk space, bitset of ranks it holds)
Slot = tuple[int, str, int]  # (gpu, buffer, chunk offset) after in-place aliasing


class Reach:
    """Does step a happen before step b? Backward search pruned by completion position."""

    def __init__(self, preds: list[list[XStep]], pos: Sequence[int] | Mapping[int, int],
                 steps: list[XStep], prog: Program | None = None) -> None:  # fmt: skip
        self.preds, self.pos, self.steps = preds, pos, steps
        self.prog = prog  # for `reached` (its steps are `steps`)
        # A step of cnt slots asks about the same pair once per slot (64 on 512-GPU bundles).
        self._known: dict[tuple[int, int], bool] = {}
        self._releases: dict[int, list[int]] | None = None

    def before(self, a: int, b: int) -> bool:
        pa = self.pos[a]
        if a == b or pa >= self.pos[b]:
            return False
        known = self._known.get((a, b))
        if known is None:
            known = self._known[(a, b)] = self._search(a, b, pa)
        return known

    def reached(self, a: int, bs: Iterable[int]) -> set[int]:
        """The steps of `bs` that step a happens before: `before(a, b)` for each b at once, by
        one forward search from a (a send asks about ~30 receives; a backward search each was
        most of reading a reducing file back). Stops at the position of the last b asked."""
        pos, known = self.pos, self._known
        pa = pos[a]
        out: set[int] = set()
        ask: list[int] = []
        for b in bs:
            if b == a or pa >= pos[b]:
                continue
            got = known.get((a, b))
            if got is None:
                ask.append(b)
            elif got:
                out.add(b)
        if not ask:
            return out
        limit = max(pos[b] for b in ask)
        prog, steps = self.prog, self.steps
        if prog is None:
            raise ValueError("Reach.reached needs the program")
        released, receiver_of = self._released(prog), prog.receiver_of
        last = len(steps) - 1
        seen, stack = {a}, [a]
        while stack:
            u = stack.pop()
            x = steps[u]
            # u's successors: the next step of its threadblock (steps are numbered threadblock
            # by threadblock), the steps its flag releases, the receive of its send
            nxt = [u + 1] if u < last and steps[u + 1].idx == x.idx + 1 else []
            if u in released:
                nxt += released[u]
            if u in receiver_of:
                nxt.append(receiver_of[u].uid)
            for q in nxt:
                if q not in seen and pos[q] <= limit:
                    seen.add(q)
                    stack.append(q)
        for b in ask:
            got = known[(a, b)] = b in seen
            if got:
                out.add(b)
        return out

    def _released(self, prog: Program) -> dict[int, list[int]]:
        """The steps each step's flag releases (`Program.released_by` inverted)."""
        if self._releases is None:
            self._releases = {}
            for u, x in prog.released_by.items():
                self._releases.setdefault(x.uid, []).append(u)
        return self._releases

    def _search(self, a: int, b: int, pa: int) -> bool:
        # A threadblock's steps are a chain (each one's previous step is among its preds), so
        # reaching a's threadblock at a or after it is reaching a: stop there, not a's step.
        xa = self.steps[a]
        gpu, tb, idx = xa.gpu, xa.tb, xa.idx
        seen, stack = {b}, [b]
        while stack:
            for p in self.preds[stack.pop()]:
                if p.tb == tb and p.gpu == gpu and p.idx >= idx:
                    return True
                if p.uid not in seen and self.pos[p.uid] > pa:
                    seen.add(p.uid)
                    stack.append(p.uid)
        return False


def _placer(lay: _Layout, inplace: bool) -> Callable[[int, str, int], Slot]:
    """Where (gpu, buffer, offset) lives; in place the input is part of the output buffer
    (NCCL: allgather's input at rank x count of the output, reducescatter's output at rank x
    count of the input, the same buffer for the others)."""
    coll, c = lay.coll, lay.c

    def place(g: int, buf: str, off: int) -> Slot:
        if inplace:
            if coll == Collective.REDUCESCATTER and buf == "o":
                return (g, "i", g * c + off)
            if coll == Collective.ALLGATHER and buf == "i":
                return (g, "o", g * c + off)
            if coll != Collective.REDUCESCATTER and buf == "i":
                return (g, "o", off)
        return (g, buf, off)

    return place


def prove(
    prog: Program,
    order: list[XStep],
    before: Callable[[int, int], bool],
    lay: _Layout,
    inplace: bool,
    ranks: Sequence[int] | None = None,
    received: Callable[[XStep, dict[int, list[Value]]], list[Value]] | None = None,
) -> tuple[dict[int, list[Value]], set[int]]:
    """Replay the data movement in `order` and prove it (MscclFormatError naming the step if
    not); return what each send (and each local step) carries and the receives whose data gets
    combined with another contribution (a reduction) rather than stored. `ranks`: the GPUs
    whose buffers are replayed (all: None), `order` holding their steps only; `received`
    (sending step, `sent` so far) -> what a receive from another GPU gets (orbit.py)."""
    mode = "in place" if inplace else "out of place"
    place = _placer(lay, inplace)
    n, coll = lay.n, lay.coll
    reducing = coll in (Collective.ALLREDUCE, Collective.REDUCESCATTER)
    state: dict[Slot, Value] = {}
    writer: dict[Slot, int] = {}
    readers: dict[Slot, list[int]] = {}
    arrived: dict[Slot, int] = {}  # slot -> the receive step that stored plain data there
    for g in range(n) if ranks is None else ranks:
        for off in range(lay.i_chunks):
            k = lay.input_chunk(g, off)
            if k is not None:
                state[place(g, "i", off)] = (k, 1 << g)

    def read(x: XStep, buf: str, off: int) -> list[Value]:
        out = []
        for j in range(x.cnt):
            key = place(x.gpu, buf, off + j)
            w = writer.get(key)
            if w is not None and w != x.uid and not before(w, x.uid):
                raise MscclFormatError(
                    f"race ({mode}): {x.where} reads {buf}[{off + j}] while "
                    f"{prog.steps[w].where} may still be writing it"
                )
            if key not in state:
                raise MscclFormatError(
                    f"{x.where}: reads {buf}[{off + j}], which holds no data yet ({mode})"
                )
            readers.setdefault(key, []).append(x.uid)
            out.append(state[key])
        return out

    def write(x: XStep, vals: list[Value]) -> None:
        for j, v in enumerate(vals):
            key = place(x.gpu, x.dstbuf, x.dstoff + j)
            for other in [writer.get(key), *readers.get(key, ())]:
                if other is not None and other != x.uid and not before(other, x.uid):
                    raise MscclFormatError(
                        f"race ({mode}): {x.where} writes {x.dstbuf}[{x.dstoff + j}] while "
                        f"{prog.steps[other].where} may still be using it"
                    )
            state[key], writer[key], readers[key] = v, x.uid, []
            arrived.pop(key, None)

    combined: set[int] = set()

    def combine(x: XStep, a: list[Value], b: list[Value], b_slots: list[Slot]) -> list[Value]:
        out = []
        for (ka, ba), (kb, bb), key in zip(a, b, b_slots, strict=True):
            if not reducing:
                raise MscclFormatError(f"{x.where}: reduces in a {coll}, which has no reduction")
            if ka != kb:
                raise MscclFormatError(f"{x.where}: reduces chunk {ka} with chunk {kb} ({mode})")
            if ba & bb:
                raise MscclFormatError(
                    f"{x.where}: reduction counts ranks {_ranks(ba & bb)} twice ({mode})"
                )
            if key in arrived:
                combined.add(arrived[key])
            out.append((ka, ba | bb))
        return out

    def slots(x: XStep, buf: str, off: int) -> list[Slot]:
        return [place(x.gpu, buf, off + j) for j in range(x.cnt)]

    sent: dict[int, list[Value]] = {}
    for x in order:
        t = x.type
        data: list[Value] = []
        if t in RECV_TYPES:
            snd = prog.sender_of[x.uid]
            data = sent[snd.uid] if received is None else received(snd, sent)
            if t in REDUCING_TYPES:
                combined.add(x.uid)
                local = slots(x, x.srcbuf, x.srcoff)
                data = combine(x, data, read(x, x.srcbuf, x.srcoff), local)
        elif t in ("s", "cpy"):
            data = read(x, x.srcbuf, x.srcoff)
        elif t == "re":
            src = slots(x, x.srcbuf, x.srcoff)
            vals = read(x, x.srcbuf, x.srcoff)
            for key in src:  # a received contribution reduced into place
                if key in arrived:
                    combined.add(arrived[key])
            data = combine(x, vals, read(x, x.dstbuf, x.dstoff), slots(x, x.dstbuf, x.dstoff))
        if t == "cpy" and slots(x, x.srcbuf, x.srcoff) == slots(x, x.dstbuf, x.dstoff):
            pass  # in place, a copy onto itself changes no byte
        elif t in WRITES_DST:
            write(x, data)
            if t in ("r", "rcs"):
                for key in slots(x, x.dstbuf, x.dstoff):
                    arrived[key] = x.uid
        if t in SEND_TYPES or t in LOCAL_TYPES:  # a local step's values name its chunks
            sent[x.uid] = data
    _postconditions(lay, state, place, mode, range(n) if ranks is None else ranks)
    return sent, combined


def _postconditions(lay: _Layout, state: dict[Slot, Value], place: Callable[[int, str, int], Slot],
                    mode: str, ranks: Iterable[int]) -> None:  # fmt: skip
    n, c, coll = lay.n, lay.c, lay.coll
    full = (1 << n) - 1
    for g in ranks:
        for off in range(lay.o_chunks):
            k = lay.output_chunk(g, off)
            if coll in (Collective.ALLREDUCE, Collective.REDUCESCATTER):
                want = full
            elif coll == Collective.ALLGATHER:
                want = 1 << (k // c)
            elif coll == Collective.ALLTOALL:
                want = 1 << (k // (n * c))
            else:
                want = 1 << lay.root
            got = state.get(place(g, "o", off))
            if got != (k, want):
                held = "nothing" if got is None else f"chunk {got[0]} of ranks {_ranks(got[1])}"
                raise MscclFormatError(
                    f"{coll} ({mode}): gpu {g} ends with output chunk {off} wrong: it should hold "
                    f"chunk {k} of ranks {_ranks(want)} but holds {held}"
                )


def _ranks(bits: int) -> str:
    return "{" + ", ".join(str(r) for r in range(bits.bit_length()) if bits >> r & 1) + "}"
