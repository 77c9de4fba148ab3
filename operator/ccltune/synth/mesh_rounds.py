"""ReduceScatter / AllReduce on a full mesh with reduces chained in rounds (issue 18).

Every contribution to a (GPU, chunk) is an `rrc` (the reduce happens inside the receive, at the
threadblock rate the read-back already charges; no scratch, no `re`), so the reduces into one
chunk must be chained. Chained in the AllGather's order, all peers queue on one chunk at a time
(docs/synthesis.md "Single-server meshes"). Here the chains are laid out in rounds: in each round
every threadblock receives exactly one chunk and every chunk takes at most one reduce, so all
threadblocks stay busy and each chain advances one link per round (a Latin rotation: peer
offset i reduces into chunk (i + t) mod m of its channel's block in round t). mesh.py offers
them (docs/synthesis.md "Session 10: mesh reduces"):
- `rotation`: direct sends, k channels per pair (the most that fit the budget evenly).
- `fill_reduce`: on all of the budget when the peers do not divide it (MI300X: 32 threadblocks,
  7 peers; fill.fill_plan's channels per offset), the offsets with fewer channels relaying some
  contributions through a GPU that adds its own and forwards the sum in place of its own
  contribution (so a relay costs no extra transfer).
AllReduce: then the reduces mirrored (last round first, each connection the other way), so
the AllGather keeps every threadblock as busy; each send waits for the receive AG_AHEAD back on
its connection's reverse, so the two directions cannot fill each other's FIFO.
"""

from __future__ import annotations

import itertools

from ..api.common import Collective
from ..model.schedule.ir import ScheduleArrays
from . import assemble as asm

AG_AHEAD = 2  # AllReduce's second phase: sends of a connection ahead of its receives


def rotation(n: int, k: int, m: int, coll: Collective, name: str) -> ScheduleArrays:
    """Direct ReduceScatter (or AllReduce) on a full mesh of n GPUs, k channels per pair, m >=
    n - 1 chunks per channel: in round t (of m), the peer at offset i + 1 reduces into chunk
    h m + (i + t) mod m of GPU q's channel-h block. One queue per (sender, receiver, channel),
    so the simulator runs each connection in program order, as the file does."""
    if m < n - 1:
        raise ValueError(f"{m} chunks per channel cannot rotate over {n - 1} peers")
    cpr = k * m
    ops = [(t, (i + 1), h, h * m + (i + t) % m) for t in range(m) for h in range(k)
           for i in range(n - 1)]  # fmt: skip
    return _build(n, cpr, k, ops, [], coll, name)


def _build(n: int, cpr: int, channels: int, ops: list[tuple[int, int, int, int]],
           relays: list[tuple[int, int, int, int, int]], coll: Collective,
           name: str) -> ScheduleArrays:  # fmt: skip
    """The schedule of GPU 0's reduces `ops` (round, offset, channel, chunk: received from GPU
    -offset) translated to every GPU, and its `relays` (round, offset, channel, owner offset,
    chunk: GPU 0 receives from -offset the contribution to GPU owner's chunk, adds its own
    into scratch; its reduce into the owner, an op of offset `owner` there, waits for it)."""
    b = asm.Builder()
    last: dict[tuple[int, int], int] = {}  # (gpu, chunk) -> the last reduce into it
    relayed: dict[tuple[int, int], int] = {}  # (relay gpu, owner chunk) -> its receive
    events = sorted([(t, 0, e, h, j, 0) for t, e, h, j in ops]
                    + [(t, 1, e, h, j, o) for t, e, h, o, j in relays])  # fmt: skip
    for _, kind, e, h, j, o in events:
        for q in range(n):
            src = (q - e) % n
            if kind:  # a relay: into scratch at q, owner q + o
                c = ((q + o) % n) * cpr + j
                relayed[(q, c)] = b.add(src, q, c, (), channel=h, reduce=True, stream=h)
                continue
            c = q * cpr + j
            deps = tuple(d for d in (last.get((q, c)), relayed.get((src, c))) if d is not None)
            last[(q, c)] = b.add(src, q, c, deps, channel=h, reduce=True, stream=h)
    rs = b.arrays(name, Collective.REDUCESCATTER, n, cpr, channels=channels)
    if coll == Collective.REDUCESCATTER:
        return rs
    return asm.allreduce(rs, _mirror(n, cpr, channels, ops, relays, name), name)


def _mirror(n: int, cpr: int, channels: int, ops: list[tuple[int, int, int, int]],
            relays: list[tuple[int, int, int, int, int]], name: str) -> ScheduleArrays:  # fmt: skip
    """AllReduce's AllGather: the reduces mirrored, last round first, each on the connection
    the other way (the same channel; fill_plan gives offsets d and n - d the same channels):
    the owner sends where its reduces came from, a relay forwards to the GPU it relayed for.
    A send waits for the receive AG_AHEAD back on its connection's reverse (FIFO room)."""
    rounds = max(t for t, *_ in ops) + 1
    events = sorted([(rounds - 1 - t, 0, e, h, j, 0) for t, e, h, j in ops]
                    + [(rounds - 1 - t, 1, e, h, j, o) for t, e, h, o, j in relays])  # fmt: skip
    b = asm.Builder()
    got: dict[tuple[int, int], int] = {}  # (gpu, chunk) -> its receive
    sent: dict[tuple[int, int, int], list[int]] = {}  # (receiver, sender, channel) -> transfers
    for _, kind, e, h, j, o in events:
        for q in range(n):
            dst = (q - e) % n
            c = (((q + o) % n) if kind else q) * cpr + j
            mine, back = sent.setdefault((dst, q, h), []), sent.get((q, dst, h), [])
            x = len(mine) - AG_AHEAD  # this connection's x-th send: after receive x - 2
            deps = tuple(d for d in (got.get((q, c)), back[x] if 0 <= x < len(back) else None)
                         if d is not None)  # fmt: skip
            got[(dst, c)] = b.add(q, dst, c, deps, channel=h, stream=h)
            mine.append(got[(dst, c)])
    return b.arrays(f"{name}-ag", Collective.ALLGATHER, n, cpr, channels=channels)


def fill_rounds(n: int, channels: dict[int, int], budget: int
                ) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int, int, int]]] | None:  # fmt: skip
    """GPU 0's reduces and relays in n - 1 rounds on all `budget` threadblocks (`channels`:
    per peer offset, fill.fill_plan's), C = budget chunks: chunk j takes offset
    order[(j + t) mod (n - 1)] in round t; where an offset has more chunks in a round than
    channels, one of them is relayed by a GPU on an offset with a channel to spare in some
    earlier round (before that GPU's own reduce into the chunk). The first offset order (over
    permutations) whose relays all match; None if none does (or the search is too large)."""
    peers = n - 1
    if sum(channels.values()) != budget or peers > 7:
        return None
    cpr = budget
    for order in itertools.permutations(range(1, n)):
        pos = {e: i for i, e in enumerate(order)}
        count = {(e, t): sum(1 for j in range(cpr) if order[(j + t) % peers] == e)
                 for e in range(1, n) for t in range(peers)}  # fmt: skip
        excess = [(t, d) for t in range(peers) for d in range(1, n)
                  for _ in range(count[(d, t)] - channels[d])]  # fmt: skip
        spare = [(t, e) for t in range(peers) for e in range(1, n)
                 for _ in range(channels[e] - count[(e, t)])]  # fmt: skip
        if len(excess) != len(spare):
            continue

        def fits(x: tuple[int, int], s: tuple[int, int], pos: dict[int, int] = pos) -> bool:
            (t, d), (ts, e1) = x, s
            e2 = (d - e1) % n
            # the relay's own reduce into the chunk runs in round (pos[e2] - pos[d] + t)
            return e1 != d and e2 != 0 and ts < (pos[e2] - pos[d] + t) % peers

        match = _perfect_matching(excess, spare, fits)
        if match is None:
            continue
        # One relay per chunk: its own reduce into the chunk (the forward) is then never
        # relayed itself, and no two relays write one GPU's partial sum of it.
        relays: list[tuple[int, int, int, int, int]] = []
        dropped: set[tuple[int, int]] = set()  # (round, chunk)
        for x, s in zip(excess, match, strict=True):
            t, d = x
            j = next((j for j in range(cpr) if order[(j + t) % peers] == d
                      and all(j != c for _, c in dropped)), None)  # fmt: skip
            if j is None:
                break
            dropped.add((t, j))
            relays.append((s[0], s[1], -1, (d - s[1]) % n, j))
        if len(relays) < len(excess):
            continue
        # channels: in each round an offset's chunks and relays take channels 0, 1, ...
        ops: list[tuple[int, int, int, int]] = []
        out: list[tuple[int, int, int, int, int]] = []
        for t in range(peers):
            for e in range(1, n):
                mine = [j for j in range(cpr) if order[(j + t) % peers] == e
                        and (t, j) not in dropped]  # fmt: skip
                ops += [(t, e, h, j) for h, j in enumerate(mine)]
                rel = [r for r in relays if r[0] == t and r[1] == e]
                out += [(t, e, len(mine) + h, o, j) for h, (_, _, _, o, j) in enumerate(rel)]
        return ops, out
    return None


def fill_reduce(n: int, channels: dict[int, int], budget: int, coll: Collective,
                name: str) -> ScheduleArrays | None:  # fmt: skip
    """`fill_rounds`' ReduceScatter (or AllReduce) schedule; None where it finds none."""
    found = fill_rounds(n, channels, budget)
    if found is None:
        return None
    ops, relays = found
    return _build(n, budget, max(channels.values()), ops, relays, coll, name)


def _perfect_matching(left: list[tuple[int, int]], right: list[tuple[int, int]],
                      ok: object) -> list[tuple[int, int]] | None:  # fmt: skip
    """A perfect matching of `left` to `right` under `ok(l, r)` (augmenting paths), as the
    right item matched to each left one; None if there is none."""
    assert callable(ok)
    holder: dict[int, int] = {}

    def augment(i: int, seen: set[int]) -> bool:
        for r in range(len(right)):
            if r in seen or not ok(left[i], right[r]):
                continue
            seen.add(r)
            if r not in holder or augment(holder[r], seen):
                holder[r] = i
                return True
        return False

    for i in range(len(left)):
        if not augment(i, set()):
            return None
    by_left = {i: r for r, i in holder.items()}
    return [right[by_left[i]] for i in range(len(left))]
