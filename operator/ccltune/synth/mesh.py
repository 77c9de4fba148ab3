"""Synthesis on one server whose GPUs are joined by a mesh of direct links (issue 18).

The DGX-1 hybrid cube-mesh (1 or 2 NVLinks per pair, some pairs none) has no symmetric
dimension, and MI300X's xGMI full mesh is one dimension whose every pair is a link; on both the
whole collective is one sub-demand on the server's GPU graph (group.GroupTopo.gpu_mesh):
- AllGather: every GPU the origin of its k pieces, every GPU a receiver (milp.SubDemand with
  `origins`), solved by the sub-demand MILP under its node limit (greedy where the model is too
  large). The pattern is copied onto `channels` channels (one threadblock per peer and channel:
  the per-threadblock rate, not the link, bounds one stream) and `depth` times on each channel
  (copies queue on their channel, so a later copy's first hop overlaps an earlier copy's relay).
- ReduceScatter: the AllGather reversed; AllReduce: ReduceScatter then AllGather. On a full
  mesh also direct sends whose contributions arrive at once into scratch and are reduced
  locally (formats/msccl/scratch.py), instead of reduces chained into one buffer: offered
  where the read-back charges local reduces (SCRATCH_REDUCES). On a full mesh of equal links,
  `rrc` chains laid out in rounds on the whole budget (mesh_rounds.py). On a mesh of unequal
  links also several rings at once (mesh_rings.py; the cube-mesh quad).
- AlltoAll: each pair's data split into pieces over direct and one-relay paths by an LP that
  minimises the busiest link's load per lane (max-flow routing: on the cube-mesh a 1-link
  pair's data partly rides a 2-link neighbour), on every channel; beside the copy's
  threadblocks, per what a link's channels move (`connection_caps`).
- Fills (AllGather, AlltoAll) on a full uniform mesh whose peers do not divide the SM budget
  (MI300X: 32 threadblocks, 7 peers): every threadblock carries the same share, the excess of
  the peers with fewer channels relayed (`fill_plan`); evaluated after the other variants.
Every variant is simulated in full (4-8 GPUs), the best timed as the file it would be (with
the writer's default step order and with sends early, the faster kept), and NCCL's default is
kept wherever it is faster (engine._pick). Multi-node clusters of such
servers are not synthesized here (the asymmetric branch keeps NCCL's default).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import highspy
import numpy as np

from ..api.cluster import ClusterTopology
from ..api.common import Collective
from ..model.cost.gpu import gpu_physics
from ..model.cost.protocols import PROTOCOLS, protocol_cost
from ..model.formats.msccl import scratch
from ..model.formats.msccl.limits import MAX_STEPS, first_selected
from ..model.formats.msccl.slicing import CHARGE_LOCAL_STEPS
from ..model.formats.msccl.stream import render_lowering
from ..model.formats.msccl.writer import MscclFormatError, MscclLowering, lower_msccl
from ..model.nccl.default import nccl_graph
from ..model.schedule.ir import ScheduleArrays
from ..model.sim.routing import Router
from ..model.sim.simulate import simulate
from . import assemble as asm
from . import mesh_rings, mesh_rounds
from .fill import MAX_CHUNKS, FillPlan, fill_allgather, fill_alltoall, fill_alltoall_plan, fill_plan
from .grid import FILE_FINALISTS, evaluation_order, file_time
from .group import GroupTopo
from .milp import SubDemand, SubSchedule, greedy, solve
from .quiet import new_highs

PIECES = (1, 2, 4)  # AllGather pieces per GPU in the sub-demand pattern
DEPTHS = (1, 2, 4)  # pattern copies queued on one channel
A2A_PIECES = (1, 4)  # AlltoAll pieces per pair (1: direct where a link exists)
SCREEN_KEEP = 2  # variants kept per screening size
# Chunks per channel of the AlltoAll that leaves threadblocks to the copy: a threadblock's
# later receives overlap their latency (mi300x-8 at 1 GiB, simulated: 1 chunk 82.8% of the
# budget bound, 8 chunks 87.0%; docs/synthesis.md "Session 10").
COPY_DEPTH = 8
# Largest AllGather model (binary sends) given to the MILP; above it the greedy pattern stands.
# DGX-1's 4-piece model (6,144) costs ~13 s of HiGHS root-LP work for 5 epochs instead of 6, and
# no size chooses it: one threadblock moves less than a link, so threadblocks bind first.
MILP_VARS = 4000


def applies(topo: ClusterTopology) -> bool:
    """One server of >= 2 GPUs whose GPU-to-GPU links (NVLink / xGMI) connect them all (not
    A40 bridges, which pair GPUs and leave the rest to PCIe)."""
    if len(topo.nodes) != 1 or topo.world_size < 2:
        return False
    try:
        group = GroupTopo.gpu_mesh(topo)
    except ValueError:
        return False
    return all(group.hops(u, v) < group.size for u in range(group.size) for v in range(group.size))


@dataclass
class MeshVariants:
    """Schedules on the server's mesh, by label, and why others were left out."""

    budget: int  # threadblocks per GPU
    schedules: dict[str, ScheduleArrays] = field(default_factory=dict)
    lowered: dict[str, MscclLowering] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    patterns: list[SubSchedule] = field(default_factory=list)
    unfit: set[str] = field(default_factory=set)
    copy_tbs: dict[str, int] = field(default_factory=dict)  # threadblocks kept for the copy

    def fits(self, label: str) -> bool:
        """Lowered (checked) for msccl-executor-nccl within the budget, on first use: only
        variants the screening keeps pay for it; one that cannot run is dropped with why."""
        if label in self.lowered:
            return True
        if label in self.unfit:
            return False
        try:
            low = lower_msccl(self.schedules[label].to_schedule(), max_threadblocks=self.budget,
                              copy_threadblocks=self.copy_tbs.get(label, 0))  # fmt: skip
            low.require(max_threadblocks=self.budget, max_steps=MAX_STEPS)
        except MscclFormatError as exc:
            self.dropped.append(f"{label}: {exc}")
            self.unfit.add(label)
            return False
        self.lowered[label] = low
        return True

    def early(self, label: str) -> str | None:
        """The variant lowered with its sends moved early (writer ORDERS "early") as a label of
        its own, when that differs from the fitted file; timed beside it, the faster kept per
        size. mi300x-8 AlltoAll at 128 MiB, simulated: the fill's file 433.9 us with the
        default order, 393.1 (forwarding) early, its schedule 386.3."""
        twin = f"{label}/early"
        if twin in self.lowered:
            return twin
        if twin in self.unfit or label not in self.lowered or "/scratch" in label:
            return None
        try:
            low = lower_msccl(self.schedules[label].to_schedule(), max_threadblocks=self.budget,
                              order="early",
                              copy_threadblocks=self.copy_tbs.get(label, 0))  # fmt: skip
            low.require(max_threadblocks=self.budget, max_steps=MAX_STEPS)
        except MscclFormatError:
            low = None
        if low is None or low.order != "early":  # nothing moved: the same file
            self.unfit.add(twin)
            return None
        self.schedules[twin], self.lowered[twin] = self.schedules[label], low
        return twin


def variants(topo: ClusterTopology, coll: Collective, budget: int,
             node_limit: int) -> MeshVariants:  # fmt: skip
    """The variants on the server's mesh (`fits` says which the executor runs within `budget`
    threadblocks per GPU)."""
    group = GroupTopo.gpu_mesh(topo)
    n = group.size
    peers = max(sum(1 for u, _ in group.links() if u == r) for r in range(n))
    out = MeshVariants(budget)
    if peers > budget:
        out.dropped.append(f"one threadblock per peer needs {peers}, over the budget of {budget}")
        return out
    built: list[tuple[str, ScheduleArrays]] = []
    # Threadblocks per GPU: one per peer, or the whole budget (one threadblock moves less than
    # a link on every GPU modelled, so a pair needs several).
    fills = sorted({peers, budget})
    if coll == Collective.ALLTOALL:
        for k in A2A_PIECES:
            routes = alltoall_routes(group, k)
            load = _pair_load([(u, v) for rs in routes.values() for r in rs
                               for u, v in itertools.pairwise(r)])  # fmt: skip
            for tbs in fills:
                chans = channels_per_pair(group, load, tbs)
                copies = max(chans.values())
                if copies * k <= MAX_CHUNKS:
                    built.append((f"mesh-a2a/k{k}t{tbs}",
                                  alltoall(group, routes, k, copies, chans)))  # fmt: skip
        # Direct sends on the budget less 1/n of it, the rest kept for the own block's copy
        # (1/n of the data; the writer's copy-only threadblocks), COPY_DEPTH chunks per
        # channel (docs/synthesis.md "Session 10: the copy on threadblocks of its own").
        tbs = budget - budget // n
        if tbs >= peers and tbs not in fills:
            routes = alltoall_routes(group, 1)
            load = _pair_load([(u, v) for rs in routes.values() for r in rs
                               for u, v in itertools.pairwise(r)])  # fmt: skip
            chans = channels_per_pair(group, load, tbs)
            copies = min(MAX_CHUNKS, max(chans.values()) * COPY_DEPTH)
            label = f"mesh-a2a/k1t{tbs}/copy"
            built.append((label, alltoall(group, routes, 1, copies, chans)))
            out.copy_tbs[label] = budget - tbs
            # The same threadblocks with part of a 1-lane pair's data relayed through 2-lane
            # neighbours where their threadblocks have room (cube-mesh; docs/synthesis.md
            # "Session 10: the cube-mesh").
            routed = alltoall_routes(group, MAX_CHUNKS, connection_caps(topo, group, chans))
            if any(len(r) > 2 for rs in routed.values() for r in rs):
                label = f"mesh-a2a/r{MAX_CHUNKS}t{tbs}/copy"
                built.append((label, alltoall(group, routed, MAX_CHUNKS, 1, chans)))
                out.copy_tbs[label] = budget - tbs
        a2a = fill_alltoall_plan(group, budget)
        if a2a is not None:
            built.append((f"mesh-a2a/fill{budget}", fill_alltoall(a2a)))
    else:
        for k in PIECES:
            ranks = tuple(range(n))
            demand = SubDemand(group, ranks, ranks, False, n * k,
                               tuple(r for r in ranks for _ in range(k)))  # fmt: skip
            pattern = solve(demand, node_limit=node_limit if _binaries(demand) <= MILP_VARS else 0)
            out.patterns.append(pattern)
            load = _pair_load([(u, v) for _, _, u, v in pattern.sends])
            for tbs in fills:
                chans = channels_per_pair(group, load, tbs)
                # Reduce chains grow with the copies: deep ReduceScatters never won (simulated).
                for depth in DEPTHS if coll == Collective.ALLGATHER else DEPTHS[:2]:
                    copies = max(chans.values()) * depth
                    if k * copies > MAX_CHUNKS:
                        continue
                    label = f"mesh/k{k}t{tbs}d{depth}"
                    ag = allgather(group, pattern, k, copies, chans, label)
                    if coll != Collective.ALLGATHER:
                        rs = reverse(allgather(group, pattern, k, copies, chans, label, False),
                                     f"ccltune-mesh-{coll.value}-{label}")  # fmt: skip
                        ag = rs if coll == Collective.REDUCESCATTER else asm.allreduce(
                            rs, ag, rs.name)  # fmt: skip
                    built.append((label, ag))
        # AllGather only: reversed, its relays' reduce chains deadlock in the executor's FIFO
        # model (mi300x-8 ReduceScatter / AllReduce files, simulated); reduces get their own
        # relays, in rounds (mesh_rounds.py).
        filled = fill_plan(group, budget)
        if filled is not None and coll == Collective.ALLGATHER:
            label = f"mesh/fill{budget}"
            built.append((label, fill_allgather(filled, label)))
        if coll != Collective.ALLGATHER:
            built += _round_variants(group, coll, budget, filled)
        if coll != Collective.ALLGATHER:
            built += _ring_variants(topo, group, coll, budget)
        if coll != Collective.ALLGATHER and SCRATCH_REDUCES:
            _scratch_variants(group, coll, budget, out)
    out.schedules.update(built)
    return out


def _round_variants(group: GroupTopo, coll: Collective, budget: int,
                    filled: FillPlan | None) -> list[tuple[str, ScheduleArrays]]:  # fmt: skip
    """ReduceScatter / AllReduce with `rrc` chains in rounds (mesh_rounds.py) on a full mesh of
    equal links: on the whole budget with relays where `fill_plan` deals it and a layout is
    found (MI300X: 32), else direct on the most channels per pair that fit (a power of two). mi300x-8 ReduceScatter at
    64 MiB, simulated: 193.4 us as a file (fill), 211.5 (direct, 28 threadblocks), NCCL 226.6."""
    n = group.size
    name = f"ccltune-mesh-{coll.value}"
    if filled is not None:
        arr = mesh_rounds.fill_reduce(n, filled.channels, budget, coll, f"{name}-rounds{budget}")
        if arr is not None:
            return [(f"mesh/fill-rounds{budget}", arr)]
    if n < 3 or len(group.links()) != n * (n - 1) or len({group.capacity(*lk)
                                                         for lk in group.links()}) != 1:  # fmt: skip
        return []
    k = 1 << ((budget // (n - 1)).bit_length() - 1) if budget >= n - 1 else 0
    m = 1 << (n - 2).bit_length()  # chunks per channel: the fewest powers of two >= n - 1
    if not k or k * m > MAX_CHUNKS:
        return []
    return [(f"mesh/rounds-k{k}c{k * m}", mesh_rounds.rotation(n, k, m, coll,
                                                               f"{name}-rounds-k{k}"))]  # fmt: skip


def _ring_variants(topo: ClusterTopology, group: GroupTopo, coll: Collective,
                   budget: int) -> list[tuple[str, ScheduleArrays]]:  # fmt: skip
    """ReduceScatter / AllReduce on several rings at once where the links are unequal
    (mesh_rings.py; the cube-mesh quad: 4 rings on 2 channels each, AllReduce 1,290.1 us at
    64 MiB against NCCL's ring's 1,339.7, simulated)."""
    if len({group.capacity(*lk) for lk in group.links()}) < 2:
        return []
    lane, tb = _lane_and_tb_gbps(topo, group)
    found = mesh_rings.rings(group, budget, lane, tb)
    if not found:
        return []
    per, depth = budget // len(found), mesh_rings.depth_for(group.size)
    name = f"ccltune-mesh-{coll.value}-rings{len(found)}x{per}"
    return [(f"mesh/rings{len(found)}x{per}d{depth}",
             mesh_rings.ring_reduce(group.size, found, per, depth, coll, name))]


# Offered exactly when the read-back charges local steps: uncharged, the reducing threadblocks'
# `re`s cost nothing while an `rrc` pays its reduce at the receive's rate. Charged, they win a
# few sizes (mi300x-8 AllReduce 64 KiB-4 MiB, cube-mesh-4 AllReduce 4 MiB; docs/synthesis.md
# "Session 9: local steps charged").
SCRATCH_REDUCES = CHARGE_LOCAL_STEPS
SCRATCH_CHUNKS = (16,)  # chunks per rank of the direct scratch-reduce variants (below)
SCRATCH_GROUPS = (1, 2, 4)  # chunks per reduce, the fewest the step limit allows


def _scratch_variants(group: GroupTopo, coll: Collective, budget: int, out: MeshVariants) -> None:
    """Direct ReduceScatter / AllReduce with reduces into scratch (formats/msccl/scratch.py) on
    a full mesh: k channels per pair, the same on every pair, the most that leave at least one
    threadblock of the budget to reduce (reduces on a peer's threadblock hold its sends:
    mi300x-8 64 MiB ReduceScatter files 243-349 us where the schedule takes 212, simulated). One
    channel per pair and 8 or 32 chunks per rank won no size on mi300x-8 or v100-cubemesh-4
    (every 4x, 1 KiB-1 GiB) and cost CPU time; docs/synthesis.md has the numbers."""
    n = group.size
    linked = set(group.links())
    if any((u, v) not in linked for u in range(n) for v in range(n) if u != v):
        return
    k = max(1, (budget - 1) // (n - 1))
    chans = {(u, v): k for u in range(n) for v in range(n) if u != v}
    # a peer threadblock's steps: a send and a receive per chunk of its block, per phase
    phases = 2 if coll == Collective.ALLREDUCE else 1
    for cpr in SCRATCH_CHUNKS:
        if cpr % k or cpr > MAX_CHUNKS or 2 * phases * cpr // k > MAX_STEPS:
            continue
        label = f"mesh/scratch-k{k}c{cpr}"
        why = ""
        for grp in (g for g in SCRATCH_GROUPS if (cpr // k) % g == 0):
            try:
                arr, low = scratch.direct(coll, n, cpr, chans, budget, grp,
                                          f"ccltune-mesh-{coll.value}-{label}")  # fmt: skip
            except MscclFormatError as exc:
                why = str(exc)
                continue
            out.schedules[label], out.lowered[label] = arr, low
            break
        else:
            if why:
                out.dropped.append(f"{label}: {why}")


Pair = tuple[int, int]


def _binaries(demand: SubDemand) -> int:
    """The MILP's send variables: pieces x links x the greedy start's epochs (its horizon)."""
    return demand.pieces * len(demand.group.links()) * (1 + max(t for t, *_ in greedy(demand)))


def _pair_load(hops: list[Pair]) -> dict[Pair, int]:
    """Sends per unordered pair in its busier direction."""
    per: dict[Pair, int] = {}
    for u, v in hops:
        per[(u, v)] = per.get((u, v), 0) + 1
    return {(u, v): max(c, per.get((v, u), 0)) for (u, v), c in per.items() if u < v
            or (v, u) not in per}  # fmt: skip


def channels_per_pair(group: GroupTopo, load: dict[Pair, int], budget: int) -> dict[Pair, int]:
    """Channels per directed pair (the same both ways: a threadblock pairs a send and a receive
    of one peer): one each, then doubled where the load per channel is highest while both GPUs
    stay within `budget` threadblocks. Powers of two, so every pair's sends deal evenly over
    its channels when the copies are a multiple of the most."""
    pairs = sorted({(min(u, v), max(u, v)) for u, v in load})
    ch = dict.fromkeys(pairs, 1)
    used = [0] * group.size
    for u, v in pairs:
        used[u] += 1
        used[v] += 1

    def weight(p: Pair) -> int:
        return max(load.get(p, 0), load.get((p[1], p[0]), 0))

    while True:
        room = [p for p in pairs if used[p[0]] + ch[p] <= budget and used[p[1]] + ch[p] <= budget]
        if not room:
            break
        p = max(room, key=lambda q: (weight(q) / ch[q], -q[0], -q[1]))
        used[p[0]] += ch[p]
        used[p[1]] += ch[p]
        ch[p] *= 2
    return {**ch, **{(v, u): c for (u, v), c in ch.items()}}


class _Dealer:
    """Deals each pair's sends round robin over its channels."""

    def __init__(self, chans: dict[Pair, int]) -> None:
        self.chans = chans
        self.next: dict[Pair, int] = {}

    def __call__(self, u: int, v: int) -> int:
        k = self.next.get((u, v), 0)
        self.next[(u, v)] = k + 1
        return k % self.chans[(u, v)]


def allgather(group: GroupTopo, pattern: SubSchedule, k: int, copies: int,
              chans: dict[Pair, int], name: str, queue: bool = True) -> ScheduleArrays:  # fmt: skip
    """The pattern's sends, piece p of the pattern being owner p // k's j = p % k, copied
    `copies` times, each pair's sends dealt over its `chans` channels; a send waits
    for its chunk to reach the sender and for the previous send on its (sender, receiver,
    channel) queue (`queue`; without it only for its chunk)."""
    b = asm.Builder()
    cpr = k * copies
    deal = _Dealer(chans)
    sends = sorted(pattern.sends)
    arrival: dict[tuple[int, int, int], int] = {}
    # Epoch by epoch over the copies: on a queue, a later copy's first hop goes before an
    # earlier copy's relay, which would otherwise hold it while its piece is on the way.
    for epoch in range(pattern.epochs):
        for c in range(copies):
            for t, p, u, v in sends:
                if t != epoch:
                    continue
                owner, j = divmod(p, k)
                dep = arrival.get((c, p, u))
                ch = deal(u, v)
                arrival[(c, p, v)] = b.add(u, v, owner * cpr + c * k + j,
                                           () if dep is None else (dep,), channel=ch,
                                           stream=ch if queue else None)  # fmt: skip
    return b.arrays(f"ccltune-mesh-{name}", Collective.ALLGATHER, group.size, cpr,
                    channels=max(chans.values()))  # fmt: skip


def reverse(ag: ScheduleArrays, name: str) -> ScheduleArrays:
    """ReduceScatter as the AllGather run backwards: each send becomes a reduce the other way,
    after the reduces of the sends that left from its receiver (their data). Reduces into one
    (GPU, chunk) must be ordered (the checker wants a path between writes of one buffer); each
    such chain starts at another peer per chunk, so a GPU's links carry reduces at once instead
    of every chain waiting on one peer. The chains order siblings of one chunk's tree only,
    so no cycle forms. `ag` must hold data deps alone (no connection queue)."""
    t, n = len(ag), ag.nranks
    src, dst, chunk = ag.dst.tolist(), ag.src.tolist(), ag.chunk.tolist()
    ptr, idx = ag.dep_ptr.tolist(), ag.dep_idx.tolist()
    deps: list[set[int]] = [set() for _ in range(t)]
    for i in range(t):
        for d in idx[ptr[i] : ptr[i + 1]]:
            deps[d].add(i)
    into: dict[tuple[int, int], list[int]] = {}
    for i in range(t):
        into.setdefault((dst[i], chunk[i]), []).append(i)
    for (me, c), group in into.items():
        group.sort(key=lambda i: ((src[i] - me + c) % n, src[i]))
        for before, after in itertools.pairwise(group):
            deps[after].add(before)
    order = _topological(deps)
    new_of = {old: pos for pos, old in enumerate(order)}
    b = asm.Builder()
    for old in order:
        b.add(src[old], dst[old], chunk[old], tuple(sorted(new_of[d] for d in deps[old])),
              int(ag.count[old]), int(ag.channel[old]), reduce=True)  # fmt: skip
    return b.arrays(name, Collective.REDUCESCATTER, n, ag.chunks_per_rank, channels=ag.channels)


def _topological(deps: list[set[int]]) -> list[int]:
    """Kahn's order, smallest index first among the ready (deps: predecessors per node)."""
    succ: list[list[int]] = [[] for _ in deps]
    left = [len(d) for d in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            succ[d].append(i)
    ready = [i for i, k in enumerate(left) if k == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(i)
        for j in succ[i]:
            left[j] -= 1
            if left[j] == 0:
                heapq.heappush(ready, j)
    if len(out) != len(deps):
        raise AssertionError("reversed mesh schedule has a dependency cycle")
    return out


Route = list[int]  # GPUs from the sender to the receiver


def _lane_and_tb_gbps(topo: ClusterTopology, group: GroupTopo) -> tuple[float, float]:
    """GB/s of one NVLink lane at the SM-copy rate, and of one threadblock (Simple)."""
    phys = gpu_physics(topo.gpu_model)
    if phys is None:
        return group.bandwidth_gbps, math.inf
    return group.bandwidth_gbps * phys.nvlink_efficiency, phys.tb("Simple")


def connection_caps(topo: ClusterTopology, group: GroupTopo,
                    chans: dict[Pair, int]) -> dict[Pair, float]:  # fmt: skip
    """Per directed link, the GB/s its connections can move: its lanes at the SM-copy rate, or
    its channels' threadblocks (Simple) where they move less. A cube-mesh 2-lane pair on 2
    channels moves 25 GB/s, not 40: its spare lanes carry no relay its threadblocks cannot."""
    lane, tb = _lane_and_tb_gbps(topo, group)
    return {(u, v): min(group.capacity(u, v) * lane, chans.get((u, v), 0) * tb)
            for u, v in group.links()}  # fmt: skip


def alltoall_routes(group: GroupTopo, pieces: int, caps: dict[Pair, float] | None = None,
                    ) -> dict[tuple[int, int], list[Route]]:  # fmt: skip
    """Per ordered pair, the route of each of its `pieces` pieces: the LP's split of the pair's
    data over its direct link and one-relay paths, minimising the busiest link's load over its
    capacity (`caps`, default its lanes), rounded to whole pieces by largest remainder (one
    piece: the shortest path)."""
    n = group.size
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    if pieces == 1:
        return {(s, d): [group.shortest_paths(s, d)[0]] for s, d in pairs}
    lanes: dict[Pair, float] = {(u, v): group.capacity(u, v) for u, v in group.links()}
    if caps:  # in units of the largest, as lanes are, so the LP's hop cost stays small
        lanes = {lk: c / max(caps.values()) for lk, c in caps.items()}
    paths = {(s, d): [[s, d]] * ((s, d) in lanes)
             + [[s, w, d] for w in range(n) if (s, w) in lanes and (w, d) in lanes]
             for s, d in pairs}  # fmt: skip
    for (s, d), ps in paths.items():
        if not ps:  # more than one relay: the shortest paths
            ps.extend(group.shortest_paths(s, d))
    flows = _route_lp(paths, lanes)
    out = {}
    for pair, ps in paths.items():
        want = [f * pieces for f in flows[pair]]
        got = [math.floor(w + 1e-9) for w in want]
        rest = sorted(range(len(ps)), key=lambda i: (got[i] - want[i], i))
        for i in rest[: pieces - sum(got)]:
            got[i] += 1
        out[pair] = [ps[i] for i in range(len(ps)) for _ in range(got[i])]
    return out


def _route_lp(paths: dict[tuple[int, int], list[Route]],
              lanes: dict[tuple[int, int], float]) -> dict[tuple[int, int], list[float]]:  # fmt: skip
    """min T: each pair's path flows sum to 1, each link's load <= T x its capacity; among the
    optima the fewest relayed hops (a small cost per hop)."""
    cols = [(pair, i) for pair, ps in paths.items() for i in range(len(ps))]
    n = len(cols) + 1  # the last column is T
    cost = np.array([1e-4 * (len(paths[p][i]) - 1) for p, i in cols] + [1.0])
    h = new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.addVars(n, np.zeros(n), np.full(n, highspy.kHighsInf))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    col_of = {c: j for j, c in enumerate(cols)}
    for pair, ps in paths.items():
        idx = np.array([col_of[(pair, i)] for i in range(len(ps))], dtype=np.int32)
        h.addRow(1.0, 1.0, len(idx), idx, np.ones(len(idx)))
    on: dict[tuple[int, int], list[int]] = {lk: [] for lk in lanes}
    for (pair, i), j in col_of.items():
        route = paths[pair][i]
        for u, v in itertools.pairwise(route):
            on[(u, v)].append(j)
    for lk, js in on.items():
        idx = np.array([*js, n - 1], dtype=np.int32)
        h.addRow(-highspy.kHighsInf, 0.0, len(idx), idx,
                 np.array([1.0] * len(js) + [-float(lanes[lk])]))  # fmt: skip
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"AlltoAll routing LP: {h.modelStatusToString(h.getModelStatus())}")
    x = h.getSolution().col_value
    return {pair: [max(0.0, x[col_of[(pair, i)]]) for i in range(len(ps))]
            for pair, ps in paths.items()}  # fmt: skip


def alltoall(group: GroupTopo, routes: dict[tuple[int, int], list[Route]], pieces: int,
             copies: int, chans: dict[Pair, int]) -> ScheduleArrays:  # fmt: skip
    """Piece j of (s -> d) in copy c is chunk (s n + d) cpr + c pieces + j, along its route;
    a relay's forward waits for the piece to arrive; each pair's sends dealt over its `chans`
    channels."""
    n = group.size
    cpr = pieces * copies
    b = asm.Builder()
    deal = _Dealer(chans)
    longest = max(len(r) for rs in routes.values() for r in rs) - 1
    for c in range(copies):
        last: dict[tuple[int, int], int] = {}
        # Hop by hop: a relayed piece's second hop queues behind every first hop on its
        # connection, so it never holds up a direct piece that is ready.
        for hop in range(longest):
            for (s, d), rs in sorted(routes.items()):
                for j, route in enumerate(rs):
                    if hop + 1 >= len(route):
                        continue
                    u, v = route[hop], route[hop + 1]
                    chunk = (s * n + d) * cpr + c * pieces + j
                    dep = (last[(chunk, u)],) if hop else ()
                    ch = deal(u, v)
                    last[(chunk, v)] = b.add(u, v, chunk, dep, channel=ch, stream=ch)
    return b.arrays(f"ccltune-mesh-alltoall-k{pieces}x{copies}", Collective.ALLTOALL, n, cpr,
                    channels=max(chans.values()))  # fmt: skip


@dataclass
class MeshPick:
    """Per size, the best mesh file's time (or None) and what was tried."""

    best: dict[int, tuple[float, str, str] | None]
    variants: MeshVariants


Protocols = Callable[[int], tuple[str, ...]]


def evaluate(topo: ClusterTopology, coll: Collective, sizes: list[int], found: MeshVariants,
             protocols: Protocols, chunks_per_loop: Callable[[ScheduleArrays], int],
             router: Router, beat: dict[int, float] | None = None) -> MeshPick:  # fmt: skip
    """Per size: the screened variants the executor selects there simulated with every protocol
    that can win; the best FILE_FINALISTS timed as the files they would be (read back, sliced),
    only where the schedule beats `beat` (the size's time so far: a file only adds waits)."""
    g = nccl_graph(topo)
    phys = gpu_physics(topo.gpu_model)
    n = topo.world_size
    sel_from = {lb: first_selected(coll, n, chunks_per_loop(arr), 1)
                for lb, arr in found.schedules.items()}  # fmt: skip
    costs = {p: protocol_cost(p, link_kind=g.intra_kind, gpu=phys) for p in PROTOCOLS}

    def engine_us(label: str, s: int, proto: str) -> float:
        return simulate(found.schedules[label], topo, s, costs[proto], router).time_us

    files: dict[tuple[str, str], str] = {}

    def best_files(labels: list[str], bars: dict[int, float]) -> dict[int, tuple[float, str, str]]:
        kept = _screen(sizes, labels, sel_from, protocols, engine_us, found.fits)
        best_of: dict[int, tuple[float, str, str]] = {}
        # Every GRID-th size tries every kept variant; a size between two tries the variants
        # whose schedule was fastest at either (engine.py does the same).
        grid, order = evaluation_order(len(sizes))
        fastest: dict[int, str] = {}
        won: dict[int, str] = {}  # and whose file won: a schedule leaves out the copy
        for i in order:
            s = sizes[i]
            tried = kept
            if i not in grid:
                lo, hi = max(j for j in grid if j < i), min(j for j in grid if j > i)
                near = {fastest.get(lo), fastest.get(hi), won.get(lo), won.get(hi)}
                tried = [lb for lb in kept if lb in near] or kept
            engine = [(engine_us(label, s, proto), label, proto) for label in tried
                      if (start := sel_from[label]) is not None and start <= s
                      for proto in protocols(s)]  # fmt: skip
            if engine:
                fastest[i] = min(engine)[1]
            bar = bars.get(s, math.inf)
            for t, label, proto in sorted(engine)[:FILE_FINALISTS]:
                if t >= min(bar, best_of[s][0] if s in best_of else math.inf):
                    break  # a file only adds waits to its schedule
                for lb in (label, found.early(label)):
                    if lb is None:
                        continue
                    if (lb, proto) not in files:
                        files[(lb, proto)] = render_lowering(
                            found.lowered[lb], name=lb, proto=proto,
                            nchannels=found.schedules[lb].channels)  # fmt: skip
                    f = file_time(coll, s, topo, router, files[(lb, proto)])
                    if isinstance(f, str):
                        found.dropped.append(f"{lb}/{proto}: {f}")
                        continue
                    if s not in best_of or f < best_of[s][0]:
                        best_of[s] = (f, lb, proto)
                        won[i] = label
        return best_of

    # The fill's schedules run at the bound where its files lose ~10% to them: ranked with
    # the others it took their place among the finalists and lost sizes they won (mi300x-8
    # AllGather 512K..16M, simulated), so it is evaluated after them, against their files.
    # The scratch variants likewise: their schedules beat the direct variants' at 1-16 KiB on
    # v100-cubemesh-4 AllReduce and took their places, but their files were up to 1.2x slower.
    # "/copy" variants too: their schedules leave out the own block's copy they make room for,
    # so ranked by schedule they were never timed as files (cube-mesh-4 AlltoAll 128-512 MiB).
    labels = list(found.schedules)
    later = [lb for lb in labels if "/fill" in lb or "/scratch" in lb or "/copy" in lb]
    best_of = best_files([lb for lb in labels if lb not in later], dict(beat or {}))
    if later:
        bars = {s: min((beat or {}).get(s, math.inf), best_of[s][0] if s in best_of else math.inf)
                for s in sizes}  # fmt: skip
        for s, got in best_files(later, bars).items():
            if s not in best_of or got[0] < best_of[s][0]:
                best_of[s] = got
    return MeshPick({s: best_of.get(s) for s in sizes}, found)


def _screen(sizes: list[int], labels: list[str], sel_from: dict[str, int | None],
            protocols: Protocols, engine_us: Callable[[str, int, str], float],
            fits: Callable[[str], bool]) -> list[str]:  # fmt: skip
    """The variants among the best SCREEN_KEEP that fit the executor at the smallest size each
    selects, near 64 MiB or at the largest size (the engine's screening points)."""
    if len(labels) <= SCREEN_KEEP:
        return [lb for lb in labels if fits(lb)]
    mid = min(sizes, key=lambda x: abs(math.log2(x) - 26))
    kept: set[str] = set()
    for at in sorted({sizes[0], mid, sizes[-1]}):
        ranked = []
        for label in labels:
            start = sel_from[label]
            if start is None or start > sizes[-1]:
                continue
            s = at if start <= at else min(x for x in sizes if x >= start)
            ranked.append((min(engine_us(label, s, p) for p in protocols(s)), label))
        kept.update(itertools.islice((lb for _, lb in sorted(ranked) if fits(lb)), SCREEN_KEEP))
    return [lb for lb in labels if lb in kept]

