"""MSCCL XML export and import of the schedule IR, in the format msccl-executor-nccl reads.

Format (msccl-executor-nccl src/misc/msccl/msccl_parser.cc; msccl-tools msccl/language/ir.py):
<algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
  <gpu id i_chunks o_chunks s_chunks>
    <tb id send recv chan>
      <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>
The executor reads every listed attribute and fails when one is missing. maxBytes 0 means no
upper limit (its scheduler tests `maxBytes == 0 || nBytes <= maxBytes`). Limits from its
msccl_struct.h: 256 steps per threadblock, 32 threadblocks per channel, cnt < 72.

Lowering decisions:
- One threadblock per (send peer, recv peer, channel): each connection (peer, channel) is served
  by exactly one threadblock per rank, and a rank's send and receive streams on a channel are
  paired into shared threadblocks (most-forwarded pairs first); local copies get their own.
- Steps everywhere follow one topological order of the transfers, so the k-th send on a
  connection meets the k-th receive and no threadblock waits on a later step (deadlock-free).
- The input buffer is never written. A received chunk goes to its output slot when the rank
  must output it, else to a scratch slot; chunks that end elsewhere are copied (cpy) to the
  output at the end. The same steps are thus correct in place (input aliased into output) too,
  except for alltoall, where in place would overwrite data not yet sent.
- An IR dependency on a transfer that does not touch a rank is replaced, on that rank, by the
  nearest ancestors that do; these are the orderings a rank can enforce (depid/deps). Several
  dependencies become nop steps carrying one each, before the step that carries the last, as
  msccl-tools emits them; `s` counts those nops and `deps` names a step by its `s`.
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..api.common import Collective
from .check import ScheduleError, check_schedule, topological_order
from .ir import Schedule, Transfer

MAX_STEPS = 256
MAX_TB_PER_CHANNEL = 32
MAX_COUNT = 71  # cnt must stay below MSCCL_MAX_COUNT = 72
PROTOCOLS = ("Simple", "LL", "LL128")
SEND_TYPES = {"s", "rcs", "rrs", "rrcs"}
RECV_TYPES = {"r", "rcs", "rrs", "rrc", "rrcs"}
STEP_TYPES = SEND_TYPES | RECV_TYPES | {"cpy", "re", "nop"}
ALGO_ATTRS = (
    "name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
    "minBytes", "maxBytes",
)  # fmt: skip
GPU_ATTRS = ("id", "i_chunks", "o_chunks", "s_chunks")
TB_ATTRS = ("id", "send", "recv", "chan")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")

Loc = tuple[str, int]  # (buffer "i"/"o"/"s", chunk offset)


class MscclFormatError(ValueError):
    """Malformed or unsupported MSCCL XML, or a schedule the executor's limits cannot hold."""


class _Layout:
    """Where each chunk of the collective's chunk space lives in a rank's i/o buffers."""

    def __init__(self, coll: Collective, n: int, c: int, root: int = 0) -> None:
        self.coll, self.n, self.c, self.root = coll, n, c, root
        if coll in (Collective.ALLGATHER,):
            self.i_chunks, self.o_chunks = c, n * c
        elif coll == Collective.REDUCESCATTER:
            self.i_chunks, self.o_chunks = n * c, c
        elif coll == Collective.ALLTOALL:
            self.i_chunks, self.o_chunks = n * c, n * c
        else:
            self.i_chunks, self.o_chunks = c, c

    def input_off(self, r: int, k: int) -> int | None:
        n, c, coll = self.n, self.c, self.coll
        if coll == Collective.ALLGATHER:
            return k - r * c if k // c == r else None
        if coll in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
            return k
        if coll == Collective.ALLTOALL:
            return k - r * n * c if k // (n * c) == r else None
        return k if r == self.root else None

    def output_off(self, r: int, k: int) -> int | None:
        n, c, coll = self.n, self.c, self.coll
        if coll == Collective.REDUCESCATTER:
            return k - r * c if k // c == r else None
        if coll == Collective.ALLTOALL:
            s, d, j = k // (n * c), (k // c) % n, k % c
            return s * c + j if d == r else None
        return k

    def input_chunk(self, r: int, off: int) -> int | None:
        """Inverse of input_off: which chunk rank r's input slot holds at the start."""
        n, c, coll = self.n, self.c, self.coll
        if coll == Collective.ALLGATHER:
            return r * c + off
        if coll == Collective.ALLTOALL:
            return r * n * c + off
        if coll == Collective.BROADCAST:
            return off if r == self.root else None
        return off

    def output_chunk(self, r: int, off: int) -> int:
        n, c, coll = self.n, self.c, self.coll
        if coll == Collective.REDUCESCATTER:
            return r * c + off
        if coll == Collective.ALLTOALL:
            s, j = divmod(off, c)
            return (s * n + r) * c + j
        return off


# ---------------------------------------------------------------- export


@dataclass(eq=False)
class _Step:
    rank: int
    stream: tuple[str, int, int]  # ("send", peer, chan) / ("recv", peer, chan) / ("copy", -1, 0)
    key: tuple[int, int]  # global order
    type: str
    src: Loc
    dst: Loc
    cnt: int
    preds: set[_Step] = field(default_factory=set)  # steps on the same rank to wait for
    tb: int = -1
    index: int = -1
    hasdep: bool = False


def _runs(locs: list[Loc | None]) -> Iterator[tuple[int, int]]:
    """Split positions into maximal runs whose locations are consecutive in one buffer."""
    start = 0
    for i in range(1, len(locs) + 1):
        a, b = locs[i - 1], locs[i] if i < len(locs) else None
        if (
            i == len(locs)
            or a is None
            or b is None
            or b != (a[0], a[1] + 1)
            or i - start >= MAX_COUNT
        ):
            yield start, i - start
            start = i


def to_msccl_xml(
    schedule: Schedule,
    *,
    name: str,
    proto: str,
    nchannels: int | None = None,
    min_bytes: int = 0,
    max_bytes: int | None = None,
    inplace: bool = False,
) -> str:
    """Lower a checked schedule to an MSCCL algorithm file (see the module docstring)."""
    if proto not in PROTOCOLS:
        raise MscclFormatError(f"proto {proto!r} is not one of {', '.join(PROTOCOLS)}")
    if min_bytes < 0 or (max_bytes is not None and max_bytes < max(min_bytes, 1)):
        raise MscclFormatError(f"byte range {min_bytes}..{max_bytes} is empty or negative")
    s = schedule
    coll = Collective(s.collective)
    if inplace and coll == Collective.ALLTOALL:
        raise MscclFormatError("an in-place alltoall would overwrite data before it is sent")
    check_schedule(s)
    lay = _Layout(coll, s.nranks, s.chunks_per_rank, s.root)
    order = topological_order(s)
    pos = {t: p for p, t in enumerate(order)}
    loc: dict[tuple[int, int], Loc] = {}
    for r in range(s.nranks):
        for k in range(s.total_chunks):
            off = lay.input_off(r, k)
            if off is not None:
                loc[(r, k)] = ("i", off)
    scratch: list[dict[int, int]] = [{} for _ in range(s.nranks)]
    last_write: dict[tuple[int, int], _Step] = {}
    steps_of: dict[tuple[int, int], list[_Step]] = {}  # (transfer, rank) -> its steps there
    near: dict[tuple[int, int], frozenset[_Step]] = {}
    steps: list[_Step] = []

    def local_preds(t: int, rank: int) -> set[_Step]:
        """Steps on `rank` of the nearest ancestors of transfer t that touch `rank`."""
        out: set[_Step] = set()
        for d in s.transfers[t].deps:
            if (d, rank) in steps_of:
                out.update(steps_of[(d, rank)])
            else:
                out |= near_of(d, rank)
        return out

    def near_of(t: int, rank: int) -> frozenset[_Step]:
        got = near.get((t, rank))
        if got is None:
            got = frozenset(local_preds(t, rank))
            near[(t, rank)] = got
        return got

    def dest(r: int, k: int) -> Loc:
        off = lay.output_off(r, k)
        if off is not None:
            return ("o", off)
        slot = scratch[r].setdefault(k, len(scratch[r]))
        return ("s", slot)

    for t in order:
        tr = s.transfers[t]
        send_preds, recv_preds = local_preds(t, tr.src), local_preds(t, tr.dst)
        ks = list(range(tr.chunk, tr.chunk + tr.count))
        for k in ks:  # scratch slots of one transfer are allocated together, consecutively
            dest(tr.dst, k)
        src_locs = [loc.get((tr.src, k)) for k in ks]
        dst_locs: list[Loc | None] = [dest(tr.dst, k) for k in ks]
        cur_locs = [loc.get((tr.dst, k)) for k in ks]
        # split where any of the location sequences breaks
        cuts = {0, len(ks)}
        for seq in (src_locs, dst_locs, cur_locs) if tr.reduce else (src_locs, dst_locs):
            for a, n in _runs(seq):
                cuts.update((a, a + n))
        bounds = sorted(cuts)
        for piece, (a, b) in enumerate(itertools.pairwise(bounds)):
            src_loc, dst_loc = src_locs[a], dst_locs[a]
            assert src_loc is not None and dst_loc is not None  # guaranteed by check_schedule
            key = (pos[t], piece)
            snd = _Step(tr.src, ("send", tr.dst, tr.channel), key, "s", src_loc, dst_loc, b - a)
            snd.preds = set(send_preds)
            if tr.reduce:
                cur = cur_locs[a]
                assert cur is not None
                rcv = _Step(tr.dst, ("recv", tr.src, tr.channel), key, "rrc", cur, dst_loc, b - a)
            else:
                rcv = _Step(tr.dst, ("recv", tr.src, tr.channel), key, "r", src_loc, dst_loc, b - a)
            rcv.preds = set(recv_preds)
            steps += [snd, rcv]
            steps_of.setdefault((t, tr.src), []).append(snd)
            steps_of.setdefault((t, tr.dst), []).append(rcv)
            for k in range(tr.chunk + a, tr.chunk + b):
                loc[(tr.dst, k)] = dst_locs[k - tr.chunk]  # type: ignore[assignment]
                last_write[(tr.dst, k)] = rcv

    # Final copies to the output for chunks that ended elsewhere.
    n_copy = len(order)
    for r in range(s.nranks):
        pend: list[tuple[int, Loc, Loc]] = []
        for k in range(s.total_chunks):
            off = lay.output_off(r, k)
            if off is None or loc.get((r, k)) in (None, ("o", off)):
                continue
            pend.append((k, loc[(r, k)], ("o", off)))
        i = 0
        while i < len(pend):
            j = i + 1
            while (
                j < len(pend)
                and j - i < MAX_COUNT
                and pend[j][1] == (pend[i][1][0], pend[i][1][1] + j - i)
                and pend[j][2] == ("o", pend[i][2][1] + j - i)
            ):
                j += 1
            cp = _Step(r, ("copy", -1, 0), (n_copy, i), "cpy", pend[i][1], pend[i][2], j - i)
            cp.preds = {
                last_write[(r, pend[m][0])] for m in range(i, j) if (r, pend[m][0]) in last_write
            }
            steps.append(cp)
            i = j

    return _emit(s, steps, lay, name, proto, nchannels, min_bytes, max_bytes, inplace, scratch)


def _pair_streams(
    steps: list[_Step], rank: int
) -> tuple[dict[tuple[str, int, int], int], list[tuple[int, int, int]]]:
    """Threadblock per (send peer, recv peer, channel): pair a rank's streams per channel."""
    sends: dict[int, set[int]] = defaultdict(set)
    recvs: dict[int, set[int]] = defaultdict(set)
    copies = False
    affinity: dict[tuple[int, int, int], int] = defaultdict(int)
    for st in steps:
        kind, peer, chan = st.stream
        if kind == "send":
            sends[chan].add(peer)
            for pr in st.preds:
                if pr.stream[0] == "recv" and pr.stream[2] == chan:
                    affinity[(chan, pr.stream[1], peer)] += 1
        elif kind == "recv":
            recvs[chan].add(peer)
        else:
            copies = True
    tbs: list[tuple[int, int, int]] = []  # (send, recv, chan)
    for chan in sorted(set(sends) | set(recvs)):
        if len(sends[chan]) > MAX_TB_PER_CHANNEL or len(recvs[chan]) > MAX_TB_PER_CHANNEL:
            raise MscclFormatError(
                f"gpu {rank} talks to {max(len(sends[chan]), len(recvs[chan]))} peers on channel "
                f"{chan}; the executor allows {MAX_TB_PER_CHANNEL} (spread transfers over channels)"
            )
        free_s, free_r = set(sends[chan]), set(recvs[chan])
        ranked = sorted(
            ((-cnt, q, p) for (c, q, p), cnt in affinity.items() if c == chan), key=lambda x: x
        )
        for _, q, p in ranked:
            if q in free_r and p in free_s:
                tbs.append((p, q, chan))
                free_r.discard(q)
                free_s.discard(p)
        for p, q in zip(sorted(free_s), sorted(free_r), strict=False):
            tbs.append((p, q, chan))
        ns = min(len(free_s), len(free_r))
        tbs += [(p, -1, chan) for p in sorted(free_s)[ns:]]
        tbs += [(-1, q, chan) for q in sorted(free_r)[ns:]]
    if copies:
        tbs.append((-1, -1, 0))
    tbs.sort()
    out: dict[tuple[str, int, int], int] = {}
    for i, (p, q, chan) in enumerate(tbs):
        if p >= 0:
            out[("send", p, chan)] = i
        if q >= 0:
            out[("recv", q, chan)] = i
        if p < 0 and q < 0:
            out[("copy", -1, 0)] = i
    return out, tbs


def _emit(
    s: Schedule,
    steps: list[_Step],
    lay: _Layout,
    name: str,
    proto: str,
    nchannels: int | None,
    min_bytes: int,
    max_bytes: int | None,
    inplace: bool,
    scratch: list[dict[int, int]],
) -> str:
    by_rank: list[list[_Step]] = [[] for _ in range(s.nranks)]
    for st in steps:
        by_rank[st.rank].append(st)
    tb_meta: list[list[tuple[int, int, int]]] = []
    items_of: list[dict[int, list[tuple[str, _Step | None, _Step | None]]]] = []
    used_chan = 0
    for r in range(s.nranks):
        tb_of, tb_list = _pair_streams(by_rank[r], r)
        used_chan = max([used_chan, *(c + 1 for _, _, c in tb_list)])
        tb_meta.append(tb_list)
        per_tb: dict[int, list[_Step]] = defaultdict(list)
        for st in by_rank[r]:
            st.tb = tb_of[st.stream]
            per_tb[st.tb].append(st)
        items: dict[int, list[tuple[str, _Step | None, _Step | None]]] = {}
        for tb, members in per_tb.items():
            members.sort(key=lambda x: x.key)
            for i, st in enumerate(members):
                st.index = i  # provisional: position among real steps
            items[tb] = []
        items_of.append(items)
        # Which step each step must wait for, per other threadblock: the latest one suffices.
        for tb, members in per_tb.items():
            covered: dict[int, int] = {}
            for st in members:
                latest: dict[int, _Step] = {}
                for p in st.preds:
                    if p.tb == tb:
                        continue  # earlier in the same threadblock: implied by order
                    if p.tb not in latest or p.index > latest[p.tb].index:
                        latest[p.tb] = p
                deps = sorted(
                    (p for p in latest.values() if covered.get(p.tb, -1) < p.index),
                    key=lambda x: (x.tb, x.index),
                )
                for p in deps:
                    covered[p.tb] = p.index
                    p.hasdep = True
                for p in deps[:-1]:
                    items[tb].append(("nop", None, p))
                items[tb].append(("step", st, deps[-1] if deps else None))
    # Final indices count the nops.
    for r, items in enumerate(items_of):
        for tb, lst in items.items():
            if len(lst) > MAX_STEPS:
                raise MscclFormatError(
                    f"gpu {r} tb {tb} needs {len(lst)} steps; the executor allows {MAX_STEPS} "
                    f"(use fewer chunks per rank or more channels)"
                )
            for i, (_, real, _) in enumerate(lst):
                if real is not None:
                    real.index = i
    if nchannels is None:
        nchannels = max(used_chan, 1)
    elif nchannels < used_chan:
        raise MscclFormatError(f"nchannels={nchannels} but the schedule uses {used_chan} channels")
    algo = ET.Element("algo")
    attrs = {
        "name": name,
        "proto": proto,
        "nchannels": nchannels,
        "nchunksperloop": max(lay.i_chunks, lay.o_chunks),
        "ngpus": s.nranks,
        "coll": str(Collective(s.collective).value),
        "inplace": int(inplace),
        "outofplace": 1,
        "minBytes": min_bytes,
        "maxBytes": 0 if max_bytes is None else max_bytes,
    }
    for k in ALGO_ATTRS:
        algo.set(k, str(attrs[k]))
    for r in range(s.nranks):
        gpu = ET.SubElement(algo, "gpu")
        for k, v in zip(GPU_ATTRS, (r, lay.i_chunks, lay.o_chunks, len(scratch[r])), strict=True):
            gpu.set(k, str(v))
        for tb, tb_vals in enumerate(tb_meta[r]):
            tbe = ET.SubElement(gpu, "tb")
            for k, v in zip(TB_ATTRS, (tb, *tb_vals), strict=True):
                tbe.set(k, str(v))
            for i, (_kind, step, dep) in enumerate(items_of[r].get(tb, [])):
                e = ET.SubElement(tbe, "step")
                if step is None:
                    vals: tuple[object, ...] = (i, "nop", "i", -1, "o", -1, 0)
                    has = 0
                else:
                    vals = (i, step.type, *step.src, *step.dst, step.cnt)
                    has = int(step.hasdep)
                dep_vals = (dep.tb, dep.index) if dep is not None else (-1, -1)
                for k, w in zip(STEP_ATTRS, (*vals, *dep_vals, has), strict=True):
                    e.set(k, str(w))
    ET.indent(algo, space="  ")
    # msccl-tools writes empty elements as "<step .../>"; keep that exact spelling.
    return ET.tostring(algo, encoding="unicode").replace(" />", "/>") + "\n"


# ---------------------------------------------------------------- import


def _int(elem: ET.Element, attr: str, where: str, lo: int | None = None) -> int:
    raw = elem.get(attr)
    if raw is None:
        raise MscclFormatError(f"{where}: missing attribute {attr!r}")
    try:
        val = int(raw)
    except ValueError:
        raise MscclFormatError(f"{where}: attribute {attr}={raw!r} is not an integer") from None
    if lo is not None and val < lo:
        raise MscclFormatError(f"{where}: attribute {attr}={val} must be >= {lo}")
    return val


def _str(elem: ET.Element, attr: str, where: str, allowed: tuple[str, ...] | set[str]) -> str:
    raw = elem.get(attr)
    if raw is None:
        raise MscclFormatError(f"{where}: missing attribute {attr!r}")
    if raw not in allowed:
        raise MscclFormatError(
            f"{where}: {attr}={raw!r} is not one of {', '.join(sorted(allowed))}"
        )
    return raw


@dataclass
class _XStep:
    gpu: int
    tb: int
    idx: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: int
    chan: int
    send: int
    recv: int

    @property
    def where(self) -> str:
        return f"gpu {self.gpu} tb {self.tb} step {self.idx}"


_Gpu = tuple[dict[str, int], list[list[_XStep]]]  # buffer sizes, threadblocks' steps


def _parse(text: str) -> tuple[dict[str, str], list[_Gpu], int]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise MscclFormatError(f"not well-formed XML: {exc}") from None
    if root.tag != "algo":
        raise MscclFormatError(f"root element is <{root.tag}>, expected <algo>")
    for a in ALGO_ATTRS:
        if a not in root.attrib:
            raise MscclFormatError(f"<algo>: missing attribute {a!r} (the executor requires it)")
    ngpus = _int(root, "ngpus", "<algo>", 1)
    nch = _int(root, "nchannels", "<algo>", 1)
    gpus: dict[int, _Gpu] = {}
    for g_el in root:
        if g_el.tag != "gpu":
            raise MscclFormatError(f"<algo> contains <{g_el.tag}>, expected <gpu>")
        gid = _int(g_el, "id", "<gpu>", 0)
        where = f"<gpu id={gid}>"
        if gid >= ngpus or gid in gpus:
            raise MscclFormatError(f"{where}: id is duplicated or not below ngpus={ngpus}")
        sizes = {a: _int(g_el, a, where, 0) for a in GPU_ATTRS[1:]}
        tbs: dict[int, list[_XStep]] = {}
        for tb_el in g_el:
            if tb_el.tag != "tb":
                raise MscclFormatError(f"{where} contains <{tb_el.tag}>, expected <tb>")
            tid = _int(tb_el, "id", f"{where} <tb>", 0)
            tw = f"gpu {gid} tb {tid}"
            if tid in tbs:
                raise MscclFormatError(f"{tw}: duplicate threadblock id")
            send = _int(tb_el, "send", tw, -1)
            recv = _int(tb_el, "recv", tw, -1)
            chan = _int(tb_el, "chan", tw, 0)
            if gid in (send, recv) or send >= ngpus or recv >= ngpus:
                raise MscclFormatError(f"{tw}: peers send={send} recv={recv} invalid for gpu {gid}")
            if chan >= nch:
                raise MscclFormatError(f"{tw}: chan={chan} is not below nchannels={nch}")
            lst: list[_XStep] = []
            for i, st_el in enumerate(tb_el):
                sw = f"{tw} step {i}"
                if st_el.tag != "step":
                    raise MscclFormatError(f"{tw} contains <{st_el.tag}>, expected <step>")
                if _int(st_el, "s", sw, 0) != i:
                    raise MscclFormatError(
                        f"{sw}: s={st_el.get('s')} does not match its position {i}"
                    )
                typ = _str(st_el, "type", sw, STEP_TYPES)
                x = _XStep(
                    gid, tid, i, typ,
                    _str(st_el, "srcbuf", sw, ("i", "o", "s")), _int(st_el, "srcoff", sw, -1),
                    _str(st_el, "dstbuf", sw, ("i", "o", "s")), _int(st_el, "dstoff", sw, -1),
                    _int(st_el, "cnt", sw, 0), _int(st_el, "depid", sw, -1),
                    _int(st_el, "deps", sw, -1), _int(st_el, "hasdep", sw, 0), chan, send, recv,
                )  # fmt: skip
                if x.hasdep > 1:
                    raise MscclFormatError(f"{sw}: hasdep={x.hasdep} must be 0 or 1")
                if typ in SEND_TYPES and send < 0:
                    raise MscclFormatError(f"{sw}: type {typ!r} sends but the tb has send=-1")
                if typ in RECV_TYPES and recv < 0:
                    raise MscclFormatError(f"{sw}: type {typ!r} receives but the tb has recv=-1")
                if typ != "nop" and x.cnt < 1:
                    raise MscclFormatError(f"{sw}: cnt={x.cnt} must be >= 1")
                _bounds(x, sizes)
                lst.append(x)
            tbs[tid] = lst
        if sorted(tbs) != list(range(len(tbs))):
            raise MscclFormatError(
                f"{where}: threadblock ids must be 0..{len(tbs) - 1} without gaps"
            )
        gpus[gid] = (sizes, [tbs[i] for i in range(len(tbs))])
    missing = sorted(set(range(ngpus)) - set(gpus))
    if missing:
        raise MscclFormatError(f"<algo>: ngpus={ngpus} but no <gpu id={missing[0]}>")
    return dict(root.attrib), [gpus[g] for g in range(ngpus)], ngpus


def _bounds(x: _XStep, sizes: dict[str, int]) -> None:
    cap = {"i": sizes["i_chunks"], "o": sizes["o_chunks"], "s": sizes["s_chunks"]}
    local_src = x.type in {"s", "rrs", "rrc", "rrcs", "cpy", "re"}
    local_dst = x.type in {"r", "rcs", "rrc", "rrcs", "cpy", "re"}
    for used, buf, off, what in (
        (local_src, x.srcbuf, x.srcoff, "src"),
        (local_dst, x.dstbuf, x.dstoff, "dst"),
    ):
        if used and not (off >= 0 and off + x.cnt <= cap[buf]):
            raise MscclFormatError(
                f"{x.where}: {what} {buf}[{off}..{off + x.cnt - 1}] outside the {cap[buf]}-chunk "
                f"'{buf}' buffer of gpu {x.gpu}"
            )


_COLLS = {c.value: c for c in Collective}


def from_msccl_xml(text: str) -> Schedule:
    """Read an MSCCL algorithm back into a Schedule (transfers in a topological order)."""
    attrs, gpus, n = _parse(text)
    proto = _str_attr(attrs, "proto", PROTOCOLS)
    coll_name = attrs["coll"]
    if coll_name not in _COLLS:
        raise MscclFormatError(
            f"<algo>: coll={coll_name!r} is not supported (use {', '.join(_COLLS)})"
        )
    coll = _COLLS[coll_name]
    for a in ("nchunksperloop", "minBytes", "maxBytes", "inplace", "outofplace"):
        try:
            int(attrs[a])
        except ValueError:
            raise MscclFormatError(
                f"<algo>: attribute {a}={attrs[a]!r} is not an integer"
            ) from None
    o_chunks = max(sizes["o_chunks"] for sizes, _ in gpus)
    per = n if coll in (Collective.ALLGATHER, Collective.ALLTOALL) else 1
    if o_chunks < per or o_chunks % per:
        raise MscclFormatError(
            f"<algo>: o_chunks={o_chunks} does not fit a {coll_name} on {n} gpus"
        )
    c = o_chunks // per
    tbs = [t for _, g in gpus for t in g]
    root = _broadcast_root(tbs) if coll == Collective.BROADCAST else 0
    lay = _Layout(coll, n, c, root)
    xsteps = [x for t in tbs for x in t]
    match = _match(gpus)
    order = _step_order(gpus, match, xsteps)

    content: dict[tuple[int, str, int], int] = {}
    for g in range(n):
        for off in range(lay.i_chunks):
            k = lay.input_chunk(g, off)
            if k is not None:
                content[(g, "i", off)] = k
    if attrs["inplace"] == "1" and attrs["outofplace"] == "0":
        for g in range(n):  # input aliased into output: the output starts with the input's data
            for k in range(lay.o_chunks):
                ch = lay.output_chunk(g, k)
                if lay.input_off(g, ch) is not None:
                    content[(g, "o", k)] = ch

    def read(x: _XStep, buf: str, off: int) -> list[int]:
        out = []
        for j in range(x.cnt):
            ch = content.get((x.gpu, buf, off + j))
            if ch is None:
                raise MscclFormatError(
                    f"{x.where}: reads {buf}[{off + j}], which holds no data yet"
                )
            out.append(ch)
        return out

    def write(x: _XStep, chunks: list[int]) -> None:
        for j, ch in enumerate(chunks):
            content[(x.gpu, x.dstbuf, x.dstoff + j)] = ch

    key = {id(x): i for i, x in enumerate(xsteps)}
    payload: dict[int, list[int]] = {}
    made: dict[int, list[int]] = {}  # send step -> transfers it starts
    near: dict[int, frozenset[int]] = {}
    transfers: list[Transfer] = []
    pending_deps: dict[int, set[int]] = {}
    preds = _preds(gpus, match)

    def near_preds(x: _XStep, skip: _XStep | None = None) -> set[int]:
        out: set[int] = set()
        for p in preds[key[id(x)]]:
            if p is not skip:
                out |= near[key[id(p)]]
        return out

    for x in order:
        kx = key[id(x)]
        produced: list[int] = []
        if x.type in RECV_TYPES:
            snd = match[kx]
            data = payload[key[id(snd)]]
            reducing = x.type in {"rrs", "rrc", "rrcs"}
            if reducing and read(x, x.srcbuf, x.srcoff) != data:
                raise MscclFormatError(
                    f"{x.where}: reduces {x.srcbuf}[{x.srcoff}] with different chunks"
                )
            deps = near_preds(x, skip=snd)
            for t in made[key[id(snd)]]:
                pending_deps[t] |= deps
            if x.type != "rrs":
                write(x, data)
            produced += made[key[id(snd)]]
        if x.type in SEND_TYPES:
            if x.type == "s":
                data = read(x, x.srcbuf, x.srcoff)
            payload[kx] = data
            rx = match[kx]
            reduce = rx.type in {"rrs", "rrc", "rrcs"}
            base_deps = near_preds(x) | set(produced)
            made[kx] = []
            for first, cnt in _consecutive(data):
                made[kx].append(len(transfers))
                pending_deps[len(transfers)] = set(base_deps)
                transfers.append(Transfer(x.gpu, x.send, data[first], cnt, reduce, (), x.chan))
            produced = list(made[kx])
        if x.type == "cpy":
            write(x, read(x, x.srcbuf, x.srcoff))
        elif x.type == "re":
            raise MscclFormatError(f"{x.where}: local reduce steps ('re') have no IR equivalent")
        near[kx] = frozenset(produced) if produced else frozenset(near_preds(x))
    out = [
        Transfer(
            t.src, t.dst, t.chunk, t.count, t.reduce, tuple(sorted(pending_deps[i])), t.channel
        )
        for i, t in enumerate(transfers)
    ]
    return Schedule(
        name=attrs["name"],
        collective=coll,
        nranks=n,
        chunks_per_rank=c,
        transfers=out,
        root=root,
        protocol=proto,
        channels=int(attrs["nchannels"]),
    )


def _str_attr(attrs: dict[str, str], name: str, allowed: tuple[str, ...]) -> str:
    if attrs[name] not in allowed:
        raise MscclFormatError(f"<algo>: {name}={attrs[name]!r} is not one of {', '.join(allowed)}")
    return attrs[name]


def _consecutive(chunks: list[int]) -> Iterator[tuple[int, int]]:
    start = 0
    for i in range(1, len(chunks) + 1):
        if i == len(chunks) or chunks[i] != chunks[i - 1] + 1:
            yield start, i - start
            start = i


def _broadcast_root(tbs: list[list[_XStep]]) -> int:
    roots = {x.gpu for t in tbs for x in t if x.type == "s" and x.srcbuf == "i"}
    if len(roots) > 1:
        raise MscclFormatError(f"broadcast reads the input of several gpus {sorted(roots)}")
    return roots.pop() if roots else 0


def _match(gpus: list[_Gpu]) -> dict[int, _XStep]:
    """Pair the k-th send on each (gpu, peer, channel) with the k-th receive at the peer."""
    key: dict[int, int] = {}
    i = 0
    for _, g in gpus:
        for t in g:
            for x in t:
                key[id(x)] = i
                i += 1
    sends: dict[tuple[int, int, int], list[_XStep]] = {}
    recvs: dict[tuple[int, int, int], list[_XStep]] = {}
    for _, g in gpus:
        for t in g:
            if not t:
                continue
            x0 = t[0]
            for peer, table, kind in ((x0.send, sends, SEND_TYPES), (x0.recv, recvs, RECV_TYPES)):
                if peer < 0:
                    continue
                conn = (x0.gpu, peer, x0.chan) if table is sends else (peer, x0.gpu, x0.chan)
                if conn in table:
                    side = "sending to" if table is sends else "receiving from"
                    raise MscclFormatError(
                        f"gpu {x0.gpu} has two threadblocks {side} gpu {peer} on channel {x0.chan}"
                    )
                table[conn] = [x for x in t if x.type in kind]
    out: dict[int, _XStep] = {}
    for conn in sorted(set(sends) | set(recvs)):
        ss, rr = sends.get(conn, []), recvs.get(conn, [])
        if len(ss) != len(rr):
            src, dst, chan = conn
            raise MscclFormatError(
                f"gpu {src} sends {len(ss)} times to gpu {dst} on channel {chan} but gpu {dst} "
                f"receives {len(rr)} times from it"
            )
        for a, b in zip(ss, rr, strict=True):
            if a.cnt != b.cnt:
                raise MscclFormatError(
                    f"{a.where} sends cnt={a.cnt} but {b.where} receives cnt={b.cnt}"
                )
            out[key[id(a)]] = b
            out[key[id(b)]] = a
    return out


def _preds(gpus: list[_Gpu], match: dict[int, _XStep]) -> list[list[_XStep]]:
    """Per step: what it waits for (previous step in its tb, depid/deps, the matching send)."""
    flat = [x for _, g in gpus for t in g for x in t]
    key = {id(x): i for i, x in enumerate(flat)}
    preds: list[list[_XStep]] = [[] for _ in flat]
    for _, g in gpus:
        for t in g:
            for i, x in enumerate(t):
                px = preds[key[id(x)]]
                if i:
                    px.append(t[i - 1])
                if x.depid >= 0:
                    if x.depid >= len(g) or not 0 <= x.deps < len(g[x.depid]):
                        raise MscclFormatError(
                            f"{x.where}: depends on tb {x.depid} step {x.deps}, which does not exist"
                        )
                    target = g[x.depid][x.deps]
                    if not target.hasdep:
                        raise MscclFormatError(
                            f"{x.where}: depends on {target.where}, which has hasdep=0 and so "
                            f"never signals (deadlock)"
                        )
                    px.append(target)
                if x.type in RECV_TYPES:
                    px.append(match[key[id(x)]])
    return preds


def _step_order(gpus: list[_Gpu], match: dict[int, _XStep], flat: list[_XStep]) -> list[_XStep]:
    preds = _preds(gpus, match)
    key = {id(x): i for i, x in enumerate(flat)}
    indeg = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in flat]
    for i, ps in enumerate(preds):
        for p in ps:
            succ[key[id(p)]].append(i)
    ready = deque(i for i, d in enumerate(indeg) if d == 0)
    out: list[_XStep] = []
    while ready:
        i = ready.popleft()
        out.append(flat[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(out) < len(flat):
        stuck = next(flat[i] for i, d in enumerate(indeg) if d > 0)
        raise MscclFormatError(f"deadlock: {stuck.where} waits on a cycle of steps")
    return out


__all__ = ["MscclFormatError", "ScheduleError", "from_msccl_xml", "to_msccl_xml"]
