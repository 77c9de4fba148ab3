"""Assemble full schedules (model.ir) from sketches, their solved sub-demands and split ratios.

One-to-all sketches become every collective (SyCCL §4.3): AllGather is N broadcasts, the sketch
of rank 0 mapped to rank r by translating coordinates (an automorphism of the symmetric fabric);
AlltoAll is N scatters mapped the same way; ReduceScatter runs AllGather backwards (every transfer
reversed into a reduce); AllReduce is ReduceScatter followed by AllGather on the same chunks.
Deps follow the data: a transfer waits only for the transfer that brought its chunk to the
sender, so stages overlap across chunks wherever the data allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..api.cluster import Dimension
from ..api.common import Collective
from ..model.schedule.ir import ScheduleArrays, dep_csr
from ..model.sim.arrays import sorted_unique
from ..model.sim.translations import Translations
from .group import GroupTopo
from .milp import SubDemand, SubSchedule
from .sketch import Sketch, Stage

# Blocks of chunks map round-robin onto at most this many MSCCL channels (threadblock pairs).
MAX_CHANNELS = 8
FIFO_SLOTS = 1
REDUCE_WINDOW = 1
Chain = tuple[int, int]  # (rank, chunk): the buffer a chain of reduces writes (`reverse`)
# Split sketches bundled per AllGather (bundled_picks): each costs a 512-rank lowering and a
# full read-back per file timed (docs/synthesis-scale.md, "Bundled AllGather on 512 GPUs").
BUNDLE_SHORTLIST = 1


def stage_demand(dims: list[Dimension], stage: Stage, symmetric: bool, pieces: int) -> SubDemand:
    """The sub-demand of one stage inside the group that holds the data, source at position 0."""
    d = dims[stage.dim]
    group = GroupTopo.of(d)
    if stage.kind == "relay":
        return SubDemand(group, (0,), (stage.offset,), symmetric, pieces)
    return SubDemand(group, (0,), tuple(sorted(stage.targets(d.size))), symmetric, pieces)


class Patterns:
    """Solved sub-schedules by canonical key; `get` maps them onto an isomorphic demand."""

    def __init__(self, solved: dict[tuple[object, ...], SubSchedule]) -> None:
        self.solved = solved
        self._mapped: dict[SubDemand, tuple[tuple[int, int, int, int], ...]] = {}

    def sends(self, demand: SubDemand) -> tuple[tuple[int, int, int, int], ...]:
        got = self._mapped.get(demand)
        if got is None:
            base = self.solved[demand.key()]
            got = tuple(sorted(base.mapped(demand).sends))
            self._mapped[demand] = got
        return got


class Builder:
    """Accumulates transfers into flat lists (ScheduleArrays at the end)."""

    def __init__(self) -> None:
        # Transfers of one stream between one (src, dst) pair run in program order, FIFO_SLOTS
        # at a time, as NCCL's connection FIFO does: stage 2 of piece j overlaps stage 1 of later
        # pieces instead of all pieces sharing the link and arriving together (the simulator
        # overlaps a queued step's latency). Symmetric collectives queue per connection over
        # all roots instead (`translate_roots`).
        self.last: dict[tuple[int, int, int], list[int]] = {}
        self.src: list[int] = []
        self.dst: list[int] = []
        self.chunk: list[int] = []
        self.count: list[int] = []
        self.reduce: list[bool] = []
        self.channel: list[int] = []
        self.deps: list[tuple[int, ...]] = []
        self.stage: list[int] = []  # sketch stage each transfer belongs to (bundle_roots)
        self.at_stage = 0

    def add(self, src: int, dst: int, chunk: int, deps: tuple[int, ...], count: int = 1,
            channel: int = 0, reduce: bool = False, stream: int | None = None) -> int:  # fmt: skip
        if stream is not None:
            inflight = self.last.setdefault((src, dst, stream), [])
            if len(inflight) >= FIFO_SLOTS:
                prev = inflight.pop(0)
                if prev not in deps:
                    deps = (*deps, prev)
            inflight.append(len(self.src))
        self.src.append(src)
        self.dst.append(dst)
        self.chunk.append(chunk)
        self.count.append(count)
        self.reduce.append(reduce)
        self.channel.append(channel)
        self.deps.append(deps)
        self.stage.append(self.at_stage)
        return len(self.src) - 1

    def __len__(self) -> int:
        return len(self.src)

    def arrays(self, name: str, coll: Collective, nranks: int, cpr: int, root: int = 0,
               channels: int = 1) -> ScheduleArrays:  # fmt: skip
        ptr, idx = dep_csr(self.deps)
        return ScheduleArrays(
            name=name, collective=coll, nranks=nranks, chunks_per_rank=cpr,
            src=np.asarray(self.src, dtype=np.int32), dst=np.asarray(self.dst, dtype=np.int32),
            chunk=np.asarray(self.chunk, dtype=np.int64),
            count=np.asarray(self.count, dtype=np.int32),
            reduce=np.asarray(self.reduce, dtype=bool),
            channel=np.asarray(self.channel, dtype=np.int32),
            dep_ptr=ptr, dep_idx=idx, root=root, channels=channels,
        )  # fmt: skip


class Fabric:
    """Coordinates of a symmetric cluster: rank <-> coords, innermost dimension first."""

    def __init__(self, dims: list[Dimension]) -> None:
        self.dims = dims
        self.sizes = [d.size for d in dims]
        self.strides = []
        s = 1
        for g in self.sizes:
            self.strides.append(s)
            s *= g
        self.nranks = s

    def coord(self, rank: int, d: int) -> int:
        return (rank // self.strides[d]) % self.sizes[d]

    def moved(self, rank: int, d: int, pos: int) -> int:
        """`rank` with its coordinate along d set to `pos`."""
        return rank + (pos - self.coord(rank, d)) * self.strides[d]

    def shifted(self, rank: int, d: int, delta: int) -> int:
        return self.moved(rank, d, (self.coord(rank, d) + delta) % self.sizes[d])


@dataclass(frozen=True, slots=True)
class Column:
    """One sketch (a specific copy) carrying `blocks` blocks of `pieces` chunks of each root."""

    sketch: Sketch
    blocks: int


@dataclass(frozen=True, slots=True)
class Tree:
    """One block: `sketch` spreading `chunk_ids` (one per piece) on `channel`."""

    sketch: Sketch
    chunk_ids: Sequence[int]
    channel: int = 0


def broadcast_tree(
    fab: Fabric, sketch: Sketch, patterns: Patterns, root: int, chunk_ids: Sequence[int],
    b: Builder, *, symmetric: bool, channel: int = 0,
) -> dict[tuple[int, int], int]:  # fmt: skip
    """Transfers spreading `chunk_ids` (one per piece) from `root`; returns arrivals."""
    return broadcast_trees(fab, [Tree(sketch, chunk_ids, channel)], patterns, root, b,
                           symmetric=symmetric)[0]  # fmt: skip


def broadcast_trees(
    fab: Fabric, trees: Sequence[Tree], patterns: Patterns, root: int, b: Builder, *,
    symmetric: bool, stream: bool = True,
) -> list[dict[tuple[int, int], int]]:  # fmt: skip
    """Every tree's transfers from `root`, emitted stage by stage across the trees.

    Emission order is the order of each connection's FIFO: stage-major puts every block's first
    hop ahead of later hops on a shared connection, so a rail that starts one sketch is not
    queued behind the rail hops that end another (dimension-order mixes). `stream=False` leaves
    the FIFO to `translate_roots` (all roots' transfers on a connection in one queue).
    """
    arrivals: list[dict[tuple[int, int], int]] = [{} for _ in trees]
    actives = [[root] for _ in trees]
    for k in range(max((len(t.sketch.stages) for t in trees), default=0)):
        for t, arrival, active in zip(trees, arrivals, actives, strict=True):
            if k < len(t.sketch.stages):
                stage = t.sketch.stages[k]
                b.at_stage = k
                active[:] = _stage(fab, stage, patterns, root if stream else None, root, t,
                                   arrival, active, b, symmetric)  # fmt: skip
    return arrivals


def _stage(fab: Fabric, stage: Stage, patterns: Patterns, stream: int | None, root: int, t: Tree,
           arrival: dict[tuple[int, int], int], active: list[int], b: Builder,
           symmetric: bool) -> list[int]:  # fmt: skip
    """One stage of one tree from every acting source; returns the next acting sources."""
    sends = patterns.sends(stage_demand(fab.dims, stage, symmetric, len(t.chunk_ids)))
    new_active: list[int] = []
    for a in active:
        for _, p, u, v in sends:
            ru = fab.shifted(a, stage.dim, u)
            rv = fab.shifted(a, stage.dim, v)
            if rv == root or (rv, p) in arrival:
                continue  # already holds this piece (the root after a relay)
            dep = arrival.get((ru, p))
            if dep is None and ru != root:
                raise AssertionError(f"pattern sends piece {p} from rank {ru} before it holds it")
            arrival[(rv, p)] = b.add(ru, rv, t.chunk_ids[p], () if dep is None else (dep,),
                                     channel=t.channel, stream=stream)  # fmt: skip
        if stage.kind == "relay":
            new_active.append(fab.shifted(a, stage.dim, stage.offset))
        else:
            new_active.append(a)
            new_active.extend(fab.shifted(a, stage.dim, q)
                              for q in stage.targets(fab.sizes[stage.dim]))  # fmt: skip
    return new_active


def _split(columns: list[Column], pieces: int) -> list[tuple[Sketch, int, int]]:
    """(sketch, first chunk offset, pieces) per block, columns in order."""
    out = []
    off = 0
    for col in columns:
        for _ in range(col.blocks):
            out.append((col.sketch, off, pieces))
            off += pieces
    return out


def allgather(fab: Fabric, columns: list[Column], patterns: Patterns, pieces: int,
              name: str) -> ScheduleArrays:  # fmt: skip
    """N broadcasts: rank r's is rank 0's translated by r's coordinates (patterns are relative
    to the acting source), so root 0's transfers are built once and translated as arrays."""
    one = allgather_root0(fab, columns, patterns, pieces, name)
    return translate_roots(fab, one, one.chunks_per_rank)


def allgather_root0(fab: Fabric, columns: list[Column], patterns: Patterns, pieces: int,
                    name: str) -> ScheduleArrays:  # fmt: skip
    """Root 0's broadcast of an AllGather; every other root's is its translate."""
    b = Builder()
    blocks = _split(columns, pieces)
    cpr = len(blocks) * pieces
    trees = [Tree(sk, range(off, off + k), ch % MAX_CHANNELS)
             for ch, (sk, off, k) in enumerate(blocks)]  # fmt: skip
    broadcast_trees(fab, trees, patterns, 0, b, symmetric=True, stream=False)
    return b.arrays(name, Collective.ALLGATHER, fab.nranks, cpr,
                    channels=min(len(blocks), MAX_CHANNELS))  # fmt: skip


def split_columns(columns: list[Column]) -> bool:
    """Whether a candidate uses a virtual split (sketch.Stage.span): its AllGather is bundled."""
    return any(st.span for c in columns for st in c.sketch.stages)


class AlignedFabric(Fabric):
    """`fab` with each dimension cut into the digits of its split (`spans`, stage order: the
    first the least significant): a shift adds digit-wise without carry, so a sub-spread stays
    inside an aligned block of consecutive positions (64 -> 4 x 4 x 4: GPU 5 sends to 4, 6, 7,
    not to 6, 7, 8). A switch is symmetric under any permutation of its positions, so links
    and loads are the same as the cyclic split's; what changes is that the chunks a GPU holds
    after each stage are consecutive on every GPU alike, and the schedule is invariant under
    the translations of the refined fabric (`refined`), which the symmetric simulator uses."""

    def __init__(self, dims: list[Dimension], spans: Sequence[Sequence[int]]) -> None:
        super().__init__(dims)
        if [int(np.prod(sp)) for sp in spans] != self.sizes:
            raise ValueError(f"spans {spans} do not split dimensions of sizes {self.sizes}")
        self.spans = [tuple(sp) for sp in spans]
        self.refined = [a for sp in self.spans for a in sp]

    def shifted(self, rank: int, d: int, delta: int) -> int:
        p, q, unit = self.coord(rank, d), 0, 1
        for a in self.spans[d]:
            q += (p // unit % a + delta // unit % a) % a * unit
            unit *= a
        return rank + (q - p) * self.strides[d]


def fabric_translations(fab: Fabric) -> Translations:
    """The translations that map `fab`'s root-0 part onto every root: digit-wise on an aligned
    fabric (a cyclic shift would carry out of an aligned block), per dimension otherwise."""
    return Translations(fab.refined if isinstance(fab, AlignedFabric) else fab.sizes)


def aligned_fabric(fab: Fabric, columns: list[Column]) -> Fabric:
    """The aligned fabric of the columns' common split (the fabric itself when they differ)."""
    splits = {c.sketch.split(fab.dims) for c in columns}
    if len(splits) != 1 or any(st.kind == "relay" for c in columns for st in c.sketch.stages):
        return fab
    return AlignedFabric(fab.dims, next(iter(splits)))


def bundled_steps(dims: list[Dimension], sketch: Sketch, max_count: int = 64) -> int | None:
    """Steps of the busiest send stream of `sketch`'s bundled AllGather (one chunk per root),
    from the digits alone: before a stage a GPU holds every chunk of the ranks that differ
    from it in the digits spread so far, in runs of consecutive ranks as long as the product
    of the spread digits below the first one not spread, each peer getting every run (split
    at `max_count`). None: a relay (bundling keeps to splits, which have none)."""
    spans = sketch.split(dims)
    order = [(d, k) for d, sp in enumerate(spans) for k in range(len(sp))]  # rank order
    seen = [0] * len(dims)
    held: set[tuple[int, int]] = set()
    worst = 0
    for st in sketch.stages:
        if st.kind == "relay":
            return None
        h = int(np.prod([spans[d][k] for d, k in held], dtype=np.int64))
        run = 1
        for d, k in order:
            if (d, k) not in held:
                break
            run *= spans[d][k]
        worst = max(worst, h // run * -(-run // max_count))
        held.add((st.dim, seen[st.dim]))
        seen[st.dim] += 1
    return worst


def bundled_picks(dims: list[Dimension], sketches: Sequence[Sketch], tb_gbps: float | None,
                  port_gbps: Sequence[float], keep: int, max_steps: int) -> list[Sketch]:
    """The split sketches worth bundling, fewest estimated seconds first, at most `keep`: those
    whose busiest send stream stays within `max_steps` (`bundled_steps`). The estimate runs
    the stages one after another (one chunk per root does not pipeline): each takes the longer
    of a threadblock moving the held chunks to one peer and the GPU's port moving them to
    every peer of the stage (no threadblock rate known: the port alone). It only orders the
    shortlist; the simulator chooses."""
    scored = []
    for sk in sketches:
        steps = bundled_steps(dims, sk)
        if steps is None or steps > max_steps or not any(st.span for st in sk.stages):
            continue
        held, est = 1, 0.0
        for st in sk.stages:
            peers = (st.span or dims[st.dim].size) - 1
            est += max(held / (tb_gbps or np.inf), peers * held / port_gbps[st.dim])
            held *= peers + 1
        scored.append((est, sk.label(dims), sk))
    return [sk for _, _, sk in sorted(scored, key=lambda x: x[:2])[:keep]]


def allgather_bundled(fab: Fabric, columns: list[Column], patterns: Patterns, pieces: int,
                      name: str, max_count: int = 64) -> ScheduleArrays:  # fmt: skip
    """AllGather whose transfers carry several roots' chunks: every root's broadcast (root 0's
    translated), then the transfers one GPU sends to one peer in the same stage and hop that
    move consecutive chunks merged into one of count <= `max_count`.

    Why: one step per chunk and root is 511 receives and 511 sends per GPU on 512 GPUs, more
    than 16 threadblocks of the executor's 64 steps hold. After an NVSwitch-first stage a GPU
    forwards its node's 8 chunks, consecutive slots, as one step; after rail parts 32 and 128.
    Sub-spreads act on aligned blocks (`AlignedFabric`): with the cyclic split a GPU near the
    end of a dimension holds chunks that wrap around and cannot merge (GPU 7 of an NVSwitch cut
    2 x 4 held 7 and 0), so its steps doubled past the limit while others' did not.
    Deps: the union of the merged transfers' (a merged transfer waits for all its chunks), and
    each connection's transfers in (stage, hop, chunks) order, one in flight (NCCL's FIFO).
    Both orders only go from a smaller (stage, hop) to a larger or stay within one (stage, hop),
    where no run waits for another's data: no cycle. The result
    is not one root's translate but is invariant under the refined fabric's translations
    (tested), which the symmetric simulator finds on its own."""
    b = Builder()
    blocks = _split(columns, pieces)
    cpr = len(blocks) * pieces
    trees = [Tree(sk, range(off, off + k)) for sk, off, k in blocks]
    fab = aligned_fabric(fab, columns)
    broadcast_trees(fab, trees, patterns, 0, b, symmetric=True, stream=False)
    t, n = len(b), fab.nranks
    stage = np.asarray(b.stage, dtype=np.int64)
    hop = np.zeros(t, dtype=np.int64)  # hops inside its stage (a pattern may relay)
    for i, deps in enumerate(b.deps):
        same = [hop[d] + 1 for d in deps if stage[d] == stage[i]]
        hop[i] = max(same, default=0)
    key0 = stage * (int(hop.max()) + 1) + hop
    grp = Translations(fab.refined if isinstance(fab, AlignedFabric) else fab.sizes)
    roots = np.arange(n, dtype=np.int64)[:, None]
    src = grp.add(roots, np.asarray(b.src, dtype=np.int64)[None, :]).ravel()
    dst = grp.add(roots, np.asarray(b.dst, dtype=np.int64)[None, :]).ravel()
    chunk = (np.asarray(b.chunk, dtype=np.int64)[None, :] + roots * cpr).ravel()
    key = np.tile(key0, n)
    if any(c != 1 for c in b.count):
        raise AssertionError("bundling expects one chunk per transfer")
    order = np.lexsort((chunk, key, dst, src))
    s_, d_, k_, c_ = src[order], dst[order], key[order], chunk[order]
    brk = np.ones(len(order), dtype=bool)
    brk[1:] = (
        (s_[1:] != s_[:-1]) | (d_[1:] != d_[:-1]) | (k_[1:] != k_[:-1]) | (c_[1:] != c_[:-1] + 1)
    )
    first = np.maximum.accumulate(np.where(brk, np.arange(len(order)), 0))
    start = brk | ((np.arange(len(order)) - first) % max_count == 0)
    run = np.cumsum(start) - 1
    runs = int(run[-1]) + 1
    new_of = np.empty(len(order), dtype=np.int64)
    new_of[order] = run
    heads = np.flatnonzero(start)
    m_src, m_dst, m_chunk = s_[heads], d_[heads], c_[heads]
    m_count = np.diff(np.append(heads, len(order)))
    # Data deps of every original transfer, root r's on root r's transfers, mapped to runs.
    ptr0 = np.zeros(t + 1, dtype=np.int64)
    np.cumsum([len(x) for x in b.deps], out=ptr0[1:])
    idx0 = np.fromiter((x for dd in b.deps for x in dd), dtype=np.int64, count=int(ptr0[-1]))
    owner0 = np.repeat(np.arange(t, dtype=np.int64), np.diff(ptr0))
    owner = (roots * t + owner0[None, :]).ravel()
    dep = (roots * t + idx0[None, :]).ravel()
    edges = [new_of[owner] * runs + new_of[dep]]
    # FIFO: the previous run on the connection, runs of one (stage, hop) ordered by their
    # chunks as the sender sees them (least owner relative to it), so every translate queues
    # alike (by absolute chunk ids the order would depend on where the sender sits).
    rel = np.minimum.reduceat(grp.sub(c_ // cpr, s_) * cpr + c_ % cpr, heads)
    fifo = np.lexsort((rel, k_[heads], m_dst, m_src))
    same_conn = (m_src[fifo][1:] == m_src[fifo][:-1]) & (m_dst[fifo][1:] == m_dst[fifo][:-1])
    q = np.flatnonzero(same_conn) + 1
    edges.append(fifo[q] * runs + fifo[q - 1])
    e = sorted_unique(np.concatenate(edges))
    e = e[e // runs != e % runs]
    ptr = np.zeros(runs + 1, dtype=np.int64)
    np.cumsum(np.bincount(e // runs, minlength=runs), out=ptr[1:])
    return ScheduleArrays(
        name=name, collective=Collective.ALLGATHER, nranks=n, chunks_per_rank=cpr,
        src=m_src.astype(np.int32), dst=m_dst.astype(np.int32), chunk=m_chunk,
        count=m_count.astype(np.int32), reduce=np.zeros(runs, dtype=bool),
        channel=np.zeros(runs, dtype=np.int32), dep_ptr=ptr, dep_idx=e % runs, channels=1,
    )  # fmt: skip


def translate_roots(fab: Fabric, one: ScheduleArrays, cpr: int,
                    window: int = FIFO_SLOTS) -> ScheduleArrays:  # fmt: skip
    """Root 0's transfers repeated for every root r, ranks moved by r's coordinates (root r's
    block follows root r-1's, as a loop over roots would build it), each transfer also waiting
    for the one `window` places before it on its connection (src, dst).

    That queue is NCCL's connection FIFO: every root's transfers on a connection in one queue,
    ordered by their position in root 0's emission. The simulator lets the next step flow as
    soon as its queue predecessor drains (no second latency), so a connection streams its queue
    back to back instead of splitting its bandwidth over every root's flows at once. Root r's
    transfer at position p rides (src0[p] + r, dst0[p] + r): a connection's queue holds the
    positions whose dst0 - src0 is the connection's, one root each, so the queue is found on
    root 0 and translated (no sort over N x transfers). The order is the same for every
    translate (symmetric engine) and every edge raises the root-0 position: no cycle can form.
    """
    grp = fabric_translations(fab)
    n, t = fab.nranks, len(one)
    roots = np.arange(n, dtype=np.int64)[:, None]
    src0, dst0 = one.src.astype(np.int64), one.dst.astype(np.int64)
    edges0 = sorted_unique(np.repeat(np.arange(t, dtype=np.int64), np.diff(one.dep_ptr)) * t
                           + one.dep_idx)  # fmt: skip
    owner0, dep0 = edges0 // t, edges0 % t
    ndeps = np.bincount(owner0, minlength=t)
    ptr0 = np.zeros(t + 1, dtype=np.int64)
    np.cumsum(ndeps, out=ptr0[1:])

    # Queue predecessor `prev` on root 0's terms, on the root `shift` away from the transfer's.
    delta = grp.sub(dst0, src0)
    order = np.argsort(delta * t + np.arange(t), kind="stable")
    same = delta[order[window:]] == delta[order[:-window]]
    prev = np.full(t, -1, dtype=np.int64)
    prev[order[window:][same]] = order[:-window][same]
    queued = prev >= 0
    shift = np.zeros(t, dtype=np.int64)
    shift[queued] = grp.sub(src0[queued], src0[prev[queued]])
    # Where the deps of p sort below prev (same root), and whether prev is one of them already.
    key = np.arange(t, dtype=np.int64) * t + np.maximum(prev, 0)
    at = np.searchsorted(edges0, key)
    known = (shift == 0) & (at < ptr0[1:])
    known[known] = edges0[at[known]] == key[known]
    queued &= ~known
    below = at - ptr0[:-1]

    ptr = np.zeros(n * t + 1, dtype=np.int64)
    np.cumsum(np.tile(ndeps + queued, n), out=ptr[1:])
    pred_root = grp.add(np.broadcast_to(roots, (n, t)), shift[None, :])
    # Rows stay sorted: the queue predecessor goes before, after or among the root's own deps.
    k = np.where(pred_root < roots, 0, np.where(pred_root > roots, ndeps, below))
    idx = np.empty(int(ptr[-1]), dtype=np.int64)
    j = np.arange(len(dep0), dtype=np.int64) - ptr0[owner0]
    rows = roots * t + owner0
    idx[ptr[rows] + j + (queued[owner0] & (j >= k[:, owner0]))] = roots * t + dep0
    q = np.flatnonzero(queued)
    idx[ptr[roots * t + q] + k[:, q]] = pred_root[:, q] * t + prev[q]

    chunk = np.tile(one.chunk, n) + np.repeat(np.arange(n, dtype=np.int64) * cpr, t)
    return replace(
        one, src=grp.add(roots, src0).ravel().astype(np.int32),
        dst=grp.add(roots, dst0).ravel().astype(np.int32), chunk=chunk,
        count=np.tile(one.count, n), reduce=np.tile(one.reduce, n),
        channel=np.tile(one.channel, n), dep_ptr=ptr, dep_idx=idx,
    )  # fmt: skip


def broadcast(fab: Fabric, columns: list[Column], patterns: Patterns, pieces: int, root: int,
              name: str) -> ScheduleArrays:  # fmt: skip
    b = Builder()
    blocks = _split(columns, pieces)
    trees = [Tree(sk, range(off, off + k), ch % MAX_CHANNELS)
             for ch, (sk, off, k) in enumerate(blocks)]  # fmt: skip
    broadcast_trees(fab, trees, patterns, root, b, symmetric=False)
    return b.arrays(name, Collective.BROADCAST, fab.nranks, len(blocks) * pieces, root=root,
                    channels=min(len(blocks), MAX_CHANNELS))  # fmt: skip


def reverse(
    ag: ScheduleArrays, coll: Collective, name: str, fab: Fabric | None = None,
    in_rounds: bool = False,
) -> ScheduleArrays:  # fmt: skip
    """AllGather run backwards: each transfer reversed into a reduce, deps reversed.

    Reduces into one (rank, chunk) are chained so that no two writes race (the checker demands a
    dependency path between writes of one buffer). By default they chain in reverse AllGather
    emission order, and reduces of one owner's data into one GPU over one dimension are chained
    as well: otherwise every piece's chain shares the port, all finish together, and the next
    stage cannot start early (no overlap). `in_rounds`: the chains' order and every connection's
    queue (`translate_roots` queues by emission) follow `reduce_rounds` instead, so the reduces
    a GPU takes in from its peers at once go into different chunks (docs/synthesis.md,
    "syccl-a800-16 ReduceScatter (session 9)"); neither order wins on every schedule.
    """
    n = len(ag)
    succ: list[list[int]] = [[] for _ in range(n)]
    ptr, idx = ag.dep_ptr.tolist(), ag.dep_idx.tolist()
    for i in range(n):
        for d in idx[ptr[i] : ptr[i + 1]]:
            succ[d].append(i)
    # The reversed transfer i runs after the reversed children of i.
    order = list(range(n - 1, -1, -1))
    if in_rounds:
        rnd = reduce_rounds(ag, succ, fab)
        order.sort(key=lambda i: rnd[i])  # stable: reverse emission within a round
    new_of = {old: pos for pos, old in enumerate(order)}
    src, dst, chunk = ag.dst.tolist(), ag.src.tolist(), ag.chunk.tolist()
    b = Builder()
    last_chunk: dict[Chain, int] = {}
    window: dict[tuple[int, int, int], list[int]] = {}
    cpr = ag.chunks_per_rank
    for old in order:
        deps = {new_of[c] for c in succ[old]}
        s_, d_, c_ = src[old], dst[old], chunk[old]
        prev = last_chunk.get((d_, c_))
        if prev is not None:
            deps.add(prev)
        if not in_rounds:
            dim = 0
            if fab is not None:
                dim = next(k for k in range(len(fab.dims)) if fab.coord(s_, k) != fab.coord(d_, k))
            # At most REDUCE_WINDOW reduces of one owner into one port in flight: pieces
            # complete in order, so the next stage starts on the first ones (measured best at 1).
            inflight = window.setdefault((d_, c_ // cpr, dim), [])
            if len(inflight) >= REDUCE_WINDOW:
                deps.add(inflight.pop(0))
        i = b.add(s_, d_, c_, tuple(sorted(deps)), int(ag.count[old]), int(ag.channel[old]),
                  reduce=True)  # fmt: skip
        last_chunk[(d_, c_)] = i
        if not in_rounds:
            inflight.append(i)
    return b.arrays(name, coll, ag.nranks, ag.chunks_per_rank, channels=ag.channels)


def reduce_rounds(ag: ScheduleArrays, succ: list[list[int]], fab: Fabric | None) -> list[int]:
    """Per transfer of root 0's AllGather `ag`, the round its reverse (a reduce) runs in.

    In a round each connection class carries one reduce (a translate of root 0's part: the
    transfers of one offset dst - src share every connection of that offset, one root each) and
    each (rank, chunk) takes one reduce; a reduce runs after every reduce into the chunk it
    sends. Each round takes a maximum matching of connection classes to chunks, the ready
    reduces with the most work still ahead of them first: the reduces left in their chunk's
    chain plus in each chain their data then joins, to the owner. Chaining the reduces in AG
    emission order instead put all of a GPU's peers on one chunk at a time (docs/synthesis.md,
    "syccl-a800-16 ReduceScatter (session 9)").
    """
    n = len(ag)
    ptr, idx = ag.dep_ptr.tolist(), ag.dep_idx.tolist()
    # The chain (rank, chunk) each reduce writes, numbered; and the chain its sum then joins.
    pairs = ag.src.astype(np.int64) * ag.chunks_per_rank * ag.nranks + ag.chunk
    keys, into = np.unique(pairs, return_inverse=True)
    then = np.full(len(keys), -1, dtype=np.int64)
    for i in range(n):
        for d in idx[ptr[i] : ptr[i + 1]]:
            then[into[i]] = into[d]
    depth = np.zeros(len(keys), dtype=np.int64)
    for c in _chain_order(then):
        if then[c] >= 0:
            depth[c] = depth[then[c]] + 1
    levels = [np.flatnonzero(depth == k) for k in range(1, int(depth.max(initial=0)) + 1)]
    left = np.bincount(into, minlength=len(keys)).astype(np.int64)
    if fab is not None:
        conn = fabric_translations(fab).sub(ag.src.astype(np.int64), ag.dst.astype(np.int64))
    else:
        conn = ag.src.astype(np.int64) * ag.nranks + ag.dst
    waiting = [len(s) for s in succ]
    ready = np.array([i for i in range(n) if not waiting[i]], dtype=np.int64)
    rnd = np.full(n, -1, dtype=np.int64)
    r = 0
    while len(ready):
        ahead = left.copy()
        for lv in levels:
            ahead[lv] += ahead[then[lv]]
        ranked = ready[np.lexsort((-ready, -ahead[into[ready]]))]
        picked = _matching(ranked, conn, into)
        rnd[picked] = r
        left[into[picked]] -= 1
        fresh = []
        for i in picked:
            for d in idx[ptr[i] : ptr[i + 1]]:
                waiting[d] -= 1
                if not waiting[d]:
                    fresh.append(d)
        ready = np.concatenate((ready[rnd[ready] < 0], np.array(fresh, dtype=np.int64)))
        r += 1
    return rnd.tolist()


def _chain_order(then: np.ndarray) -> list[int]:
    """Chains ordered so each comes after the chain its sum joins."""
    seen = np.zeros(len(then), dtype=bool)
    out: list[int] = []
    for c in range(len(then)):
        path = []
        while c >= 0 and not seen[c]:
            seen[c] = True
            path.append(c)
            c = int(then[c])
        out += reversed(path)
    return out


def _matching(ranked: np.ndarray, conn: np.ndarray, into: np.ndarray) -> list[int]:
    """A maximum matching of connection classes to chains among the ready reduces `ranked`
    (most urgent first): augmenting paths from each class in order of its most urgent one."""
    by_conn: dict[int, list[int]] = {}
    for i, k in zip(ranked.tolist(), conn[ranked].tolist(), strict=True):
        by_conn.setdefault(k, []).append(i)
    holder: dict[int, int] = {}
    picked: dict[int, int] = {}

    def augment(k: int, seen: set[int]) -> bool:
        for i in by_conn[k]:
            c = int(into[i])
            if c in seen:
                continue
            seen.add(c)
            j = holder.get(c)
            if j is None or augment(int(conn[j]), seen):
                holder[c], picked[k] = i, i
                return True
        return False

    for k in by_conn:
        augment(k, set())
    return list(picked.values())


def allreduce(rs: ScheduleArrays, ag: ScheduleArrays, name: str) -> ScheduleArrays:
    """ReduceScatter then AllGather on the same chunks; the owner's final reduces gate its sends."""
    b = Builder()
    ptr, idx = rs.dep_ptr.tolist(), rs.dep_idx.tolist()
    final: dict[tuple[int, int], list[int]] = {}
    for i in range(len(rs)):
        b.add(int(rs.src[i]), int(rs.dst[i]), int(rs.chunk[i]), tuple(idx[ptr[i] : ptr[i + 1]]),
              int(rs.count[i]), int(rs.channel[i]), reduce=True)  # fmt: skip
        final.setdefault((int(rs.dst[i]), int(rs.chunk[i])), []).append(i)
    off = len(rs)
    # The last reduce into the owner is chained after all others, so it alone is enough.
    ptr, idx = ag.dep_ptr.tolist(), ag.dep_idx.tolist()
    for i in range(len(ag)):
        deps = tuple(off + d for d in idx[ptr[i] : ptr[i + 1]])
        s, c = int(ag.src[i]), int(ag.chunk[i])
        if s == c // ag.chunks_per_rank:  # the owner sends the reduced chunk: after its last reduce
            into = final.get((s, c), [])
            if into and max(into) not in deps:
                deps = (*deps, max(into))
        # The receiver must also have sent its partial sum before being overwritten.
        b.add(s, int(ag.dst[i]), c, deps, int(ag.count[i]), int(ag.channel[i]))
    # AllReduce's chunk space is the whole buffer: the N*C chunks the phases work on.
    return b.arrays(name, Collective.ALLREDUCE, ag.nranks, ag.nranks * ag.chunks_per_rank,
                    channels=ag.channels)  # fmt: skip


def fold_channels(arr: ScheduleArrays, channels: int) -> ScheduleArrays:
    """The same transfers on at most `channels` channels (channel c -> c mod channels): fewer
    threadblocks per GPU (each (peer, channel) needs one), more steps in each."""
    if arr.channels <= channels:
        return arr
    return replace(arr, channel=(arr.channel % channels).astype(np.int32), channels=channels)


def spread_channels(fab: Fabric, arr: ScheduleArrays, budget: int,
                    per_peer: int = MAX_CHANNELS) -> tuple[ScheduleArrays | None, int]:  # fmt: skip
    """`arr` with channels re-dealt so that each GPU needs at most `budget` threadblocks; None
    when even one channel per peer needs more. Returns the threadblocks the result needs (or the
    least it would).

    MSCCL runs one threadblock per (peer, channel), a GPU's sends and receives paired. Peers of
    one relative offset (dst - src, a translation) carry the same load on every GPU of a
    symmetric schedule, so each offset d gets k_d channels, sum k_d = threadblocks per GPU:
    one each, then one more at a time to the offset with the most transfers per threadblock
    (at most `per_peer`). Channels are assigned on root 0's transfers and repeated for every
    root, so the schedule stays translation invariant.
    """
    n = arr.nranks
    grp = fabric_translations(fab)
    translated = arr.collective != Collective.BROADCAST and len(arr) % n == 0
    t = len(arr) // n if translated else len(arr)
    delta = grp.sub(arr.dst[:t].astype(np.int64), arr.src[:t].astype(np.int64))
    if not translated:  # one root: per (sender, offset)
        delta = arr.src[:t].astype(np.int64) * n + delta
    classes, inv, load = np.unique(delta, return_inverse=True, return_counts=True)
    need = len(classes) if translated else int(np.bincount(classes // n).max())
    if need > budget:
        return None, need
    k = np.ones(len(classes), dtype=np.int64)
    cap = np.minimum(per_peer, load)
    for _ in range(budget - need if translated else 0):
        room = k < cap
        if not room.any():
            break
        i = int(np.argmax(np.where(room, load / k, -1.0)))
        k[i] += 1
    # A block keeps its channel where the offset has that many: a chunk's path stays on one
    # channel id, so fewer of its steps wait across threadblocks (each wait beyond the first
    # costs a nop step).
    chan0 = (arr.channel[:t] % k[inv]).astype(np.int32)
    channel = np.tile(chan0, n) if translated else chan0
    tbs = int(k.sum()) if translated else need
    return replace(arr, channel=channel, channels=int(k.max())), tbs


def alltoall(fab: Fabric, columns: list[Column], pieces: int, name: str) -> ScheduleArrays:
    """N scatters; each destination's chunks follow its sketch's dimension-ordered route."""
    n = fab.nranks
    blocks = _split(columns, pieces)
    cpr = len(blocks) * pieces
    b = Builder()
    for root in range(n):
        for ch, (sk, off, k) in enumerate(blocks):
            _scatter(fab, sk, root, off, k, cpr, b, ch % MAX_CHANNELS)
    return b.arrays(name, Collective.ALLTOALL, n, cpr, channels=min(len(blocks), MAX_CHANNELS))


def _scatter(fab: Fabric, sk: Sketch, root: int, off: int, k: int, cpr: int, b: Builder,
             ch: int) -> None:  # fmt: skip
    n = fab.nranks
    # Bundles: (holder, destinations, dep).
    bundles: list[tuple[int, list[int], int | None]] = [
        (root, [d for d in range(n) if d != root], None)
    ]
    for stage in sk.stages:
        d = stage.dim
        g = GroupTopo.of(fab.dims[d])
        out: list[tuple[int, list[int], int | None]] = []
        while bundles:
            holder, dests, dep = bundles.pop()
            here = fab.coord(holder, d)
            moving: dict[int, list[int]] = {}
            staying: list[int] = []
            for dest in dests:
                if stage.kind == "relay":
                    target = (here + stage.offset) % g.size if holder == root else here
                elif stage.span:  # a virtual sub-group: this stage's digit of the distance
                    digit = (fab.coord(dest, d) - here) % g.size // stage.stride % stage.span
                    target = (here + digit * stage.stride) % g.size
                else:
                    target = fab.coord(dest, d)
                if target == here:
                    staying.append(dest)
                else:
                    nxt = g.shortest_paths(here, target)[0][1]
                    moving.setdefault(nxt, []).append(dest)
            if staying:
                out.append((holder, staying, dep))
            for nxt, group in moving.items():
                to = fab.moved(holder, d, nxt)
                last = _emit(b, holder, to, root, group, n, off, k, cpr, dep, ch)
                rest = [x for x in group if x != to]
                if rest:
                    bundles.append((to, rest, last))
        bundles = out
    assert not bundles, f"scatter from {root} left data undelivered"


def _emit(b: Builder, src: int, dst: int, root: int, dests: list[int], n: int, off: int, k: int,
          cpr: int, dep: int | None, ch: int) -> int:  # fmt: skip
    """One transfer per run of consecutive chunk ids; returns a transfer all later hops can wait on."""
    ids = sorted((root * n + dest) * cpr + off + j for dest in dests for j in range(k))
    runs: list[tuple[int, int]] = []
    for c in ids:
        if runs and runs[-1][0] + runs[-1][1] == c:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((c, 1))
    deps = () if dep is None else (dep,)
    made = [b.add(src, dst, c, deps, cnt, ch) for c, cnt in runs]
    if len(made) == 1:
        return made[0]
    return _join(b, made)


def _join(b: Builder, made: list[int]) -> int:
    # Make the last run depend on the earlier ones so one index stands for the whole bundle.
    last = made[-1]
    b.deps[last] = tuple(sorted(set(b.deps[last]) | set(made[:-1])))
    return last
