"""MSCCL XML export of the schedule IR, in the format msccl-executor-nccl reads (the reader is
reader.py).

Format (msccl-executor-nccl src/misc/msccl/msccl_parser.cc; msccl-tools msccl/language/ir.py):
<algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
  <gpu id i_chunks o_chunks s_chunks>
    <tb id send recv chan>
      <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>
The executor reads every listed attribute and fails when one is missing. maxBytes 0 means no
upper limit (its scheduler tests `maxBytes == 0 || nBytes <= maxBytes`). Its limits (steps per
threadblock, threadblocks per channel, channels, XML nodes per rank, cnt) are in limits.py;
`lower_msccl` measures a schedule against them before anything is written.

Lowering decisions:
- One threadblock per stream (send peer, channel) or (recv peer, channel), as msccl-tools'
  tb_assignment makes one per (send, recv, channel): a threadblock runs its steps in order and
  a receive blocks it, so a send placed after an unrelated receive would wait for it. A send
  and a receive stream of one channel share a threadblock (one SM less) only where that adds
  no wait: every receive placed before a send is one it depends on (a receive and the sends
  forwarding it, a ring), and no more sends are queued before a receive than the connection's
  FIFO holds (FIFO_CHUNKS; a send blocks while it is full, and two threadblocks that both send
  first would deadlock). Over the SM budget (`max_threadblocks`), more pairs are merged, the
  fewest waits first, or (`pairing="balanced"`) the heaviest stream with the lightest first,
  none that may block before all that cannot. Each connection (peer, channel) is served by
  exactly one threadblock per rank. Local copies (cpy) ride on the rank's threadblocks: an
  extra threadblock would cost an SM. Those that wait for a receive run at the end of the
  threadblock with the fewest steps; those that wait for nothing (an out-of-place AllGather's
  or AlltoAll's own chunks) are dealt chunk by chunk over the threadblocks whose side holds the
  fewest chunks, each before its threadblock's first receive, and over copy-only threadblocks
  (send -1, recv -1) where the SM budget has room (`copy_threadblocks` keeps some from the
  transfers; `_spread_copies`): the read-back charges a copy at its threadblock's rate
  (slicing.CHARGE_LOCAL_STEPS), and on one of its own a copy delays no receive.
- A connection whose threadblock would hold more than the executor's 64 steps is split into
  consecutive parts, each on the same peers on a channel of its own (`lower_msccl`), where
  channels and the SM budget allow; the dependencies stay the same steps'.
- Transfers of a connection that are ready together (they wait for the same steps) and move
  consecutive slots become one step with cnt > 1, when the receiver has a threadblock of its
  own (it drains the FIFO whatever else happens). Fewer steps per threadblock, a smaller file.
- Steps follow one global order, dependency depth with sends first at a depth, so the k-th
  send on a connection meets the k-th receive and no threadblock waits on a later step
  (deadlock-free while sends fit the FIFOs). In global order alone a peer's reply would queue
  behind the receive it does not need (a one-step allgather became two steps deep). Ordering
  by the engine's simulated times alone was tried: 1.5-2x better on merged threadblocks for
  AllReduce, 3x worse for AllGather once slicing was modelled, so depth is the default.
  `order="timed"` keys sends at their start and receives at their finish in the schedule's
  simulation (`_time_keys`), then moves sends as "early" does; callers time it beside "early".
  `order="early"` (what the engine lowers) then moves, within a threadblock pairing a send
  stream with a receive stream, each send that waits for nothing outside its threadblock ahead
  of the receives it does not depend on, at most FIFO_CHUNKS chunks ahead (`_sends_early`):
  in depth order such a threadblock alternates send and receive, and each send waits for the
  receive before it. The executor's blocking rules are run on the result (`_deadlocks`); one
  that would deadlock is lowered in depth order instead.
- A schedule made of N translates of root 0's transfers (frames.py) is lowered in each rank's
  frame: steps keyed by the orbit, threadblocks and merge ties by relative peer, fusion within
  one translation block, so rank r's part is rank 0's translated (the simulator then times the
  file through one rank). Where the schedule is exactly its own translate, rank 0 alone is
  lowered and the others are written as its translates (`_lower_orbit`).
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

import bisect
import gc
import heapq
import itertools
import math
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ....api.common import Collective
from ....api.errors import InternalError
from ...schedule.check import ScheduleError, check_schedule, topological_order
from ...schedule.ir import Schedule
from .frames import Frames, find_frames, translates_exactly
from .limits import (
    FIFO_CHUNKS,
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
# How send and receive streams share threadblocks over the SM budget (`_merge`): "forwarding"
# pairs the sends that forward a receive with it; "balanced" pairs heavy streams with light ones
# (fewer steps in the busiest threadblock). Neither wins on every schedule (rail-first p1x4 on
# h800-rail-64 AllGather, 64 MiB: 844 vs 472 us; the relay p1x2 file: 495 vs 515 us), so the
# engine times both files (docs/synthesis.md, "h800-rail-64 against the bound"). "minmax" pairs
# the lightest streams and no more than the budget forces, so heavy streams keep a threadblock
# each: where the other two put two 32-step streams together past MAX_STEPS (the 3-tier
# AllReduce, docs/synthesis.md "The 3-tier fabric (session 7)"), it may still fit.
PAIRINGS = ("forwarding", "balanced", "minmax")
# The order of steps within a threadblock (`_assign`): "depth" (the global key: dependency depth,
# sends first at a depth) or "early" (`_sends_early`: sends that wait for nothing outside their
# threadblock ahead of receives, within the FIFO). "early" is checked by running the file's
# threadblocks as the executor does; one that would deadlock is lowered in "depth" order instead.
# "timed": keys from the engine schedule's own times at one size (`lower_msccl(times=...)`): a
# send at its transfer's start, a receive at its finish, then as "early"; where that would
# deadlock, the time keys alone, then "early" (docs/synthesis.md, "Steps in the schedule's
# time order").
ORDERS = ("depth", "early", "timed")
TIME_DIGITS = 3  # time keys round to 1 ns, so translates' float noise leaves ties to the orbit
Times = tuple[list[float], list[float]]  # per transfer: send key, receive key (`_time_keys`)
SPLIT_ROUNDS = 4  # lowerings after the first while splitting connections over MAX_STEPS
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


def step_values(i: int, step: _Step | None, dep: _Step | None) -> tuple[object, ...]:
    """A `<step>`'s attribute values in STEP_ATTRS order (None: a nop holding a dependency)."""
    if step is None:
        row: tuple[object, ...] = (i, "nop", "i", -1, "o", -1, 0)
        has = 0
    else:
        row = (i, step.type, *step.src, *step.dst, step.cnt)
        has = int(step.hasdep)
    dep_vals = (dep.tb, dep.index) if dep is not None else (-1, -1)
    return (*row, *dep_vals, has)


Loc = tuple[str, int]  # (buffer "i"/"o"/"s", chunk offset)
Stream = tuple[str, int, int]  # ("send", peer, chan) / ("recv", peer, chan) / ("copy", -1, 0)
# Final copies that wait for nothing (a rank's own input chunks to the output): spread over
# threadblocks by `_spread_copies`, not one threadblock's "copy" stream.
FREE_COPY: Stream = ("copy", -1, -1)


class MscclFormatError(InternalError):
    """Malformed or unsupported MSCCL XML, or a schedule the executor's limits cannot hold."""


# Enum members as module constants: `_Layout` runs per (rank, chunk), and looking a member up
# on its class costs more than the comparison.
_ALLGATHER, _REDUCESCATTER, _ALLTOALL = (
    Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL,
)  # fmt: skip
_ALLREDUCE, _BROADCAST = Collective.ALLREDUCE, Collective.BROADCAST


class _Layout:
    """Where each chunk of the collective's chunk space lives in a rank's i/o buffers."""

    def __init__(self, coll: Collective, n: int, c: int, root: int = 0) -> None:
        self.coll, self.n, self.c, self.root = coll, n, c, root
        if coll == _ALLGATHER:
            self.i_chunks, self.o_chunks = c, n * c
        elif coll == _REDUCESCATTER:
            self.i_chunks, self.o_chunks = n * c, c
        elif coll == _ALLTOALL:
            self.i_chunks, self.o_chunks = n * c, n * c
        else:
            self.i_chunks, self.o_chunks = c, c

    def input_off(self, r: int, k: int) -> int | None:
        n, c, coll = self.n, self.c, self.coll
        if coll == _ALLGATHER:
            return k - r * c if k // c == r else None
        if coll in (_REDUCESCATTER, _ALLREDUCE):
            return k
        if coll == _ALLTOALL:
            return k - r * n * c if k // (n * c) == r else None
        return k if r == self.root else None

    def output_off(self, r: int, k: int) -> int | None:
        n, c, coll = self.n, self.c, self.coll
        if coll == _REDUCESCATTER:
            return k - r * c if k // c == r else None
        if coll == _ALLTOALL:
            s, d, j = k // (n * c), (k // c) % n, k % c
            return s * c + j if d == r else None
        return k

    def input_offs(self, r: int, k: np.ndarray) -> np.ndarray:
        """`input_off` of each chunk in `k` (-1: None)."""
        n, c, coll = self.n, self.c, self.coll
        if coll == _ALLGATHER:
            return np.where(k // c == r, k - r * c, -1)
        if coll in (_REDUCESCATTER, _ALLREDUCE):
            return k
        if coll == _ALLTOALL:
            return np.where(k // (n * c) == r, k - r * n * c, -1)
        return k if r == self.root else np.full_like(k, -1)

    def output_offs(self, r: int, k: np.ndarray) -> np.ndarray:
        """`output_off` of each chunk in `k` (-1: None)."""
        n, c, coll = self.n, self.c, self.coll
        if coll == _REDUCESCATTER:
            return np.where(k // c == r, k - r * c, -1)
        if coll == _ALLTOALL:
            s, d, j = k // (n * c), (k // c) % n, k % c
            return np.where(d == r, s * c + j, -1)
        return k

    def input_chunk(self, r: int, off: int) -> int | None:
        """Inverse of input_off: which chunk rank r's input slot holds at the start."""
        n, c, coll = self.n, self.c, self.coll
        if coll == _ALLGATHER:
            return r * c + off
        if coll == _ALLTOALL:
            return r * n * c + off
        if coll == _BROADCAST:
            return off if r == self.root else None
        return off

    def output_chunk(self, r: int, off: int) -> int:
        n, c, coll = self.n, self.c, self.coll
        if coll == _REDUCESCATTER:
            return r * c + off
        if coll == _ALLTOALL:
            s, j = divmod(off, c)
            return (s * n + r) * c + j
        return off


# ---------------------------------------------------------------- export


@dataclass(eq=False)
class _Step:
    rank: int
    stream: Stream
    key: tuple[float, ...]  # order within its threadblock
    type: str
    src: Loc
    dst: Loc
    cnt: int
    # Per receive stream on this rank: the last of its receives this step depends on.
    after: dict[Stream, int] = field(default_factory=dict)
    twin: _Step | None = None  # a send's receive
    preds: set[_Step] = field(default_factory=set)  # steps on the same rank to wait for
    tb: int = -1
    index: int = -1
    hasdep: bool = False
    chunk: int = -1  # the first chunk it moves (-1: a copy)


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
    pairing: str = "forwarding",
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
    low = lower_msccl(schedule, max_threadblocks=max_threadblocks, max_steps=max_steps,
                      pairing=pairing)  # fmt: skip
    low.require(max_threadblocks=max_threadblocks, max_steps=max_steps)
    return low.render(name=name, proto=proto, nchannels=nchannels, min_bytes=min_bytes,
                      max_bytes=max_bytes, inplace=inplace)  # fmt: skip


def lower_msccl(schedule: Schedule, *, max_threadblocks: int | None = None,
                max_steps: int = MAX_STEPS, pairing: str = "forwarding",
                order: str = "depth",
                times: tuple[Sequence[float], Sequence[float]] | None = None,
                copy_threadblocks: int = 0, proven: bool = False) -> MscclLowering:  # fmt: skip
    """Every rank's threadblocks and steps as the file would hold them (nothing rendered), with
    at most `max_threadblocks` per rank (default: the executor's limit; MscclFormatError when
    the streams cannot be merged that far). `copy_threadblocks` of them are kept from the
    transfers for the copies that wait for nothing (`_spread_copies`; needs `max_threadblocks`).

    A connection whose threadblock would hold more than `max_steps` steps (nops included) is
    split: its sends, in order, are dealt into consecutive parts, and part j moves at both ends
    to the same peers on channel chan + j x (channels the schedule uses), a connection of its
    own with its own threadblocks. Dependencies are the same steps'; only which threadblock
    runs them changes. Splitting stops when it would need more than the executor's channels or
    the SM budget; the result then still breaks `max_steps` (`require` says so).
    `pairing`: which streams share a threadblock over the budget (PAIRINGS); `order`: the
    steps' order within a threadblock (ORDERS; `.order` says which one the result has).
    `times` (order "timed" only): per transfer, its start and finish in a simulation of the
    schedule; times that are no dependency order for the file (`_time_keys`) give "early".
    `proven`: the caller has lowered this schedule already, so check_schedule passed on it."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing {pairing!r} is not one of {', '.join(PAIRINGS)}")
    if order not in ORDERS:
        raise ValueError(f"order {order!r} is not one of {', '.join(ORDERS)}")
    if (order == "timed") != (times is not None):
        raise ValueError('times are given with order "timed", and only then')
    if copy_threadblocks and (max_threadblocks is None or times is not None
                              or not 0 < copy_threadblocks < max_threadblocks):  # fmt: skip
        raise ValueError("copy_threadblocks: fewer than max_threadblocks, without times")
    if not proven:
        check_schedule(schedule)
    # Lowering allocates millions of objects and forms no reference cycles (steps point only
    # at earlier steps), so the cyclic collector only rescans them: paused while it runs.
    paused = gc.isenabled()
    gc.disable()
    try:
        if times is not None:
            timed = _timed_lowering(schedule, max_threadblocks, max_steps, pairing, times)
            if timed is not None:
                return timed
            order = "early"
        low = _split_lowering(schedule, max_threadblocks, max_steps, pairing, order,
                              copy_tbs=copy_threadblocks)  # fmt: skip
        if low.order == "early" and _deadlocks(low):
            low = _split_lowering(schedule, max_threadblocks, max_steps, pairing, "depth",
                                  copy_tbs=copy_threadblocks)  # fmt: skip
        return low
    finally:
        if paused:
            gc.enable()


def lower_timed(schedule: Schedule, times: tuple[Sequence[float], Sequence[float]], *,
                max_threadblocks: int | None = None, max_steps: int = MAX_STEPS,
                pairing: str = "forwarding") -> MscclLowering | None:  # fmt: skip
    """`lower_msccl(order="timed")` without its fallback: None where the times give no file.
    For a caller that has lowered `schedule` with `lower_msccl` already (which checked it: not
    repeated, it costs more than this lowering on a 64-rank AllReduce)."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing {pairing!r} is not one of {', '.join(PAIRINGS)}")
    paused = gc.isenabled()
    gc.disable()
    try:
        return _timed_lowering(schedule, max_threadblocks, max_steps, pairing, times)
    finally:
        if paused:
            gc.enable()


def _timed_lowering(schedule: Schedule, max_threadblocks: int | None, max_steps: int,
                    pairing: str, times: tuple[Sequence[float], Sequence[float]],
                    ) -> MscclLowering | None:  # fmt: skip
    """Time keys with sends moved early, else time keys alone, whichever first does not
    deadlock; None where the times are no dependency order or both would deadlock."""
    keys = _time_keys(schedule, *times)
    if keys is None:
        return None
    for moved in ("early", "depth"):
        low = _split_lowering(schedule, max_threadblocks, max_steps, pairing, moved, keys)
        if not _deadlocks(low):
            low.order = "timed"
            return low
    return None


def _time_keys(s: Schedule, start: Sequence[float], finish: Sequence[float]) -> Times | None:
    """Per transfer, the time its send is keyed at (its start) and its receive (its finish,
    less one key unit, so a receive comes before the sends that need its data) in the file's
    threadblocks; or None where that is not a dependency order the executor can keep: a
    transfer starting before a dependency finished, or a connection whose receives would not
    meet its sends in order (each k-th send meets the peer's k-th receive). With translation
    frames every transfer takes its orbit's root-0 key, as the tie-break does (`_step_order`)."""
    unit = 10.0**-TIME_DIGITS
    snd = [round(float(x), TIME_DIGITS) for x in start]
    rcv = [round(float(x), TIME_DIGITS) - unit for x in finish]
    frames = find_frames(s)
    if frames is not None:
        per = frames.per_block
        snd = [snd[t % per] for t in range(len(snd))]
        rcv = [rcv[t % per] for t in range(len(rcv))]
    tie = _step_order(s, frames)[2]
    on: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for t, tr in enumerate(s.transfers):
        if rcv[t] < snd[t] or any(rcv[d] >= snd[t] for d in tr.deps):
            return None
        on[(tr.src, tr.dst, tr.channel)].append(t)
    for ts in on.values():
        ts.sort(key=lambda t: (snd[t], tie[t]))
        got = [(rcv[t], tie[t]) for t in ts]
        if any(a >= b for a, b in itertools.pairwise(got)):
            return None
    return snd, rcv


def _split_lowering(schedule: Schedule, max_threadblocks: int | None, max_steps: int,
                    pairing: str, order: str = "depth",
                    keys: Times | None = None, copy_tbs: int = 0) -> MscclLowering:  # fmt: skip
    used = 1 + max((t.channel for t in schedule.transfers), default=0)
    cap = (MAX_THREADBLOCKS if max_threadblocks is None else max_threadblocks) - copy_tbs
    parts: dict[tuple[int, int, int], int] = {}
    frames = find_frames(schedule)
    if frames is not None and translates_exactly(schedule, frames):
        # Every rank's lowering is rank 0's translated: lower rank 0 alone.
        orbit = frames

        def lower(parts: dict[tuple[int, int, int], int]) -> MscclLowering:
            return _lower_orbit(schedule, max_threadblocks, orbit, parts, used, pairing, order,
                                keys, max_steps, copy_tbs)  # fmt: skip
    else:

        def lower(parts: dict[tuple[int, int, int], int]) -> MscclLowering:
            return _lower(schedule, max_threadblocks, parts, used, pairing, order, keys,
                          max_steps, copy_tbs)  # fmt: skip

    low = lower(parts)
    for _ in range(SPLIT_ROUNDS):
        more = dict(parts)
        for conn, factor in low.overflow(max_steps, used).items():
            k = parts.get(conn, 1)
            more[conn] = max(k, min(max(k + 1, k * factor), MAX_CHANNELS // used))
        added = [0] * schedule.nranks  # streams the new parts add, at both ends
        for (src, dst, chan), k in more.items():
            added[src] += k - parts.get((src, dst, chan), 1)
            added[dst] += k - parts.get((src, dst, chan), 1)
        # copy-only threadblocks (send and recv -1) take what the split leaves: not counted
        if more == parts or any(sum(p >= 0 or q >= 0 for p, q, _ in tbs) + a > cap
                                for tbs, a in zip(low.tb_meta, added, strict=True)):  # fmt: skip
            break  # no channel left, or over the SM budget once split (merging made it overflow)
        parts = more
        try:
            low = lower(parts)
        except MscclFormatError:
            break  # over the SM budget once split: the step limit is what to report
        low.split_connections = len(parts)
    return low


def _lower(s: Schedule, max_threadblocks: int | None, parts: dict[tuple[int, int, int], int],
           used: int, pairing: str = "forwarding", tb_order: str = "depth",
           keys: Times | None = None, max_steps: int = MAX_STEPS,
           copy_tbs: int = 0) -> MscclLowering:  # fmt: skip
    """`lower_msccl` with the connections (src, dst, chan) in `parts` split in that many."""
    coll = Collective(s.collective)
    lay = _Layout(coll, s.nranks, s.chunks_per_rank, s.root)
    frames = find_frames(s)
    order, level, tie = _step_order(s, frames, keys)
    rlevel = level if keys is None else keys[1]
    loc: dict[tuple[int, int], Loc] = {}
    for r in range(s.nranks):
        for k in range(s.total_chunks):
            off = lay.input_off(r, k)
            if off is not None:
                loc[(r, k)] = ("i", off)
    scratch: list[dict[int, int]] = [{} for _ in range(s.nranks)]
    last_write: dict[tuple[int, int], _Step] = {}
    steps_of: dict[tuple[int, int], list[_Step]] = {}  # (transfer, rank) -> its steps there
    steps: list[_Step] = []

    def dest(r: int, k: int) -> Loc:
        off = lay.output_off(r, k)
        if off is not None:
            return ("o", off)
        slot = scratch[r].setdefault(k, len(scratch[r]))
        return ("s", slot)

    for t in order:
        tr = s.transfers[t]
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
            snd = _Step(tr.src, ("send", tr.dst, tr.channel), (level[t], 0, tie[t], piece), "s",
                        src_loc, dst_loc, b - a, chunk=tr.chunk + a)  # fmt: skip
            key = (rlevel[t], 1, tie[t], piece)
            if tr.reduce:
                cur = cur_locs[a]
                assert cur is not None
                rcv = _Step(tr.dst, ("recv", tr.src, tr.channel), key, "rrc", cur, dst_loc,
                            b - a, chunk=tr.chunk + a)  # fmt: skip
            else:
                rcv = _Step(tr.dst, ("recv", tr.src, tr.channel), key, "r", src_loc,
                            dst_loc, b - a, chunk=tr.chunk + a)  # fmt: skip
            snd.twin = rcv
            steps += [snd, rcv]
            steps_of.setdefault((t, tr.src), []).append(snd)
            steps_of.setdefault((t, tr.dst), []).append(rcv)
            for k in range(tr.chunk + a, tr.chunk + b):
                loc[(tr.dst, k)] = dst_locs[k - tr.chunk]  # type: ignore[assignment]
                last_write[(tr.dst, k)] = rcv

    if parts:
        _split(steps, parts, used)

    # Final copies to the output for chunks that ended elsewhere.
    for r in range(s.nranks):
        pend: list[tuple[int, Loc, Loc]] = []
        chunks = range(s.total_chunks)
        if frames is not None:  # in rank r's frame, so its copies are rank 0's translated
            chunks = [frames.chunk_in(r, k) for k in chunks]  # type: ignore[assignment]
        for k in chunks:
            off = lay.output_off(r, k)
            if off is None or loc.get((r, k)) in (None, ("o", off)):
                continue
            pend.append((k, loc[(r, k)], ("o", off)))
        for i, j in _copy_runs(pend, frames):
            cp = _Step(r, ("copy", -1, 0), (math.inf, 2, 0, i), "cpy", pend[i][1], pend[i][2],
                       j - i)  # fmt: skip
            cp.preds = {
                last_write[(r, pend[m][0])] for m in range(i, j) if (r, pend[m][0]) in last_write
            }
            if not cp.preds:
                cp.stream = FREE_COPY
            steps.append(cp)

    fed = _rank_preds(s, steps, steps_of)
    return _assign(s, steps, lay, scratch, max_threadblocks, fed, frames, pairing=pairing,
                   tb_order=tb_order, max_steps=max_steps, copy_tbs=copy_tbs)  # fmt: skip


def _step_order(s: Schedule, frames: Frames | None, keys: Times | None = None,
                ) -> tuple[list[int], list[float], list[int]]:  # fmt: skip
    """Transfers in the order they are lowered, and per transfer its dependency depth (or its
    send's time key) and its tie-break within a depth (steps are keyed (depth, send/recv, tie,
    piece); a receive's first key is its own time key where `keys` are given)."""
    order = topological_order(s)
    level: list[float] = [0] * len(s.transfers)
    if keys is not None:
        level = list(keys[0])
    else:
        for t in order:
            level[t] = 1 + max((level[d] for d in s.transfers[t].deps), default=-1)
    tie = [0] * len(s.transfers)
    for p, t in enumerate(order):
        tie[t] = p
    if frames is not None:
        # One key per orbit (its root-0 transfer's position), so every rank orders its steps
        # as rank 0 orders their translates; depth first keeps it a dependency order.
        tie = [tie[t % frames.per_block] for t in range(len(s.transfers))]
        order = sorted(range(len(s.transfers)), key=lambda t: (level[t], tie[t], t))
    return order, level, tie


def _lower_orbit(s: Schedule, max_threadblocks: int | None, frames: Frames,
                 parts: dict[tuple[int, int, int], int], used: int,
                 pairing: str = "forwarding", tb_order: str = "depth",
                 keys: Times | None = None, max_steps: int = MAX_STEPS,
                 copy_tbs: int = 0) -> MscclLowering:  # fmt: skip
    """`_lower` of a schedule every frame map sends to itself (frames.translates_exactly):
    rank 0's steps only, then every rank's as rank 0's translated. Each orbit has one send
    (src 0) and one receive (dst 0) on rank 0, with the same key; the receive of rank 0's
    send happens on its peer as rank 0's receive of the orbit, translated, so each stands in
    for the other's twin (its slots, pieces, fusion, split part and threadblock). `parts`
    (split connections) come from a lowering of every rank, so they are equivariant too."""
    coll = Collective(s.collective)
    lay = _Layout(coll, s.nranks, s.chunks_per_rank, s.root)
    order, level, tie = _step_order(s, frames, keys)
    rlevel = level if keys is None else keys[1]
    moved = _Mover(lay, frames)
    receiver: dict[int, int] = {}  # orbit -> its transfer received by rank 0
    for t, tr in enumerate(s.transfers):
        if tr.dst == 0:
            receiver[t % frames.per_block] = t
    loc: dict[int, Loc] = {}
    for k in range(s.total_chunks):
        off = lay.input_off(0, k)
        if off is not None:
            loc[k] = ("i", off)
    scratch: dict[int, int] = {}
    last_write: dict[int, _Step] = {}
    steps_of: dict[tuple[int, int], list[_Step]] = {}
    steps: list[_Step] = []

    def dest(k: int) -> Loc:
        off = lay.output_off(0, k)
        return ("o", off) if off is not None else ("s", scratch.setdefault(k, len(scratch)))

    for t in order:
        if s.transfers[t].src != 0:
            continue
        ts, tr = t, s.transfers[t]
        t_in = receiver[t % frames.per_block]
        rx = s.transfers[t_in]
        peer, back = tr.dst, rx.src
        ks = list(range(tr.chunk, tr.chunk + tr.count))
        kr = list(range(rx.chunk, rx.chunk + rx.count))
        for k in kr:
            dest(k)
        src_locs = [loc.get(k) for k in ks]  # what rank 0 sends
        dst_locs: list[Loc | None] = [dest(k) for k in kr]  # where rank 0 receives
        cur_locs = [loc.get(k) for k in kr]
        cuts = {0, len(ks)}
        for seq in (src_locs, dst_locs, cur_locs) if tr.reduce else (src_locs, dst_locs):
            for a, n in _runs(seq):
                cuts.update((a, a + n))
        for piece, (a, b) in enumerate(itertools.pairwise(sorted(cuts))):
            src_loc, dst_loc = src_locs[a], dst_locs[a]
            assert src_loc is not None and dst_loc is not None  # guaranteed by check_schedule
            snd = _Step(0, ("send", peer, tr.channel), (level[ts], 0, tie[ts], piece), "s",
                        src_loc, moved(peer, dst_loc), b - a, chunk=ks[a])  # fmt: skip
            key = (rlevel[ts], 1, tie[ts], piece)
            if tr.reduce:
                cur = cur_locs[a]
                assert cur is not None
                rcv = _Step(0, ("recv", back, rx.channel), key, "rrc", cur, dst_loc, b - a,
                            chunk=kr[a])  # fmt: skip
            else:
                rcv = _Step(0, ("recv", back, rx.channel), key, "r", moved(back, src_loc),
                            dst_loc, b - a, chunk=kr[a])  # fmt: skip
            snd.twin = rcv  # stands in for the receive on `peer` (its translate)
            steps += [snd, rcv]
            steps_of.setdefault((ts, 0), []).append(snd)
            steps_of.setdefault((t_in, 0), []).append(rcv)
            for k in range(a, b):
                loc[kr[k]] = dst_locs[k]  # type: ignore[assignment]
                last_write[kr[k]] = rcv

    if parts:
        _split(steps, parts, used)

    pend: list[tuple[int, Loc, Loc]] = []
    for k in range(s.total_chunks):
        off = lay.output_off(0, k)
        if off is None or loc.get(k) in (None, ("o", off)):
            continue
        pend.append((k, loc[k], ("o", off)))
    for i, j in _copy_runs(pend, frames):
        cp = _Step(0, ("copy", -1, 0), (math.inf, 2, 0, i), "cpy", pend[i][1], pend[i][2], j - i)
        cp.preds = {last_write[pend[m][0]] for m in range(i, j) if pend[m][0] in last_write}
        if not cp.preds:
            cp.stream = FREE_COPY
        steps.append(cp)

    fed = _rank_preds(s, steps, steps_of, [0])
    one = _assign(s, steps, lay, [scratch], max_threadblocks, fed, frames, [0], pairing, tb_order,
                  max_steps, copy_tbs)  # fmt: skip
    return moved.lowering(one, scratch)


def _copy_runs(pend: list[tuple[int, Loc, Loc]], frames: Frames | None) -> Iterator[tuple[int, int]]:
    """[i, j) runs of final copies that are one `cnt` step: consecutive slots on both sides, at
    most MAX_COUNT, within one owner's block where the file is written as translates."""
    i = 0
    while i < len(pend):
        j = i + 1
        while (
            j < len(pend)
            and j - i < MAX_COUNT
            and pend[j][1] == (pend[i][1][0], pend[i][1][1] + j - i)
            and pend[j][2] == ("o", pend[i][2][1] + j - i)
            and (frames is None or frames.block(pend[j][0]) == frames.block(pend[i][0]))
        ):
            j += 1
        yield i, j
        i = j


class _Slots0:
    """Rank 0's distinct input and output slots among `locs`, each as the translation block of
    its chunk (`b`, None if an input slot holds no chunk) and the chunk within it (`j`)."""

    def __init__(self, lay: _Layout, f: Frames, locs: list[Loc]) -> None:
        distinct = list(dict.fromkeys(locs))
        self.scratch = [loc for loc in distinct if loc[0] == "s"]
        self.locs = [loc for loc in distinct if loc[0] != "s"]
        ks = [lay.output_chunk(0, off) if buf == "o" else lay.input_chunk(0, off)
              for buf, off in self.locs]  # fmt: skip
        self.out = np.array([buf == "o" for buf, _ in self.locs], dtype=bool)
        self.b: np.ndarray | None = None
        self.j = np.zeros(0, dtype=np.int64)
        if None not in ks:
            self.b, self.j = np.divmod(np.array(ks, dtype=np.int64), f.chunks)


class _Mover:
    """Rank 0's slots and steps as another rank holds their translates."""

    def __init__(self, lay: _Layout, frames: Frames) -> None:
        self.lay, self.frames = lay, frames
        self.to = frames.to_rank.tolist()

    def __call__(self, r: int, loc: Loc) -> Loc:
        buf, off = loc
        if buf == "s" or r == 0:
            return loc
        lay = self.lay
        if buf == "o":
            got = lay.output_off(r, self.chunk_in(r, lay.output_chunk(0, off)))
        else:
            k = lay.input_chunk(0, off)
            got = None if k is None else lay.input_off(r, self.chunk_in(r, k))
        if got is None:
            raise MscclFormatError(f"slot {buf}[{off}] of gpu 0 has no translate on gpu {r}")
        return (buf, got)

    def slots_of(self, r: int, locs0: _Slots0) -> dict[Loc, Loc] | None:
        """`self(r, loc)` for every slot of `locs0` at once, on arrays (per step, this was
        most of a translated lowering's time); None where some slot has no translate (then
        `self` says which, step by step)."""
        lay, f = self.lay, self.frames
        if locs0.b is None:
            return None
        perm = f.to_rank[r].astype(np.int64)
        if f.coll == Collective.ALLTOALL:
            s, d = np.divmod(locs0.b, lay.n)
            k = (perm[s] * lay.n + perm[d]) * f.chunks + locs0.j
        else:
            k = perm[locs0.b] * f.chunks + locs0.j
        off = np.where(locs0.out, lay.output_offs(r, k), lay.input_offs(r, k))
        if (off < 0).any():
            return None
        return {loc: (loc[0], o) for loc, o in zip(locs0.locs, off.tolist(), strict=True)} | {
            loc: loc for loc in locs0.scratch}

    def chunk_in(self, r: int, k: int) -> int:
        """frames.chunk_in on Python lists (called once per slot of every step written)."""
        f = self.frames
        if f.coll == Collective.ALLTOALL:
            return f.chunk_in(r, k)
        b, j = divmod(k, f.chunks)
        return self.to[r][b] * f.chunks + j

    def lowering(self, one: MscclLowering, scratch: dict[int, int]) -> MscclLowering:
        s, f = one.schedule, self.frames
        tb_meta, items_of, scratches = [], [], []
        locs0 = _Slots0(self.lay, f, [loc for lst in one.items_of[0].values()
                                      for _, st, _ in lst if st is not None
                                      for loc in (st.src, st.dst)])  # fmt: skip
        for r in range(s.nranks):
            perm = self.to[r]
            tb_meta.append([(perm[p] if p >= 0 else -1, perm[q] if q >= 0 else -1, c)
                            for p, q, c in one.tb_meta[0]])  # fmt: skip
            scratches.append({f.chunk_in(r, k): slot for k, slot in scratch.items()}
                             if r else scratch)  # fmt: skip
            if r == 0:
                items_of.append(one.items_of[0])
                continue
            items: dict[int, list[Item]] = {}
            at = self.slots_of(r, locs0)
            for tb, lst in one.items_of[0].items():
                out: list[Item] = []
                for kind, st, dep in lst:  # a dep is named by (tb, index): rank 0's step serves
                    if st is None:
                        out.append((kind, None, dep))
                        continue
                    kind_, peer, chan = st.stream
                    src, dst = (at[st.src], at[st.dst]) if at else (self(r, st.src),
                                                                    self(r, st.dst))  # fmt: skip
                    twin = _Step(r, (kind_, perm[peer] if peer >= 0 else -1, chan), st.key,
                                 st.type, src, dst, st.cnt, tb=st.tb,
                                 index=st.index, hasdep=st.hasdep, chunk=-1)  # fmt: skip
                    out.append((kind, twin, dep))
                items[tb] = out
            items_of.append(items)
        return MscclLowering(s, one.layout, scratches, tb_meta, items_of, one.channels_used,
                             order=one.order)  # fmt: skip


def _split(steps: list[_Step], parts: dict[tuple[int, int, int], int], used: int) -> None:
    """Deal each split connection's sends (in threadblock order) into `parts` consecutive runs,
    run j on channel chan + j x `used`, and move every send's receive with it."""
    on: dict[tuple[int, int, int], list[_Step]] = defaultdict(list)
    for st in steps:
        if st.twin is not None:
            conn = (st.rank, st.stream[1], st.stream[2])
            if conn in parts:
                on[conn].append(st)
    for (src, dst, chan), sends in on.items():
        sends.sort(key=lambda x: x.key)
        k = parts[(src, dst, chan)]
        for i, snd in enumerate(sends):
            moved = chan + (i * k // len(sends)) * used
            snd.stream = ("send", dst, moved)
            assert snd.twin is not None
            snd.twin.stream = ("recv", snd.twin.stream[1], moved)  # src, or the stand-in's peer


def _nearest(t: int, deps: list[tuple[int, ...]], own: dict[int, frozenset[_Step]],
             near: dict[int, frozenset[_Step]]) -> frozenset[_Step]:  # fmt: skip
    """A rank's steps of the nearest ancestors of transfer t that touch it (`own`: the rank's
    steps per transfer touching it; `near`: this rank's memo), without recursion. A transfer
    with one dependency shares its set instead of copying it (a copy per transfer and rank is
    what made lowering slow)."""
    got = near.get(t)
    if got is not None:
        return got
    stack = [t]
    while stack:
        u = stack[-1]
        du = deps[u]
        todo = [d for d in du if d not in own and d not in near]
        if todo:
            stack += todo
            continue
        stack.pop()
        if u in near:
            continue
        if len(du) == 1:
            d = du[0]
            near[u] = own[d] if d in own else near[d]
        else:
            near[u] = frozenset[_Step]().union(*(own[d] if d in own else near[d] for d in du))
    return near[t]


Fed = dict[tuple[Stream, Stream], int]  # (send stream, recv stream) -> its sends' preds there


def _rank_preds(s: Schedule, steps: list[_Step], steps_of: dict[tuple[int, int], list[_Step]],
                ranks: list[int] | None = None) -> list[Fed]:  # fmt: skip
    """Every step's `preds`, `after` and receive index, one rank at a time; and per rank how
    many of each send stream's preds lie in each receive stream (`_merge`'s tie-break).

    The nearest ancestors of a transfer on a rank are memoised per rank and dropped after it:
    a memo over all (transfer, rank) pairs grew past 6 GB on a 128-rank ReduceScatter, where
    FIFO queue edges make almost every earlier transfer an ancestor. Once `after` is known,
    only the latest pred per stream is kept (all `_assign` reads), except on steps of plain
    copies (type r and their sends), which `_fuse` compares as whole sets."""
    ranks = list(range(s.nranks)) if ranks is None else ranks
    touching: dict[int, list[int]] = {r: [] for r in ranks}
    for t, tr in enumerate(s.transfers):
        if tr.src in touching:
            touching[tr.src].append(t)
        if tr.dst in touching:
            touching[tr.dst].append(t)
    by_rank: dict[int, list[_Step]] = {r: [] for r in ranks}
    for st in steps:
        by_rank[st.rank].append(st)
    deps = [tr.deps for tr in s.transfers]
    fed: list[Fed] = []
    for r in ranks:
        own = {t: frozenset(steps_of[(t, r)]) for t in touching[r]}
        near: dict[int, frozenset[_Step]] = {}
        for t in touching[r]:
            preds = _nearest(t, deps, own, near)
            for st in own[t]:
                st.preds = set(preds)
        mine = by_rank[r]
        _ancestry(mine)
        counts: Fed = defaultdict(int)
        for st in mine:
            if st.stream[0] == "send":
                for p in st.preds:
                    if p.stream[0] == "recv":
                        counts[(st.stream, p.stream)] += 1
            whole = st.type == "r" or (st.twin is not None and st.twin.type == "r")
            if not whole and len(st.preds) > 1:
                latest: dict[Stream, _Step] = {}
                for p in st.preds:
                    if p.stream not in latest or p.key > latest[p.stream].key:
                        latest[p.stream] = p
                st.preds = set(latest.values())
        fed.append(counts)
    return fed


def _fuse(steps: list[_Step], draining: set[tuple[int, Stream]],
          frames: Frames | None = None) -> list[_Step]:  # fmt: skip
    """Consecutive transfers of a connection that wait for the same steps, between consecutive
    slots on both sides, become one step of cnt > 1 (fewer steps per threadblock, a smaller
    file, nothing waits longer). Only into receive streams `draining` (a threadblock of their
    own): a large step fills the connection's FIFO and blocks until the receiver drains it,
    which a threadblock that sends first might never do. Reductions are kept apart: moving a
    reduction earlier could race with a read of the partial sum it overwrites. With `frames`,
    only chunks of one translation block are fused: slots consecutive on one rank are then
    consecutive on every rank the step is translated to."""
    on: dict[tuple[int, int, int], list[tuple[_Step, _Step]]] = defaultdict(list)
    for snd in steps:
        rcv = snd.twin
        if rcv is not None and (rcv.rank, rcv.stream) in draining:
            on[(snd.rank, snd.stream[1], snd.stream[2])].append((snd, rcv))
    into: dict[_Step, _Step] = {}
    for pairs in on.values():
        pairs.sort(key=lambda x: x[0].key)
        s1, r1 = pairs[0]
        for s2, r2 in pairs[1:]:
            if (
                r1.type == r2.type == "r"
                and s1.cnt + s2.cnt <= MAX_COUNT
                and s2.src == (s1.src[0], s1.src[1] + s1.cnt)
                and r2.dst == (r1.dst[0], r1.dst[1] + r1.cnt)
                and s2.preds <= s1.preds
                and r2.preds <= r1.preds
                and (frames is None or frames.block(s1.chunk) == frames.block(s2.chunk))
            ):
                s1.cnt += s2.cnt
                r1.cnt += r2.cnt
                into[s2], into[r2] = s1, r1
            else:
                s1, r1 = s2, r2
    if not into:
        return steps
    for st in steps:
        st.preds = {into.get(p, p) for p in st.preds} - {st}
    return [st for st in steps if st not in into]


def _threadblocks(steps: list[_Step], rank: int, budget: int | None, fed: Fed,
                  frames: Frames | None = None, pairing: str = "forwarding",
                  ) -> tuple[dict[Stream, int], list[tuple[int, int, int]]]:  # fmt: skip
    """A rank's threadblocks (send, recv, chan): one per stream, except send/recv pairs of a
    channel merged where that adds no wait, and further, fewest waits first, as `budget`
    needs. Peers are compared as the rank sees them (`frames`), so translates agree."""

    def rel(peer: int) -> int:
        return peer if frames is None else frames.rel(rank, peer)

    members: dict[Stream, list[_Step]] = defaultdict(list)
    for st in steps:
        members[st.stream].append(st)
    sends: dict[int, list[int]] = defaultdict(list)
    recvs: dict[int, list[int]] = defaultdict(list)
    for kind, peer, chan in sorted(members):
        if kind == "send":
            sends[chan].append(peer)
        elif kind == "recv":
            recvs[chan].append(peer)
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
    cap = MAX_THREADBLOCKS if budget is None else budget
    streams = sum(len(v) for v in sends.values()) + sum(len(v) for v in recvs.values())
    pairs = _merge(members, sends, recvs, streams - cap, fed, rel, pairing)
    if len(pairs) < streams - cap:
        raise MscclFormatError(
            f"gpu {rank} needs {streams - len(pairs)} threadblocks; the limit is {cap}"
            + (" (the SM budget)" if budget is not None else "")
        )
    paired = {("send", p, c) for p, _, c in pairs} | {("recv", q, c) for _, q, c in pairs}
    tbs = pairs + [
        (p, -1, c) for c, ps in sends.items() for p in ps if ("send", p, c) not in paired
    ]
    tbs += [(-1, q, c) for c, qs in recvs.items() for q in qs if ("recv", q, c) not in paired]
    copies = ("copy", -1, 0) in members
    if (copies or FREE_COPY in members) and not tbs:
        tbs.append((-1, -1, 0))
    tbs.sort(key=lambda x: (rel(x[0]), rel(x[1]), x[2]))
    out: dict[Stream, int] = {}
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
            steps_in[i] += len(members[stream])
        out[("copy", -1, 0)] = min(range(len(tbs)), key=lambda i: (steps_in[i], i))
    return out, tbs


def _merge(members: dict[Stream, list[_Step]], sends: dict[int, list[int]],
           recvs: dict[int, list[int]], need: int, fed: Fed, rel: Callable[[int], int],
           pairing: str = "forwarding") -> list[tuple[int, int, int]]:  # fmt: skip
    """Disjoint (send peer, recv peer, chan) pairs, cheapest first: every pair that adds no
    wait and cannot block (`_waiting`; it saves an SM for free, as msccl-tools' fused
    recv-send threadblocks do), then more until `need` pairs (fewer when no more exist); ties
    go to the pair whose sends forward more of its receives, then to fewer steps (balance).
    "balanced" ranks by the two streams' step counts apart first (the most apart first: a
    heavy stream with a light one keeps the busiest threadblock short, where its in-order
    steps are what a file loses to its schedule), then as above; a pair that may block
    still comes after every pair that cannot. "minmax" makes exactly `need` pairs, those that
    cannot block first, then the fewest steps together: the busiest threadblock is the
    heaviest stream where enough light streams exist."""
    minmax = pairing == "minmax"
    balanced = pairing == "balanced"
    ranked: list[tuple[int, ...]] = []
    for chan, p, q, nx, ny, added, blocks in _candidate_pairs(members, sends, recvs):
        if minmax:
            ranked.append((int(blocks), nx + ny, added, chan, -rel(p), -rel(q), p, q))
            continue
        fed_by = fed.get((("send", p, chan), ("recv", q, chan)), 0)
        apart = -abs(nx - ny) if balanced else 0
        ranked.append((int(blocks and balanced), apart, added, int(blocks), -fed_by,
                       nx + ny, chan, -rel(p), -rel(q), p, q))  # fmt: skip
    ranked.sort()
    out: list[tuple[int, int, int]] = []
    used: set[Stream] = set()
    for key in ranked:
        chan, p, q = key[-5], key[-2], key[-1]
        # minmax stops at `need`; the others also take every pair that adds no wait
        if len(out) >= need and (minmax or key[2] or key[3]):
            break
        if ("send", p, chan) in used or ("recv", q, chan) in used:
            continue
        used |= {("send", p, chan), ("recv", q, chan)}
        out.append((p, q, chan))
    return out


def _candidate_pairs(members: dict[Stream, list[_Step]], sends: dict[int, list[int]],
                     recvs: dict[int, list[int]]) -> Iterator[tuple[int, int, int, int, int, int, bool]]:  # fmt: skip
    """Every (chan, send peer, recv peer) a threadblock could pair, with both streams' step
    counts and what pairing them costs (`_waiting`: waits added, whether it may block)."""
    for chan in sorted(set(sends) & set(recvs)):
        ykeys = {q: sorted(y.key for y in members[("recv", q, chan)]) for q in recvs[chan]}
        for p in sends[chan]:
            xs = sorted(members[("send", p, chan)], key=lambda x: x.key)
            for q in recvs[chan]:
                added, blocks = _waiting(xs, ykeys[q], ("recv", q, chan))
                yield chan, p, q, len(xs), len(ykeys[q]), added, blocks


def _deadlocks(low: MscclLowering) -> bool:
    """Whether the executor's threadblocks would block each other on this lowering (FIFO
    slots at the largest size: one Simple chunk per primitive call, formats/msccl/executor.py)."""
    from .executor import CHUNK_SLOTS, Program, XStep, execute  # executor imports this module

    tbs: list[list[list[XStep]]] = []
    for r, items in enumerate(low.items_of):
        gpu: list[list[XStep]] = []
        for tb, (p, q, chan) in enumerate(low.tb_meta[r]):
            lst = items.get(tb, [])
            gpu.append([XStep(r, tb, i, *(("nop", "i", -1, "o", -1, 0) if st is None else
                                         (st.type, *st.src, *st.dst, st.cnt)),
                              *((dep.tb, dep.index) if dep is not None else (-1, -1)),
                              int(st is not None and st.hasdep), chan, p, q)
                        for i, (_, st, dep) in enumerate(lst)])  # fmt: skip
        tbs.append(gpu)
    try:
        execute(Program.wire(tbs), lambda x: x.cnt * CHUNK_SLOTS["Simple"])
    except MscclFormatError:
        return True
    return False


def _sends_early(members: list[_Step]) -> list[_Step]:
    """A threadblock's steps (in key order) with every send that waits for nothing outside it
    moved ahead of the receives it does not depend on, while its sends stay at most
    FIFO_CHUNKS chunks ahead of its receives. Sends keep their order, receives theirs (each
    still meets its peer's k-th step). Why: in key order a threadblock pairing a send stream
    with a receive stream alternates them, and each send then waits for the receive before
    it and pays its step latency again; moved ahead, it runs while the receive is in flight.
    A send that waits for another threadblock stays where it is: moved ahead, it would hold
    back the receives behind it until that threadblock is done."""
    sends = [x for x in members if x.stream[0] == "send"]
    rest = [x for x in members if x.stream[0] != "send"]
    if not sends or not rest:
        return members
    mine = {x.stream for x in rest}
    got: dict[Stream, int] = defaultdict(int)  # receives placed, per stream
    out: list[_Step] = []
    ahead = si = ri = 0  # send chunks placed minus receive chunks placed
    while si < len(sends) or ri < len(rest):
        x = sends[si] if si < len(sends) else None
        if x is not None and (ri == len(rest) or x.key < rest[ri].key or (
                ahead + x.cnt <= FIFO_CHUNKS
                and all(p.tb == x.tb for p in x.preds)
                and all(got[q] > i for q, i in x.after.items() if q in mine))):  # fmt: skip
            out.append(x)
            ahead += x.cnt
            si += 1
            continue
        y = rest[ri]
        out.append(y)
        if y.stream[0] == "recv":
            got[y.stream] += 1
            ahead -= y.cnt
        ri += 1
    return out


def _ancestry(steps: list[_Step]) -> None:
    """Set `after` on a rank's steps: per receive stream, the position of the last of its
    receives each step depends on (through the rank's own dependencies)."""
    count: dict[Stream, int] = defaultdict(int)
    for st in sorted(steps, key=lambda x: x.key):  # preds come first: they are shallower
        after: dict[Stream, int] = {}
        for p in st.preds:
            for stream, i in p.after.items():
                if after.get(stream, -1) < i:
                    after[stream] = i
            if p.stream[0] == "recv" and after.get(p.stream, -1) < p.index:
                after[p.stream] = p.index
        st.after = after
        if st.stream[0] == "recv":
            st.index = count[st.stream]
            count[st.stream] += 1


def _waiting(xs: list[_Step], ykeys: list[tuple[float, ...]], stream: Stream) -> tuple[int, bool]:
    """Receives of `stream` (their keys, sorted) a merged threadblock runs before sends of `xs`
    (sorted) that do not depend on them (each a wait the separate streams did not have); and
    whether it sends more than a FIFO holds before receiving (it may block for good if its
    peer does the same). Keys are unique on a rank, so bisection counts the receives before."""
    waits = queued = 0
    blocks = False
    last = -1
    for x in xs:
        seen = bisect.bisect_left(ykeys, x.key)
        if seen != last:  # a receive ran since the previous send: the FIFO drained
            last, queued = seen, 0
        waits += max(0, seen - 1 - x.after.get(stream, -1))
        queued += x.cnt
        blocks |= queued > FIFO_CHUNKS
    return waits, blocks


Item = tuple[str, "_Step | None", "_Step | None"]  # ("nop"|"step", the step, its dependency)


def _spread_copies(free: list[_Step], items: dict[int, list[Item]],
                   tb_list: list[tuple[int, int, int]], max_steps: int,
                   spare: int = 0) -> None:  # fmt: skip
    """Deal a rank's free copies (FREE_COPY: they wait for nothing, nothing waits for them)
    over its threadblocks with room under `max_steps` and up to `spare` new copy-only ones
    (send -1, recv -1: the SM budget's unused threadblocks), each chunk to the one whose side
    (`_side_load`) would then hold the fewest chunks, consecutive chunks per threadblock; each
    where its threadblock would first wait, after its leading sends (`_copy_slot`). Why: a copy
    runs on its threadblock, at its rate; one copy of a GPU's own chunks on one threadblock took
    mi300x-8 AllGather at 64 MiB from 190.0 to 941.8 us, dealt 211.5 (docs/synthesis.md
    "Session 9: local steps charged"). On a threadblock of its own a copy delays no receive,
    hence no peer's send (docs/synthesis.md "Session 10: the copy on threadblocks of its own").
    A piece joins no two of the original runs (`_copy_runs`), so it stays within one
    translation block and is one step per run."""
    chunks = [(st, m) for st in free for m in range(st.cnt)]
    talking = len(tb_list)
    load = [_side_load(items.get(tb, []), tb_list[tb][1] >= 0) for tb in range(talking)]
    load += [0] * max(0, min(spare, len(chunks)))  # candidates: only those given chunks are made
    order = sorted(range(len(load)), key=lambda tb: (load[tb], tb))
    # a piece is a step per original run it spans: room for every run keeps `max_steps`
    room = [tb for tb in order if len(items.get(tb, [])) + len(free) <= max_steps]
    if not room:  # as before: the least loaded threadblock, over the limit if it must be
        room = order[:1]
    # water-fill: each chunk to the threadblock whose side would then hold the fewest chunks
    give = dict.fromkeys(room, 0)
    heap = [(load[tb], i, tb) for i, tb in enumerate(room)]
    heapq.heapify(heap)
    for _ in chunks:
        held, i, tb = heapq.heappop(heap)
        give[tb] += 1
        heapq.heappush(heap, (held + 1, i, tb))
    start = 0
    for tb in room:
        if not give[tb]:
            continue
        part = chunks[start:start + give[tb]]
        start += give[tb]
        if tb >= talking:  # a new copy-only threadblock, numbered after the last one made
            tb_list.append((-1, -1, 0))
            tb = len(tb_list) - 1
        runs = [(st, [m for _, m in group])
                for st, group in itertools.groupby(part, key=lambda x: x[0])]  # fmt: skip
        lst = items.setdefault(tb, [])
        at = _copy_slot(lst)
        lst[at:at] = [("step", _Step(st.rank, FREE_COPY, st.key, "cpy",
                                     (st.src[0], st.src[1] + ms[0]), (st.dst[0], st.dst[1] + ms[0]),
                                     len(ms), tb=tb), None) for st, ms in runs]  # fmt: skip


def _side_load(lst: list[Item], receives: bool) -> int:
    """Chunks a threadblock's side that would run a local step moves: its receive side (its
    receives and local steps) if it receives, else its send side."""
    return sum(st.cnt for _, st, _ in lst
               if st is not None and (st.stream[0] != "send") == receives)  # fmt: skip


def _copy_slot(lst: list[Item]) -> int:
    """Where a threadblock would first wait: after its leading sends (and their nops)."""
    for i, (_, st, _) in enumerate(lst):
        if st is not None and st.stream[0] != "send":
            while i > 0 and lst[i - 1][1] is None:
                i -= 1
            return i
    return len(lst)




@dataclass(eq=False)
class MscclLowering:
    """A schedule lowered to threadblocks and steps per rank, measured against the limits."""

    schedule: Schedule
    layout: _Layout
    scratch: list[dict[int, int]]
    tb_meta: list[list[tuple[int, int, int]]]  # per rank: (send, recv, chan) per threadblock
    items_of: list[dict[int, list[Item]]]  # per rank: threadblock -> its steps in order
    channels_used: int
    split_connections: int = 0  # connections dealt over more channels (`lower_msccl`)
    order: str = "depth"  # "early": `_sends_early` moved a send on some rank; "timed": time keys

    def channels(self, nchannels: int | None) -> int:
        """The file's nchannels: as asked, widened to the channels split connections took."""
        if nchannels is None or (self.split_connections and nchannels < self.channels_used):
            return max(self.channels_used, 1, nchannels or 0)
        if nchannels < self.channels_used:
            raise MscclFormatError(
                f"nchannels={nchannels} but the schedule uses {self.channels_used} channels"
            )
        return nchannels

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

    def overflow(self, max_steps: int, used: int) -> dict[tuple[int, int, int], int]:
        """Connections (src, dst, chan < `used`) served by threadblocks over `max_steps` steps,
        with the factor by which the busiest of them overflows."""
        out: dict[tuple[int, int, int], int] = {}
        for r, items in enumerate(self.items_of):
            for tb, lst in items.items():
                if len(lst) <= max_steps:
                    continue
                p, q, chan = self.tb_meta[r][tb]
                factor = -(-len(lst) // max_steps)
                for conn in ((r, p, chan % used), (q, r, chan % used)):
                    if min(conn[:2]) >= 0:
                        out[conn] = max(out.get(conn, 0), factor)
        return out

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
        nchannels = self.channels(nchannels)
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
                    for k, w in zip(STEP_ATTRS, step_values(i, step, dep), strict=True):
                        e.set(k, str(w))
        ET.indent(algo, space="  ")
        # msccl-tools writes empty elements as "<step .../>"; keep that exact spelling.
        return ET.tostring(algo, encoding="unicode").replace(" />", "/>") + "\n"


def _assign(s: Schedule, steps: list[_Step], lay: _Layout, scratch: list[dict[int, int]],
            budget: int | None, fed: list[Fed], frames: Frames | None = None,
            ranks: list[int] | None = None, pairing: str = "forwarding",
            tb_order: str = "depth", max_steps: int = MAX_STEPS,
            copy_tbs: int = 0) -> MscclLowering:  # fmt: skip
    """Threadblocks per rank, each one's steps in order with the nops its dependencies need
    (`ranks`: only these, holding all of `steps`, and `fed` in their order); the transfers'
    within `budget` less `copy_tbs`, the rest of `budget` open to the free copies."""
    ranks = list(range(s.nranks)) if ranks is None else ranks
    by_rank: dict[int, list[_Step]] = {r: [] for r in ranks}
    for st in steps:
        by_rank[st.rank].append(st)
    talk = None if budget is None else budget - copy_tbs
    placed = {r: _threadblocks(by_rank[r], r, talk, fed[i], frames, pairing)
              for i, r in enumerate(ranks)}  # fmt: skip
    draining = {(r, ("recv", q, c)) for r, (_, tbs) in placed.items() for p, q, c in tbs
                if p < 0 and q >= 0}  # fmt: skip
    by_rank = {r: [] for r in ranks}
    free: dict[int, list[_Step]] = {r: [] for r in ranks}
    for st in _fuse(steps, draining, frames):
        (free if st.stream == FREE_COPY else by_rank)[st.rank].append(st)
    tb_meta: list[list[tuple[int, int, int]]] = []
    items_of: list[dict[int, list[Item]]] = []
    used_chan = 0
    early = False
    for r in ranks:
        tb_of, tb_list = placed[r]
        used_chan = max([used_chan, *(c + 1 for _, _, c in tb_list)])
        tb_meta.append(tb_list)
        per_tb: dict[int, list[_Step]] = defaultdict(list)
        for st in by_rank[r]:
            st.tb = tb_of[st.stream]
            per_tb[st.tb].append(st)
        items: dict[int, list[Item]] = {}
        for tb, members in per_tb.items():
            members.sort(key=lambda x: x.key)
            if tb_order == "early":
                moved = _sends_early(members)
                early |= moved != members
                members[:] = moved
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
        if free[r]:
            spare = 0 if budget is None else budget - len(tb_list)
            _spread_copies(free[r], items, tb_list, max_steps, spare)
    # Final indices count the nops.
    for items in items_of:
        for lst in items.values():
            for i, (_, real, _) in enumerate(lst):
                if real is not None:
                    real.index = i
    return MscclLowering(s, lay, scratch, tb_meta, items_of, used_chan,
                         order="early" if early else "depth")  # fmt: skip


__all__ = ["ORDERS", "PAIRINGS", "MscclFormatError", "MscclLowering", "ScheduleError",
           "lower_msccl", "lower_timed", "to_msccl_xml"]
