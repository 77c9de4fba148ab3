"""A latency-lean AllReduce for fabrics of many servers: few chunks per loop (so the executor
selects it at 1 KiB) and few steps in sequence (docs/synthesis.md, "ReduceScatter and AllReduce
at scale", session 8).

1. ReduceScatter within the server: GPU g ends with run g (the server's sum of chunks
   g x top .. g x top + top - 1), directly from every peer, by recursive halving or on a ring;
2. on GPU g's rail (its peers at local index g in the other servers), the outer dimensions cut
   into levels of at most 8 (or 4, RADIXES): each level below the top reduces the run into its
   leader (the member at coordinate 0);
3. the top level's members reduce-scatter the run (one chunk each) and all-gather it directly;
4. each lower level's leader sends the run back to its members, then the server all-gathers.
With the direct exchange, runs move chunk by chunk (`small_allreduce`).

Every transfer waits for the last write into each chunk it reads, and a write for the last write
into and every read of each chunk it writes since: emitted phase by phase, the schedule is its own
program order made concurrent, race-free by construction (model/schedule/check.py proves it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..api.cluster import Dimension
from ..api.common import Collective
from ..model.schedule.ir import Schedule, ScheduleArrays, Transfer

INTRA_MODES = ("direct", "halving", "ring")
# Members of a level at most: its leader takes one threadblock per member. 8 gives the fewest
# levels within 16 threadblocks; 4 leaves room for a direct exchange within the server.
RADIXES = (8, 4)
MIN_RANKS = 64  # issue 18's small-message target: >= 64 GPUs
# Largest size its file is timed at: latency-bound below it; above, each GPU's whole share
# crosses one threadblock in sequence (h800-rail-512 at 256 KiB: 126 us vs 43 at 1 KiB).
MAX_BYTES = 1 << 20
# Protocols its file is timed with: LL. Each level pays a hop per step in sequence, where LL128
# adds 1.3 us and Simple 11.3 (docs/cost-model.md). On h800-rail-512 the best lean file was LL
# at 1 KiB and 256 KiB (LL128: 73.97 / 81.42 us against LL's 43.32 / 75.67), and timing a
# 512-rank file costs seconds.
PROTOCOLS = ("LL",)


@dataclass(frozen=True, slots=True)
class Level:
    stride: int  # rank distance between neighbouring members
    size: int


def levels(dims: list[Dimension], radix: int = RADIXES[0]) -> list[Level] | None:
    """The outer dimensions (all but the server's) cut into levels of at most `radix` (a power
    of two) members, innermost first; None where a dimension has no such cut (a size that is
    not a power of two above `radix`)."""
    out: list[Level] = []
    stride = dims[0].size
    for d in dims[1:]:
        n = d.size
        if n <= radix:
            out.append(Level(stride, n))
        elif n & (n - 1):
            return None
        else:  # balanced powers of two, the top the largest: 64 -> 8 x 8, 32 -> 4 x 8
            bits, per = n.bit_length() - 1, radix.bit_length() - 1
            parts = -(-bits // per)
            s = stride
            for p in range(parts):
                size = 1 << (bits // parts + (1 if p >= parts - bits % parts else 0))
                out.append(Level(s, size))
                s *= size
        stride *= n
    return [lv for lv in out if lv.size > 1] or None


def leader_peers(dims: list[Dimension], intra: str, radix: int = RADIXES[0]) -> int:
    """Distinct peers of the busiest GPU (a leader at every level): one threadblock each."""
    lv = levels(dims, radix) or []
    local = dims[0].size
    inner = {"direct": local - 1, "halving": (local - 1).bit_length(), "ring": 2}[intra]
    return inner + sum(x.size - 1 for x in lv)


class _Program:
    """Transfers in program order; each one's deps from the last writes and reads per chunk."""

    def __init__(self, nranks: int, chunks: int) -> None:
        self.chunks = chunks
        self.transfers: list[Transfer] = []
        self.last_write: list[int] = [-1] * (nranks * chunks)
        self.reads: list[list[int]] = [[] for _ in range(nranks * chunks)]

    def send(self, src: int, dst: int, lo: int, count: int, reduce: bool) -> None:
        deps: set[int] = set()
        me = len(self.transfers)
        for c in range(lo, lo + count):
            r, w = src * self.chunks + c, dst * self.chunks + c
            if self.last_write[r] >= 0:
                deps.add(self.last_write[r])
            if self.last_write[w] >= 0:
                deps.add(self.last_write[w])
            deps.update(self.reads[w])
        for c in range(lo, lo + count):
            self.reads[src * self.chunks + c].append(me)
            w = dst * self.chunks + c
            self.last_write[w], self.reads[w] = me, []
        self.transfers.append(Transfer(src, dst, lo, count, reduce, tuple(sorted(deps)), 0))


def _servers(nranks: int, local: int) -> Iterator[list[int]]:
    for base in range(0, nranks, local):
        yield list(range(base, base + local))


def _reduce_into(p: _Program, senders: list[int], dst: int, lo: int, run: int, split: bool) -> None:
    """Each sender's run reduced into `dst`: whole, or chunk by chunk with the senders rotated
    over the chunks, so reduces into different chunks run at once (into one chunk they wait
    for each other: one threadblock's throughput each, in sequence)."""
    if not split:
        for src in senders:
            p.send(src, dst, lo, run, True)
        return
    for turn in range(run):
        for q, src in enumerate(senders):
            p.send(src, dst, lo + (q + turn) % run, 1, True)


def _intra_reduce_scatter(p: _Program, nranks: int, local: int, run: int, intra: str,
                          split: bool) -> None:  # fmt: skip
    for gpus in _servers(nranks, local):
        if intra == "direct":
            for i in range(local):
                peers = [gpus[(i + k) % local] for k in range(1, local)]
                _reduce_into(p, peers, gpus[i], i * run, run, split)
        elif intra == "ring":
            for k in range(local - 1):  # GPU i ends with run i
                for i in range(local):
                    j = (i - k - 1) % local
                    p.send(gpus[i], gpus[(i + 1) % local], j * run, run, True)
        else:
            m = local // 2
            while m:
                for i in range(local):
                    keep = i & ~(2 * m - 1) | (i & m)
                    give = keep ^ m
                    p.send(gpus[i], gpus[i ^ m], give * run, m * run, True)
                m //= 2


def _copy_to(p: _Program, src: int, receivers: list[int], lo: int, run: int, split: bool) -> None:
    """`src`'s run stored on each receiver: whole, or chunk by chunk (each chunk goes on as
    soon as it is there)."""
    parts = [(lo + c, 1) for c in range(run)] if split else [(lo, run)]
    for first, count in parts:
        for dst in receivers:
            p.send(src, dst, first, count, False)


def _intra_all_gather(p: _Program, nranks: int, local: int, run: int, intra: str,
                      split: bool) -> None:  # fmt: skip
    for gpus in _servers(nranks, local):
        if intra == "direct":
            for i in range(local):
                peers = [gpus[(i + k) % local] for k in range(1, local)]
                _copy_to(p, gpus[i], peers, i * run, run, split)
        elif intra == "ring":
            for k in range(local - 1):
                for i in range(local):
                    p.send(gpus[i], gpus[(i + 1) % local], ((i - k) % local) * run, run, False)
        else:
            m = 1
            while m < local:
                for i in range(local):
                    p.send(gpus[i], gpus[i ^ m], (i & ~(m - 1)) * run, m * run, False)
                m *= 2


def _coord(rank: int, lv: Level) -> int:
    return (rank // lv.stride) % lv.size


def small_allreduce(dims: list[Dimension], intra: str, name: str,
                    radix: int = RADIXES[0]) -> ScheduleArrays | None:  # fmt: skip
    """The AllReduce above on a fabric of `dims` (innermost first) with levels of at most
    `radix`, or None where they do not exist (one server, or an outer size with no cut).

    With the direct exchange a GPU takes in 7 reduces into one run: runs then move chunk by
    chunk (senders rotated over the chunks), at every level, so reduces into different chunks
    overlap (h800-rail-512 at 256 KiB: 111.7 -> 75.7 us as a file) at the cost of more steps
    (at 1 KiB 49.9 us; the ring's whole runs 43.3)."""
    if intra not in INTRA_MODES:
        raise ValueError(f"intra {intra!r} is not one of {', '.join(INTRA_MODES)}")
    local = dims[0].size
    lv = levels(dims, radix) if len(dims) > 1 else None
    if lv is None or (intra == "halving" and local & (local - 1)):
        return None
    nranks = 1
    for d in dims:
        nranks *= d.size
    top, below = lv[-1], lv[:-1]
    split = intra == "direct"
    run = top.size
    p = _Program(nranks, local * run)
    _intra_reduce_scatter(p, nranks, local, run, intra, split)

    def leads(rank: int, upto: list[Level]) -> bool:
        return all(_coord(rank, x) == 0 for x in upto)

    for k, x in enumerate(below):  # reduce into each level's leader
        for r in range(nranks):
            if leads(r, below[: k + 1]):
                kids = [r + c * x.stride for c in range(1, x.size)]
                _reduce_into(p, kids, r, (r % local) * run, run, split)
    members = [r for r in range(nranks) if leads(r, below)]
    for step in range(1, top.size):  # top: reduce-scatter one chunk each, then all-gather
        for r in members:
            a = _coord(r, top)
            b = (a + step) % top.size
            p.send(r, r + (b - a) * top.stride, (r % local) * run + b, 1, True)
    for step in range(1, top.size):
        for r in members:
            a = _coord(r, top)
            b = (a + step) % top.size
            p.send(r, r + (b - a) * top.stride, (r % local) * run + a, 1, False)
    for k in range(len(below) - 1, -1, -1):  # leaders send the run back down
        x = below[k]
        for r in range(nranks):
            if leads(r, below[: k + 1]):
                kids = [r + c * x.stride for c in range(1, x.size)]
                _copy_to(p, r, kids, (r % local) * run, run, split)
    _intra_all_gather(p, nranks, local, run, intra, split)
    sched = Schedule(name, Collective.ALLREDUCE, nranks, local * run, p.transfers, protocol="LL")
    return ScheduleArrays.from_schedule(sched)


def variants(dims: list[Dimension], budget: int) -> list[tuple[str, int]]:
    """(intra-server mode, radix) per distinct cut into levels: the most parallel mode whose
    busiest GPU has a threadblock per peer within `budget`. None below MIN_RANKS GPUs or on
    one server."""
    nranks = 1
    for d in dims:
        nranks *= d.size
    if nranks < MIN_RANKS or len(dims) < 2:
        return []
    out: list[tuple[str, int]] = []
    seen: list[list[Level]] = []
    for radix in RADIXES:
        lv = levels(dims, radix)
        if lv is None or lv in seen:
            continue
        seen.append(lv)
        fits = [m for m in INTRA_MODES if leader_peers(dims, m, radix) <= budget]
        out += [(fits[0], radix)] if fits else []
    return out


def label(dims: list[Dimension], intra: str, radix: int) -> str:
    """The variant's name: mode and levels, e.g. `lean/ring/8x8`."""
    return f"lean/{intra}/" + "x".join(str(x.size) for x in levels(dims, radix) or [])


__all__ = ["INTRA_MODES", "MAX_BYTES", "PROTOCOLS", "RADIXES", "Level", "label", "leader_peers", "levels",
           "small_allreduce", "variants"]
