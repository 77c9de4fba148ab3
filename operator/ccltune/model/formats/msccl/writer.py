"""MSCCL XML export of the schedule IR, in the format msccl-executor-nccl reads (the reader is
msccl_reader.py).

Format (msccl-executor-nccl src/misc/msccl/msccl_parser.cc; msccl-tools msccl/language/ir.py):
<algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
  <gpu id i_chunks o_chunks s_chunks>
    <tb id send recv chan>
      <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>
The executor reads every listed attribute and fails when one is missing. maxBytes 0 means no
upper limit (its scheduler tests `maxBytes == 0 || nBytes <= maxBytes`). Its limits (steps per
threadblock, threadblocks per channel, channels, XML nodes per rank, cnt) are in msccl_limits.py;
`lower_msccl` measures a schedule against them before anything is written.

Lowering decisions:
- One threadblock per (send peer, recv peer, channel): each connection (peer, channel) is served
  by exactly one threadblock per rank, and a rank's send and receive streams on a channel are
  paired into shared threadblocks (most-forwarded pairs first). Local copies (cpy) run at the
  end of the rank's threadblock with the fewest steps: an extra threadblock would cost an SM.
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
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from ....api.common import Collective
from ....api.errors import InternalError
from ...schedule.check import ScheduleError, check_schedule, topological_order
from ...schedule.ir import Schedule
from .limits import (
    MAX_CHANNELS,
    MAX_COUNT,
    MAX_GPUS,
    MAX_STEPS,
    MAX_TB_PER_CHANNEL,
    MAX_THREADBLOCKS,
    MAX_XML_NODES,
    xml_nodes,
)

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


class MscclFormatError(InternalError):
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
    key: tuple[int, ...]  # order within its threadblock
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
    max_threadblocks: int | None = None,
    max_steps: int = MAX_STEPS,
) -> str:
    """Lower a checked schedule to an MSCCL algorithm file (see the module docstring).

    Raises MscclFormatError when the executor (built with `max_steps` steps per threadblock)
    would reject the file, or when a rank needs more than `max_threadblocks` threadblocks.
    """
    if proto not in PROTOCOLS:
        raise MscclFormatError(f"proto {proto!r} is not one of {', '.join(PROTOCOLS)}")
    if min_bytes < 0 or (max_bytes is not None and max_bytes < max(min_bytes, 1)):
        raise MscclFormatError(f"byte range {min_bytes}..{max_bytes} is empty or negative")
    if inplace and Collective(schedule.collective) == Collective.ALLTOALL:
        raise MscclFormatError("an in-place alltoall would overwrite data before it is sent")
    low = lower_msccl(schedule)
    low.require(max_threadblocks=max_threadblocks, max_steps=max_steps)
    return low.render(name=name, proto=proto, nchannels=nchannels, min_bytes=min_bytes,
                      max_bytes=max_bytes, inplace=inplace)  # fmt: skip


def lower_msccl(schedule: Schedule) -> MscclLowering:
    """Every rank's threadblocks and steps as the file would hold them (nothing rendered)."""
    s = schedule
    coll = Collective(s.collective)
    check_schedule(s)
    lay = _Layout(coll, s.nranks, s.chunks_per_rank, s.root)
    order = topological_order(s)
    pos = {t: p for p, t in enumerate(order)}
    # A threadblock runs its steps in order and a receive blocks it, so steps are ordered by
    # dependency depth (what the simulator runs together stays together), sends first at a
    # depth: in global order alone, a peer's reply would queue behind the receive it does not
    # need (a one-step allgather became two steps deep).
    level = [0] * len(s.transfers)
    for t in order:
        level[t] = 1 + max((level[d] for d in s.transfers[t].deps), default=-1)
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
            snd = _Step(tr.src, ("send", tr.dst, tr.channel), (level[t], 0, pos[t], piece), "s",
                        src_loc, dst_loc, b - a)  # fmt: skip
            key = (level[t], 1, pos[t], piece)
            snd.preds = set(send_preds)
            if tr.reduce:
                cur = cur_locs[a]
                assert cur is not None
                rcv = _Step(tr.dst, ("recv", tr.src, tr.channel), key, "rrc", cur, dst_loc,
                            b - a)  # fmt: skip
            else:
                rcv = _Step(tr.dst, ("recv", tr.src, tr.channel), key, "r", src_loc,
                            dst_loc, b - a)  # fmt: skip
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
            cp = _Step(r, ("copy", -1, 0), (n_copy, 2, 0, i), "cpy", pend[i][1], pend[i][2], j - i)
            cp.preds = {
                last_write[(r, pend[m][0])] for m in range(i, j) if (r, pend[m][0]) in last_write
            }
            steps.append(cp)
            i = j

    return _assign(s, steps, lay, scratch)


def _pair_streams(
    steps: list[_Step], rank: int
) -> tuple[dict[tuple[str, int, int], int], list[tuple[int, int, int]]]:
    """Threadblock per (send peer, recv peer, channel): pair a rank's streams per channel."""
    sends: dict[int, set[int]] = defaultdict(set)
    recvs: dict[int, set[int]] = defaultdict(set)
    copies = False
    affinity: dict[tuple[int, int, int], int] = defaultdict(int)
    load: dict[tuple[str, int, int], int] = defaultdict(int)
    for st in steps:
        kind, peer, chan = st.stream
        load[st.stream] += 1
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
        if chan >= MAX_CHANNELS:
            raise MscclFormatError(
                f"gpu {rank} uses channel {chan}; the executor has {MAX_CHANNELS} (MAXCHANNELS)"
            )
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
    if copies and not tbs:
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
    if copies and ("copy", -1, 0) not in out:
        # Copies come last in key order: appended to the least loaded threadblock, they wait
        # only for receives, which never wait for them (no cycle), and cost no extra SM.
        steps_in = [0] * len(tbs)
        for stream, i in out.items():
            steps_in[i] += load[stream]
        out[("copy", -1, 0)] = min(range(len(tbs)), key=lambda i: (steps_in[i], i))
    return out, tbs


Item = tuple[str, "_Step | None", "_Step | None"]  # ("nop"|"step", the step, its dependency)


@dataclass(eq=False)
class MscclLowering:
    """A schedule lowered to threadblocks and steps per rank, measured against the limits."""

    schedule: Schedule
    layout: _Layout
    scratch: list[dict[int, int]]
    tb_meta: list[list[tuple[int, int, int]]]  # per rank: (send, recv, chan) per threadblock
    items_of: list[dict[int, list[Item]]]  # per rank: threadblock -> its steps in order
    channels_used: int

    @property
    def threadblocks(self) -> int:
        """The most threadblocks (SMs while it runs) any rank needs."""
        return max((len(tbs) for tbs in self.tb_meta), default=0)

    @property
    def max_steps(self) -> int:
        return max((len(lst) for items in self.items_of for lst in items.values()), default=0)

    @property
    def max_xml_nodes(self) -> int:
        """The most XML nodes the executor's parser holds when it loads one rank."""
        n = self.schedule.nranks
        return max((xml_nodes(n, len(tbs), sum(len(x) for x in items.values()))
                    for tbs, items in zip(self.tb_meta, self.items_of, strict=True)), default=0)  # fmt: skip

    @property
    def chunks_per_loop(self) -> int:
        return max(self.layout.i_chunks, self.layout.o_chunks)

    def require(self, *, max_threadblocks: int | None = None, max_steps: int = MAX_STEPS) -> None:
        """Raise MscclFormatError naming the first limit the file would break."""
        n = self.schedule.nranks
        if n > MAX_GPUS:
            raise MscclFormatError(f"{n} gpus; the executor's parser holds {MAX_GPUS} <gpu> nodes")
        for r, items in enumerate(self.items_of):
            for tb, lst in items.items():
                if len(lst) > max_steps:
                    raise MscclFormatError(
                        f"gpu {r} tb {tb} needs {len(lst)} steps; the executor allows {max_steps} "
                        f"(use fewer chunks per rank or more channels)"
                    )
        cap = MAX_THREADBLOCKS if max_threadblocks is None else max_threadblocks
        for r, tbs in enumerate(self.tb_meta):
            if len(tbs) > cap:
                raise MscclFormatError(
                    f"gpu {r} needs {len(tbs)} threadblocks; the limit is {cap}"
                    + (" (the SM budget)" if max_threadblocks is not None else "")
                )
        if self.max_xml_nodes > MAX_XML_NODES:
            raise MscclFormatError(
                f"a rank's part of the file has {self.max_xml_nodes} XML nodes; the executor's "
                f"parser holds {MAX_XML_NODES} (use fewer chunks per rank)"
            )

    def render(self, *, name: str, proto: str, nchannels: int | None = None, min_bytes: int = 0,
               max_bytes: int | None = None, inplace: bool = False) -> str:  # fmt: skip
        s, lay = self.schedule, self.layout
        if nchannels is None:
            nchannels = max(self.channels_used, 1)
        elif nchannels < self.channels_used:
            raise MscclFormatError(
                f"nchannels={nchannels} but the schedule uses {self.channels_used} channels"
            )
        algo = ET.Element("algo")
        attrs = {
            "name": name,
            "proto": proto,
            "nchannels": nchannels,
            "nchunksperloop": self.chunks_per_loop,
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
            vals = (r, lay.i_chunks, lay.o_chunks, len(self.scratch[r]))
            for k, v in zip(GPU_ATTRS, vals, strict=True):
                gpu.set(k, str(v))
            for tb, tb_vals in enumerate(self.tb_meta[r]):
                tbe = ET.SubElement(gpu, "tb")
                for k, v in zip(TB_ATTRS, (tb, *tb_vals), strict=True):
                    tbe.set(k, str(v))
                for i, (_kind, step, dep) in enumerate(self.items_of[r].get(tb, [])):
                    e = ET.SubElement(tbe, "step")
                    if step is None:
                        row: tuple[object, ...] = (i, "nop", "i", -1, "o", -1, 0)
                        has = 0
                    else:
                        row = (i, step.type, *step.src, *step.dst, step.cnt)
                        has = int(step.hasdep)
                    dep_vals = (dep.tb, dep.index) if dep is not None else (-1, -1)
                    for k, w in zip(STEP_ATTRS, (*row, *dep_vals, has), strict=True):
                        e.set(k, str(w))
        ET.indent(algo, space="  ")
        # msccl-tools writes empty elements as "<step .../>"; keep that exact spelling.
        return ET.tostring(algo, encoding="unicode").replace(" />", "/>") + "\n"


def _assign(s: Schedule, steps: list[_Step], lay: _Layout,
            scratch: list[dict[int, int]]) -> MscclLowering:  # fmt: skip
    """Threadblocks per rank, each one's steps in order with the nops its dependencies need."""
    by_rank: list[list[_Step]] = [[] for _ in range(s.nranks)]
    for st in steps:
        by_rank[st.rank].append(st)
    tb_meta: list[list[tuple[int, int, int]]] = []
    items_of: list[dict[int, list[Item]]] = []
    used_chan = 0
    for r in range(s.nranks):
        tb_of, tb_list = _pair_streams(by_rank[r], r)
        used_chan = max([used_chan, *(c + 1 for _, _, c in tb_list)])
        tb_meta.append(tb_list)
        per_tb: dict[int, list[_Step]] = defaultdict(list)
        for st in by_rank[r]:
            st.tb = tb_of[st.stream]
            per_tb[st.tb].append(st)
        items: dict[int, list[Item]] = {}
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
    for items in items_of:
        for lst in items.values():
            for i, (_, real, _) in enumerate(lst):
                if real is not None:
                    real.index = i
    return MscclLowering(s, lay, scratch, tb_meta, items_of, used_chan)


__all__ = ["MscclFormatError", "MscclLowering", "ScheduleError", "lower_msccl", "to_msccl_xml"]
