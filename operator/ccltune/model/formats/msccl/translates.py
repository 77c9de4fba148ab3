"""Read a file whose ranks are rank 0's translates by parsing rank 0 alone.

The writer lowers translated schedules once and writes rank r's `<gpu>` as rank 0's with every
rank number and every input/output offset moved to rank r's frame (writer.py `_Mover`). Such a
file is read here from rank 0's `<gpu>` element: every other element must be, byte for byte,
rank 0's text with those values moved by one injective rank map P_r (P_r(0) = r), which is
inferred from the element itself and then checked by comparing the whole element. When the
comparison holds, rank r's parsed steps are exactly rank 0's with the same values moved, so
they are built that way instead of parsed (the checks `_parse` makes per step hold for a
translate of a step that passed them: see docs/synthesis-scale.md "Reading translates back").
Anything else (another attribute order, a comment, one differing value) returns None and the
file is parsed element by element.
"""

from __future__ import annotations

from itertools import accumulate, repeat
from operator import itemgetter

import numpy as np

from ....api.common import Collective
from .executor import XStep
from .writer import _Layout

_RANK, _IN, _OUT = 0, 1, 2  # what a variable attribute value holds
Moved = tuple[int, int, int]  # (token index, kind, rank 0's value)


def split_gpus(text: str) -> tuple[str, list[str], str] | None:
    """(head up to the first `<gpu`, each `<gpu>` element without the blank text after it
    (which the XML parser skips), the closing tag), or None when there is no `<gpu`."""
    first = text.find("<gpu ")
    end = text.rfind("</algo>")
    if first < 0 or end < first or text[end + len("</algo>") :].strip():
        return None
    body = text[first:end]
    segs = body.split("<gpu ")[1:]
    return text[:first], ["<gpu " + s.rstrip() for s in segs], text[end:]


def variables(tokens: list[str]) -> list[Moved] | None:
    """The positions in rank 0's `"`-split element whose values a translation moves: the gpu
    id, the threadblocks' peers, input and output offsets (None: an unexpected layout)."""
    out: list[Moved] = []
    for i in range(1, len(tokens), 2):
        label = tokens[i - 1]
        if label.endswith(("<gpu id=", " send=", " recv=")):
            kind = _RANK
        elif label.endswith((" srcoff=", " dstoff=")):
            buf_label = " srcbuf=" if label.endswith(" srcoff=") else " dstbuf="
            if i < 3 or not tokens[i - 3].endswith(buf_label):
                return None
            buf = tokens[i - 2]
            if buf == "s":
                continue
            kind = _IN if buf == "i" else _OUT
        else:
            continue
        try:
            val = int(tokens[i])
        except ValueError:
            return None
        if val >= 0:
            out.append((i, kind, val))
    return out


_NONE = -(1 << 40)  # "no translate": never an attribute's value
# Comments, processing instructions, CDATA, entities and single-quoted values: without them,
# an element that parses splits at `"` into names and values, alternately.
_NOT_PLAIN = ("<!", "<?", "&", "'")


class Translator:
    """Rank 0's values moved to rank r's frame under a rank map, on arrays (the writer's
    `_Mover`: chunks move by translation block, an owner's or a (source, destination) pair's)."""

    def __init__(self, lay: _Layout, coll: Collective, n: int, moved: list[Moved]) -> None:
        self.lay, self.coll, self.n = lay, coll, n
        if coll in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL):
            self.chunks = lay.c
        elif coll == Collective.ALLREDUCE and lay.c % n == 0:
            self.chunks = lay.c // n
        else:
            self.chunks = 0  # no translation blocks: not read this way
            return
        self.kind = np.array([k for _, k, _ in moved], dtype=np.int64)
        v0 = np.array([v for _, _, v in moved], dtype=np.int64)
        self.is_rank = self.kind == _RANK
        self.src, self.j0 = self._sources(0, v0)  # ranks each value moves with; chunk within

    def _chunk(self, r: int, v: np.ndarray) -> np.ndarray:
        """The chunk a slot of rank r holds (layout.input_chunk / output_chunk)."""
        n, c, coll, inp = self.n, self.lay.c, self.coll, self.kind == _IN
        if coll == Collective.ALLGATHER:
            return np.where(inp, r * c + v, v)
        if coll == Collective.REDUCESCATTER:
            return np.where(inp, v, r * c + v)
        if coll == Collective.ALLTOALL:
            s, j = np.divmod(v, c)
            return np.where(inp, r * n * c + v, (s * n + r) * c + j)
        return v

    def _sources(self, r: int, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per value, the ranks it moves with ([values, 1 or 2]) and its chunk in the block."""
        b, j = np.divmod(self._chunk(r, v), self.chunks)
        if self.coll == Collective.ALLTOALL:
            pairs = np.stack(np.divmod(b, self.n), axis=1)
        else:
            pairs = b[:, None]
        pairs = np.where(self.is_rank[:, None], v[:, None], pairs)
        return pairs, np.where(self.is_rank, 0, j)

    def infer(self, r: int, vr: np.ndarray) -> np.ndarray | None:
        """The rank map (-1: unused) that moves rank 0's values onto rank r's `vr` (None: no
        injective one)."""
        tgt, _ = self._sources(r, vr)
        src = self.src
        if (tgt < 0).any() or (tgt >= self.n).any():
            return None
        perm = np.full(self.n, -1, dtype=np.int64)
        perm[src.ravel()] = tgt.ravel()
        perm[0] = r
        if not np.array_equal(perm[src], tgt):
            return None
        used = perm[perm >= 0]
        if np.bincount(used, minlength=self.n).max(initial=0) > 1:  # tgt is in range
            return None
        return perm

    def move(self, r: int, perm: np.ndarray) -> np.ndarray:
        """Rank 0's values as rank r holds them under `perm` (_NONE: no translate)."""
        n, c, coll, inp = self.n, self.lay.c, self.coll, self.kind == _IN
        img = perm[self.src]
        if coll == Collective.ALLTOALL:
            k = (img[:, 0] * n + img[:, 1]) * self.chunks + self.j0
        else:
            k = img[:, 0] * self.chunks + self.j0
        if coll == Collective.ALLGATHER:
            off = np.where(inp, np.where(k // c == r, k - r * c, _NONE), k)
        elif coll == Collective.REDUCESCATTER:
            off = np.where(inp, k, np.where(k // c == r, k - r * c, _NONE))
        elif coll == Collective.ALLTOALL:
            s, d, j = k // (n * c), (k // c) % n, k % c
            off = np.where(inp, np.where(s == r, k - r * n * c, _NONE),
                           np.where(d == r, s * c + j, _NONE))  # fmt: skip
        else:
            off = k
        return np.where(self.is_rank, img[:, 0], off)


def translated_gpus(segs: list[str], tbs0: list[list[XStep]], coll: Collective, n: int, c: int,
                    maps: list[np.ndarray] | None = None,
                    ) -> list[list[list[XStep]]] | None:  # fmt: skip
    """Every rank's threadblocks, rank r's built as rank 0's (`tbs0`, parsed from `segs[0]`)
    translated, when each `<gpu>` element `segs[r]` is rank 0's translated byte for byte.
    `maps` (if given) gets each rank's map P_r (-1: a rank rank 0's values never name)."""
    if n < 2 or len(segs) != n:
        return None
    if any(mark in segs[0] for mark in _NOT_PLAIN):
        return None  # its `"`-split tokens might not alternate names and values
    tokens0 = segs[0].split('"')
    moved = variables(tokens0)
    if moved is None or len(moved) < 2:
        return None
    tr = Translator(_Layout(coll, n, c), coll, n, moved)
    if not tr.chunks:
        return None
    var_at = [i for i, _, _ in moved]
    at = set(var_at)
    fixed_at = [i for i in range(len(tokens0)) if i not in at]
    var_of, fixed_of = itemgetter(*var_at), itemgetter(*fixed_at)
    fixed0 = fixed_of(tokens0)
    slot = {i: m for m, i in enumerate(var_at)}
    where = _fields(tbs0, tokens0, slot)
    if where is None:
        return None
    out = [tbs0]
    cols = _Columns(tbs0, where, n)
    for r in range(1, n):
        tokens = segs[r].split('"')
        if len(tokens) != len(tokens0) or fixed_of(tokens) != fixed0:
            return None
        got = var_of(tokens)
        try:  # a text not as str() writes the value fails the comparison below
            vr = np.fromiter(map(int, got), dtype=np.int64, count=len(got))
        except (ValueError, OverflowError):
            return None
        perm = tr.infer(r, vr)
        if perm is None:
            return None
        want_at = tr.move(r, perm)
        if tuple(map(str, want_at.tolist())) != got:
            return None
        out.append(cols.moved(want_at, r))
        if maps is not None:
            maps.append(perm)
    if maps is not None:
        maps.insert(0, np.arange(n, dtype=np.int64))
    return out


def _fields(tbs0: list[list[XStep]], tokens0: list[str], slot: dict[int, int],
            ) -> list[list[tuple[int, int, int, int]]] | None:  # fmt: skip
    """Per step of rank 0, where its send, recv, srcoff and dstoff are among the variables
    (-1: not moved), found by walking the element's tokens in document order (None: the
    tokens do not line up with the parsed steps, e.g. a comment holding attributes)."""
    found: dict[str, list[int]] = {" send=": [], " recv=": [], " srcoff=": [], " dstoff=": []}
    for i in range(1, len(tokens0), 2):
        label = tokens0[i - 1]
        for suffix, lst in found.items():
            if label.endswith(suffix):
                lst.append(slot.get(i, -1))
    nsteps = sum(len(t) for t in tbs0)
    if [len(v) for v in found.values()] != [len(tbs0)] * 2 + [nsteps] * 2:
        return None
    send_at, recv_at = found[" send="], found[" recv="]
    srcoff_at, dstoff_at = iter(found[" srcoff="]), iter(found[" dstoff="])
    return [[(send_at[tb], recv_at[tb], next(srcoff_at), next(dstoff_at)) for _ in t]
            for tb, t in enumerate(tbs0)]  # fmt: skip


class _Columns:
    """Rank 0's steps as columns, so a translate's steps are built by one `map` over them (a
    loop over steps was a fifth of a read-back). Rank 0's field values are shared; the moved
    ones (send, recv, srcoff, dstoff) come from one table of int objects, so equal values are
    one object (a 512-rank ring file: 15 MB of ints otherwise)."""

    def __init__(self, tbs0: list[list[XStep]], where: list[list[tuple[int, int, int, int]]],
                 n: int) -> None:  # fmt: skip
        flat = [x for t in tbs0 for x in t]
        self.bounds = list(accumulate((len(t) for t in tbs0), initial=0))
        self.fixed = [[getattr(x, f) for x in flat] for f in _FIXED]
        at = np.array([w for rows in where for w in rows], dtype=np.int64).reshape(-1, 4)
        base = np.array([[x.send, x.recv, x.srcoff, x.dstoff] for x in flat],
                        dtype=np.int64).reshape(-1, 4)  # fmt: skip
        self.keep, self.at, self.base = at < 0, np.maximum(at, 0), base
        self.lo, self.hi = -1, max(int(base.max(initial=0)), n) + 1
        self.ints = np.array(range(self.lo, self.hi), dtype=object)
        self.cap = max(1 << 16, 2 * len(flat))  # the table's largest extent

    def moved(self, want: np.ndarray, r: int) -> list[list[XStep]]:
        """Rank r's steps: rank 0's with send, recv, srcoff, dstoff moved to `want`'s values."""
        vals = np.where(self.keep, self.base, want[self.at]) if len(want) else self.base
        top = int(vals.max(initial=0)) + 1
        if top > self.hi and top - self.lo <= self.cap:  # a slot rank 0 does not use
            self.ints = np.concatenate([self.ints, np.array(range(self.hi, top), dtype=object)])
            self.hi = top
        if vals.size and (int(vals.min()) < self.lo or top > self.hi):
            send, recv, srcoff, dstoff = (vals[:, k].tolist() for k in range(4))
        else:
            send, recv, srcoff, dstoff = (self.ints[vals[:, k] - self.lo].tolist()
                                          for k in range(4))  # fmt: skip
        tb, idx, typ, srcbuf, dstbuf, cnt, depid, deps, hasdep, chan = self.fixed
        steps = list(map(XStep, repeat(r, len(tb)), tb, idx, typ, srcbuf, srcoff, dstbuf, dstoff,
                         cnt, depid, deps, hasdep, chan, send, recv))  # fmt: skip
        b = self.bounds
        return [steps[b[i] : b[i + 1]] for i in range(len(b) - 1)]


_FIXED = ("tb", "idx", "type", "srcbuf", "dstbuf", "cnt", "depid", "deps", "hasdep", "chan")


__all__ = ["Translator", "split_gpus", "translated_gpus", "variables"]
