"""Fills: a full mesh's whole SM budget at one share per threadblock (issue 18).

On a full mesh of equal links whose peer count does not divide the threadblock budget
(MI300X: 32 threadblocks, 7 peers), power-of-two channels per peer leave some threadblocks idle
(4 x 7 = 28). A fill deals the budget over the peer offsets d (receiver = sender + d mod n),
one more channel on the nearest offsets, and relays the share the other offsets cannot carry
through GPUs with spare channels, so every channel moves the same number of chunks. AllGather
relays cost nothing extra (the relay receives the data anyway); AlltoAll relays cost a second
hop. mesh.py builds and evaluates them (docs/synthesis.md, "Single-server meshes").
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.common import Collective
from ..model.schedule.ir import ScheduleArrays
from . import assemble as asm
from .group import GroupTopo

MAX_CHUNKS = 32  # chunks per rank of a mesh variant (steps per threadblock grow with it)


@dataclass(frozen=True)
class FillPlan:
    """A full mesh of equal links on all `budget` threadblocks: peer offset d (receiver = sender
    + d mod n) on `channels[d]` channels, every channel carrying `per_channel` chunks; an
    offset with fewer channels sends `relayed[d]` of its owner's chunks through the GPU at
    offset a, which forwards them on offset d - a (`relays`: (d, chunk, a))."""

    n: int
    cpr: int
    channels: dict[int, int]
    per_channel: int
    relays: tuple[tuple[int, int, int], ...]


def fill_plan(group: GroupTopo, budget: int) -> FillPlan | None:
    """The budget dealt evenly over a full mesh's peer offsets when it is not a multiple of
    the peers (MI300X: 32 threadblocks, 7 peers): one more channel on the nearest offsets
    (d and n - d together, so both directions of a pair match), and the chunks those extra
    channels can carry taken from the other offsets and relayed by a GPU that receives them
    anyway. Every channel then moves the same share: all `budget` threadblocks at one rate
    instead of 4 x 7 = 28 of 32. None where the mesh is not full and uniform or nothing fits."""
    n = group.size
    peers = n - 1
    if n < 3 or len(group.links()) != n * peers or len({group.capacity(*lk)
                                                        for lk in group.links()}) != 1:  # fmt: skip
        return None
    base, extra = divmod(budget, peers)
    if base == 0 or extra == 0:
        return None
    channels = dict.fromkeys(range(1, n), base)
    for m in range(1, n // 2 + 1):
        pair = {m, n - m}
        if len(pair) <= extra:
            for d in pair:
                channels[d] += 1
            extra -= len(pair)
    if extra:
        return None
    # The fewest chunks per rank (a power of two, for the executor's selection) that deal
    # evenly over all channels.
    cpr = next((1 << k for k in range(MAX_CHUNKS.bit_length()) if (peers << k) % budget == 0), 0)
    if not cpr:
        return None
    q = peers * cpr // budget
    deficit = {d: cpr - k * q for d, k in channels.items() if k * q < cpr}
    spare = [b for b, k in sorted(channels.items()) for _ in range(k * q - cpr)]
    if sum(deficit.values()) > cpr or len(spare) != sum(deficit.values()):
        return None
    # Each short offset's relays spread over the spare offsets in turn (1, 2, 6, 7, 1, ...).
    # Relayed chunk ids are disjoint, so a relay is never sent a chunk it must forward.
    slots = [b for _, b in sorted((spare[:i].count(b), b) for i, b in enumerate(spare))]
    relays: list[tuple[int, int, int]] = []
    for d, short in sorted(deficit.items()):
        for _ in range(short):
            b = slots.pop(0)
            relays.append((d, len(relays), (d - b) % n))
    return FillPlan(n, cpr, channels, q, tuple(relays))


def fill_allgather(plan: FillPlan, name: str) -> ScheduleArrays:
    """The `fill_plan` AllGather: every owner's chunks direct to each peer, less the relayed
    ones, those sent first on their first hop; each relay's forward last on the least loaded
    channel of its offset (earlier in the queue the files time the same, 2026-11-24); one
    queue per (sender, receiver, channel)."""
    n, cpr = plan.n, plan.cpr
    relayed = {(d, c) for d, c, _ in plan.relays}
    first = {(a, c) for _, c, a in plan.relays}
    # queues[(offset, channel)]: (chunk, first hop offset or 0 for a direct send)
    queues: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for d, k in sorted(plan.channels.items()):
        direct = sorted((c for c in range(cpr) if (d, c) not in relayed),
                        key=lambda c: ((d, c) not in first, c))  # fmt: skip
        for i, c in enumerate(direct):
            queues.setdefault((d, i % k), []).append((c, 0))
    for d, c, a in plan.relays:
        off = (d - a) % n
        ch = min(range(plan.channels[off]), key=lambda i: (len(queues[(off, i)]), i))
        queues[(off, ch)].append((c, a))
    b = asm.Builder()
    arrival: dict[tuple[int, int, int], int] = {}  # (owner, chunk, at GPU) -> transfer
    for pos in range(max(len(q) for q in queues.values())):
        for (off, ch), q in sorted(queues.items()):
            if pos >= len(q):
                continue
            c, a = q[pos]
            for owner in range(n):
                via = (owner + a) % n
                dst = (via + off) % n
                dep = (arrival[(owner, c, via)],) if a else ()
                arrival[(owner, c, dst)] = b.add(via, dst, owner * cpr + c, dep, channel=ch,
                                                  stream=ch)  # fmt: skip
    return b.arrays(f"ccltune-mesh-{name}", Collective.ALLGATHER, n, cpr,
                    channels=max(plan.channels.values()))  # fmt: skip


A2A_FILL_CHUNKS = (32, 64)  # chunks per pair the AlltoAll fill tries: in whole chunks, 32
# leave MI300X's busiest channel at 8 (as direct sends), 64 bring it to 15 of 16


def fill_alltoall_plan(group: GroupTopo, budget: int) -> FillPlan | None:
    """`fill_plan`'s channel deal for AlltoAll, where a relay costs a second hop (the relay does
    not need the data): the fewest chunks per channel L, over `A2A_FILL_CHUNKS` chunks per pair
    C, such that each offset d relays C - L k_d chunks over two spare offsets a + b = d (mod n)
    within their room (L k - C each). `relays`: (d, chunk, a). None where no L beats direct
    sends on the same channels."""
    base = fill_plan(group, budget)
    if base is None:
        return None
    n, channels = base.n, base.channels
    spare = [e for e, k in channels.items() if k > min(channels.values())]
    best: FillPlan | None = None
    for cpr in A2A_FILL_CHUNKS:
        direct = -(-cpr // min(channels.values()))  # busiest channel with direct sends only
        for per in range(-(-(n - 1) * cpr // budget), direct):
            relays = _a2a_relays(channels, spare, n, cpr, per)
            if relays is not None:
                if best is None or per / cpr < best.per_channel / best.cpr:
                    best = FillPlan(n, cpr, channels, per, tuple(relays))
                break
    return best


def _a2a_relays(channels: dict[int, int], spare: list[int], n: int, cpr: int,
                per: int) -> list[tuple[int, int, int]] | None:  # fmt: skip
    """Relays (d, chunk, a) that leave at most `per` chunks on every channel, each through the
    spare offset pair with the most room left; None when they do not fit."""
    room = {e: per * channels[e] - cpr for e in spare}
    relays: list[tuple[int, int, int]] = []
    for d, k in sorted(channels.items()):
        for j in range(max(0, cpr - per * k)):
            ways = [(room[a] + room[b], a) for a in spare for b in [(d - a) % n]
                    if b in room and room[a] >= 1 + (a == b) and room[b] >= 1]  # fmt: skip
            if not ways:
                return None
            a = max(ways)[1]
            room[a] -= 1
            room[(d - a) % n] -= 1
            relays.append((d, j, a))
    return relays


def fill_alltoall(plan: FillPlan) -> ScheduleArrays:
    """The `fill_alltoall_plan` AlltoAll: chunk j of (s -> s + d) is (s n + s + d) cpr + j;
    relayed chunks' first hops first on their channels, every pair's own chunks next, the
    forwards last, each on the least loaded channel of its offset."""
    n, cpr = plan.n, plan.cpr
    relayed = {(d, j): a for d, j, a in plan.relays}
    # queues[(offset, channel)]: (pair offset d, chunk j, hop: 0 direct, 1 first, 2 forward)
    queues: dict[tuple[int, int], list[tuple[int, int, int]]] = {
        (e, ch): [] for e, k in plan.channels.items() for ch in range(k)}

    def push(off: int, item: tuple[int, int, int]) -> None:
        ch = min(range(plan.channels[off]), key=lambda i: (len(queues[(off, i)]), i))
        queues[(off, ch)].append(item)

    for (d, j), a in sorted(relayed.items()):
        push(a, (d, j, 1))
    for d in sorted(plan.channels):
        for j in range(cpr):
            if (d, j) not in relayed:
                push(d, (d, j, 0))
    for (d, j), a in sorted(relayed.items()):
        push((d - a) % n, (d, j, 2))
    b = asm.Builder()
    first: dict[tuple[int, int, int], int] = {}  # (sender, d, j) -> its first hop
    for pos in range(max(len(q) for q in queues.values())):
        for (off, ch), q in sorted(queues.items()):
            if pos >= len(q):
                continue
            d, j, hop = q[pos]
            for s in range(n):
                chunk = (s * n + (s + d) % n) * cpr + j
                if hop == 2:
                    via = (s + relayed[(d, j)]) % n
                    b.add(via, (s + d) % n, chunk, (first[(s, d, j)],), channel=ch, stream=ch)
                    continue
                t = b.add(s, (s + off) % n, chunk, (), channel=ch, stream=ch)
                if hop == 1:
                    first[(s, d, j)] = t
    return b.arrays(f"ccltune-mesh-alltoall-fill{cpr}", Collective.ALLTOALL, n, cpr,
                    channels=max(plan.channels.values()))  # fmt: skip
