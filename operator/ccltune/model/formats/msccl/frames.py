"""Each rank's frame of a schedule made of N translates of one root's transfers.

Synthesized collectives are root 0's transfers moved to every root (synth/assemble.py
translate_roots): block b of the transfer list is block 0 with every rank x replaced by P_b[x].
Seen from rank r = P_b[0], its peers and chunks are then rank 0's, mapped by P_b. The writer
sorts what it would otherwise sort by absolute rank (threadblocks, merges, final copies) in that
frame, and orders steps by a key shared by a transfer's translates, so rank r's part of the file
is rank 0's translated: the simulator can then time the file through one rank's transfers
(sim/symmetric_sim.py) instead of all N.

Only orderings and tie-breaks use the frames, never correctness: a schedule that is not exactly
translates of one block still gets a valid file (every rank's steps in a dependency order), just
not a translated one. `find_frames` returns None when the block layout does not hold at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Schedule


@dataclass(frozen=True, slots=True)
class Frames:
    """`to_rank[r]` maps rank 0's frame to rank r's (to_rank[r][0] == r); `of_rank` inverts it."""

    coll: Collective
    nranks: int
    per_block: int  # transfers per translate (block 0 is root 0's)
    chunks: int  # chunks per translation block of the chunk space (see `block`)
    to_rank: np.ndarray  # [N, N] int64
    of_rank: np.ndarray  # [N, N] int64: of_rank[r][p] is peer p seen from rank r
    root_of_block: np.ndarray  # [N]: where block b moves rank 0

    def rel(self, rank: int, peer: int) -> int:
        """`peer` seen from `rank` (-1 stays -1)."""
        return -1 if peer < 0 else int(self.of_rank[rank, peer])

    def block(self, k: int) -> int:
        """The part of the chunk space a translation moves as one (an owner's chunks; alltoall:
        a (source, destination) pair's): runs of slots that stay consecutive when translated."""
        return k // self.chunks

    def chunk_in(self, rank: int, k: int) -> int:
        """Rank 0's chunk `k` as rank `rank` sees it."""
        perm, n, c = self.to_rank[rank], self.nranks, self.chunks
        b, j = divmod(k, c)
        if self.coll == Collective.ALLTOALL:
            s, d = divmod(b, n)
            return int((perm[s] * n + perm[d]) * c + j)
        return int(perm[b] * c + j)


def _chunks_per_block(s: Schedule) -> int | None:
    coll, n = Collective(s.collective), s.nranks
    if coll in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL):
        return s.chunks_per_rank
    if coll == Collective.ALLREDUCE and s.chunks_per_rank % n == 0:
        return s.chunks_per_rank // n  # the buffer's N parts (synth/assemble.allreduce)
    return None


def find_frames(s: Schedule) -> Frames | None:
    """The frames of a schedule laid out as N blocks, each block 0 under a rank permutation
    with a distinct image of rank 0, every transfer of an orbit on its own sender and its own
    receiver (None otherwise: the writer then sorts by absolute rank)."""
    n, total = s.nranks, len(s.transfers)
    chunks = _chunks_per_block(s)
    if chunks is None or n < 2 or total == 0 or total % n:
        return None
    t = total // n
    ts = s.transfers
    src = np.fromiter((x.src for x in ts), dtype=np.int64, count=total).reshape(n, t)
    dst = np.fromiter((x.dst for x in ts), dtype=np.int64, count=total).reshape(n, t)
    ranks = np.arange(n, dtype=np.int64)[:, None]
    # An orbit's transfers start and end on distinct ranks: one send and one receive per rank.
    if not (np.array_equal(np.sort(src, axis=0), np.broadcast_to(ranks, src.shape))
            and np.array_equal(np.sort(dst, axis=0), np.broadcast_to(ranks, dst.shape))):  # fmt: skip
        return None
    perms = np.full((n, n), -1, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)[:, None]
    perms[rows, src[0][None, :]] = src
    perms[rows, dst[0][None, :]] = dst
    if (perms < 0).any():
        return None  # block 0 does not touch every rank
    if not (np.array_equal(np.take_along_axis(perms, np.broadcast_to(src[0], src.shape), 1), src)
            and np.array_equal(np.take_along_axis(perms, np.broadcast_to(dst[0], dst.shape), 1),
                               dst)):  # fmt: skip
        return None  # a rank of block 0 maps to two ranks
    if not np.array_equal(np.sort(perms, axis=1), np.broadcast_to(np.arange(n), perms.shape)):
        return None
    if not np.array_equal(np.sort(perms[:, 0]), np.arange(n)):
        return None
    to_rank = np.empty_like(perms)
    to_rank[perms[:, 0]] = perms
    of_rank = np.empty_like(to_rank)
    np.put_along_axis(of_rank, to_rank, np.broadcast_to(np.arange(n), to_rank.shape), 1)
    return Frames(Collective(s.collective), n, t, chunks, to_rank, of_rank, perms[:, 0].copy())


def translates_exactly(s: Schedule, f: Frames) -> bool:
    """Is `s` mapped to itself by every frame map, transfer by transfer (chunks, counts,
    reduce, channel and dependencies included), and do those maps form a group? Then every
    rank's lowering is rank 0's translated (writer.py lowers rank 0 alone)."""
    n, t, c = f.nranks, f.per_block, f.chunks
    to = f.to_rank
    # closure: P_a after P_b is the frame map of the rank it sends 0 to
    for a in range(n):
        if not np.array_equal(to[a][to], to[to[a]]):
            return False
    ts = s.transfers
    total = n * t

    def column(name: str) -> np.ndarray:
        return np.fromiter((getattr(x, name) for x in ts), dtype=np.int64,
                           count=total).reshape(n, t)  # fmt: skip

    chunk, count = column("chunk"), column("count")
    for col in (count, column("reduce"), column("channel")):
        if not (col == col[0]).all():
            return False
    first, last = chunk[0] // c, (chunk[0] + count[0] - 1) // c
    if not np.array_equal(first, last):
        return False  # a transfer's chunks must move as one block
    roots = f.root_of_block
    b, j = np.divmod(chunk[0], c)
    perm = to[roots]  # [blocks, N]
    if f.coll == Collective.ALLTOALL:
        src, dst = np.divmod(b, n)
        want = (perm[:, src] * n + perm[:, dst]) * c + j
    else:
        want = perm[:, b] * c + j
    if not np.array_equal(want, chunk):
        return False
    # dependencies: transfer (b, i) waits for the images under P_b of (0, i)'s
    lens = np.fromiter((len(x.deps) for x in ts), dtype=np.int64, count=total)
    dep = np.fromiter((d for x in ts for d in x.deps), dtype=np.int64, count=int(lens.sum()))
    owner = np.repeat(np.arange(total, dtype=np.int64), lens)
    if not np.array_equal(lens.reshape(n, t), np.broadcast_to(lens[:t], (n, t))):
        return False
    block_of_root = np.empty(n, dtype=np.int64)
    block_of_root[roots] = np.arange(n)
    base = owner < t
    o0, d0 = owner[base], dep[base]
    want_blk = block_of_root[to[roots[:, None], roots[d0 // t][None, :]]]  # [blocks, edges]
    want_edges = np.sort(((np.arange(n)[:, None] * t + o0[None, :]) * total
                          + want_blk * t + d0 % t).ravel())  # fmt: skip
    return bool(np.array_equal(want_edges, np.sort(owner * total + dep)))


__all__ = ["Frames", "find_frames", "translates_exactly"]
