"""NCCL's algorithms as schedules (ir.py semantics) on any ClusterTopology.

What is modeled, and where it comes from (NCCL source, v2.19 line):
- ring (src/graph/search.cc, connect.cc, device/all_gather.h, reduce_scatter.h, all_reduce.h,
  broadcast.h): one ring per channel; all GPUs of a node in NVLink order, then on to the next node.
  Each channel enters and leaves a node next to the same NIC (NCCL_CROSS_NIC=0), so on a
  rail-optimized fabric it stays on one rail; channel c takes the c-th NIC of NCCL's search order,
  so a GPU with several NICs spreads channels over all of them (`ring_layouts`, `net_order`). The buffer is cut into `chunks` pipeline
  chunks per channel; consecutive chunks go to consecutive channels.
- tree (src/graph/trees.cc, connect.cc, device/all_reduce.h runTreeUpDown): a chain through the
  GPUs of each node plus a double binary tree over nodes (the second tree mirrored for an even
  node count, shifted by one for odd); even channels use tree 0, odd channels tree 1. Allreduce
  reduces up the tree, then broadcasts down, pipelined chunk by chunk.
- direct alltoall (nccl-tests alltoall = grouped ncclSend/ncclRecv to every peer; NCCL orders
  peers as rank+i / rank-i).
- hierarchical ("nvls", "nvls_tree"): NCCL's NVLS algorithms reduce inside the node, cross nodes
  per slice (ring or tree) and broadcast inside the node. The schedule IR has no in-switch
  multicast/reduction, so these are point-to-point emulations (intra-node ring reduce-scatter,
  inter-node ring or tree allreduce per slice among same-local-index GPUs, intra-node ring
  allgather); their simulated time is an upper estimate of real NVLS.

In flight per connection: NCCL's Simple buffer holds NCCL_STEPS = 8 steps and a ring chunk is
CHUNKSTEPS = NCCL_STEPS/2 of them (src/include/collectives.h), so at most 2 chunks per connection
(src, dst, channel) are in flight. Chains (broadcast, trees, the hierarchical variants) model this:
transfer k on a connection waits for transfer k-2 (`in_flight`), since without it the simulator's
fair sharing would run every queued chunk of a link at once and the chain would lose its
pipelining. Rings and alltoall default to no window: every link of a ring is busy at every step
anyway, so the window would only serialize per-transfer latency the real pipeline hides.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

from ...api.cluster import ClusterTopology, DeviceKind, LinkKind
from ...api.common import Collective
from ...api.errors import InternalError
from ..cost.protocols import NCCL_STEPS
from ..schedule.ir import Schedule, ScheduleArrays
from ..sim.routing import local_nets
from ..sim.translations import Translations

IN_FLIGHT = NCCL_STEPS // (NCCL_STEPS // 2)  # chunks in flight per connection (see above)


class BaselineError(InternalError):
    """The algorithm does not exist for the collective, or the parameters are out of range."""


# Algorithms each collective supports here (NCCL's names; "direct" = p2p alltoall).
SUPPORTED: dict[Collective, tuple[str, ...]] = {
    Collective.ALLREDUCE: ("ring", "tree", "nvls", "nvls_tree"),
    Collective.ALLGATHER: ("ring",),
    Collective.REDUCESCATTER: ("ring",),
    Collective.BROADCAST: ("ring", "tree"),
    Collective.ALLTOALL: ("direct",),
}


class _Builder:
    """Accumulates transfers as flat lists, adding NCCL's per-connection slot dependencies."""

    def __init__(self, window: int = IN_FLIGHT) -> None:
        self.src: list[int] = []
        self.dst: list[int] = []
        self.chunk: list[int] = []
        self.count: list[int] = []
        self.reduce: list[bool] = []
        self.channel: list[int] = []
        self.dep_ptr: list[int] = [0]
        self.dep_idx: list[int] = []
        self.window = window
        self._conn: dict[tuple[int, int, int], deque[int]] = {}

    def add(
        self,
        src: int,
        dst: int,
        chunk: int,
        deps: Iterable[int] = (),
        *,
        reduce: bool = False,
        channel: int = 0,
        count: int = 1,
    ) -> int:
        i = len(self.src)
        self.src.append(src)
        self.dst.append(dst)
        self.chunk.append(chunk)
        self.count.append(count)
        self.reduce.append(reduce)
        self.channel.append(channel)
        self.dep_idx.extend(d for d in deps if d >= 0)
        if self.window:
            q = self._conn.get((src, dst, channel))
            if q is None:
                q = self._conn[(src, dst, channel)] = deque(maxlen=self.window)
            if len(q) == self.window:
                self.dep_idx.append(q[0])
            q.append(i)
        self.dep_ptr.append(len(self.dep_idx))
        return i

    def arrays(
        self, name: str, collective: Collective, nranks: int, chunks_per_rank: int, *,
        root: int = 0, channels: int = 1,
    ) -> ScheduleArrays:  # fmt: skip
        return ScheduleArrays(
            name=name,
            collective=collective,
            nranks=nranks,
            chunks_per_rank=chunks_per_rank,
            src=np.asarray(self.src, dtype=np.int32),
            dst=np.asarray(self.dst, dtype=np.int32),
            chunk=np.asarray(self.chunk, dtype=np.int64),
            count=np.asarray(self.count, dtype=np.int32),
            reduce=np.asarray(self.reduce, dtype=bool),
            channel=np.asarray(self.channel, dtype=np.int32),
            dep_ptr=np.asarray(self.dep_ptr, dtype=np.int64),
            dep_idx=np.asarray(self.dep_idx, dtype=np.int64),
            root=root,
            channels=channels,
        )


# ---------------------------------------------------------------------------------------------
# Orders: NVLink order inside a node, rings and chains per channel.


def _direct_gpu_links(topo: ClusterTopology, node: int) -> dict[int, dict[int, float]]:
    """Local GPU -> {local GPU: bandwidth} over direct NVLink/xGMI links inside `node`."""
    gpn = topo.gpus_per_node
    local = {topo.gpu_id(node * gpn + i): i for i in range(gpn)}
    adj: dict[int, dict[int, float]] = {i: {} for i in range(gpn)}
    for link in topo.links:
        if link.kind not in (LinkKind.NVLINK, LinkKind.XGMI):
            continue
        a, b = local.get(link.a), local.get(link.b)
        if a is None or b is None or a == b:
            continue
        adj[a][b] = adj[a].get(b, 0.0) + link.bandwidth_gbps
        adj[b][a] = adj[b].get(a, 0.0) + link.bandwidth_gbps
    return adj


def nvlink_cycles(topo: ClusterTopology) -> list[list[int]]:
    """Intra-node rings (local GPU indices) NCCL's search could find, each also reversed.

    With direct GPU-GPU links (no NVSwitch) NCCL's search follows the links and books each ring's
    bandwidth on them (search.cc), so rings do not overload a link while another ring fits: we
    take up to gpn-1 Hamiltonian cycles, each over GPU pairs with one link's bandwidth (the
    narrowest pair's) left after the earlier cycles and their reverses booked theirs (a pair of 2
    NVLinks carries 2 rings); if not even one fits, one cycle preferring the widest links, else
    one Hamiltonian path. With an NVSwitch or PCIe only every order is equal and NCCL keeps index
    order.
    """
    gpn = topo.gpus_per_node
    adj = _direct_gpu_links(topo, 0)
    cycles: list[list[int]] = []
    if gpn > 2 and any(adj[i] for i in range(gpn)):
        used: dict[tuple[int, int], int] = {}
        left = {u: dict(nb) for u, nb in adj.items()}  # bandwidth not yet booked, per pair
        unit = min(bw for nb in adj.values() for bw in nb.values())
        for _ in range(gpn - 1):
            free = {u: {v: bw for v, bw in nb.items() if bw >= unit - 1e-9} for u, nb in left.items()}
            cyc = _hamiltonian(free, gpn, cycle=True, used=used)
            if cyc is None and not cycles:
                cyc = _hamiltonian(adj, gpn, cycle=True, used=used)
            if cyc is None or cyc in cycles:
                break
            cycles.append(cyc)
            for a, b in zip(cyc, cyc[1:] + cyc[:1], strict=True):
                used[(a, b)] = used.get((a, b), 0) + 1
                left[a][b] -= unit  # the cycle books a -> b, its reverse b -> a: one pair
                left[b][a] -= unit
        if not cycles:
            cycles.append(_hamiltonian(adj, gpn, cycle=False, used={}) or list(range(gpn)))
    else:
        cycles.append(list(range(gpn)))
    out: list[list[int]] = []
    for cyc in cycles:
        for cand in (cyc, [cyc[0], *cyc[:0:-1]]):
            if cand not in out:
                out.append(cand)
    return out


def nvlink_order(topo: ClusterTopology) -> list[int]:
    """The first intra-node ring: local GPU indices in the order NCCL's ring visits them."""
    return nvlink_cycles(topo)[0]


def _hamiltonian(
    adj: dict[int, dict[int, float]], n: int, *, cycle: bool, used: dict[tuple[int, int], int]
) -> list[int] | None:
    budget = [20_000]  # bounded search: NCCL's own search gives up on a timeout too

    def extend(path: list[int], seen: set[int]) -> list[int] | None:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if len(path) == n:
            return path if (not cycle or path[0] in adj[path[-1]]) else None
        last = path[-1]
        for nxt in sorted(adj[last], key=lambda v: (used.get((last, v), 0), -adj[last][v], v)):
            if nxt in seen:
                continue
            seen.add(nxt)
            path.append(nxt)
            got = extend(path, seen)
            if got is not None:
                return got
            path.pop()
            seen.discard(nxt)
        return None

    return extend([0], {0})


def _nic_groups(topo: ClusterTopology) -> list[tuple[str, ...]]:
    """For each local GPU of node 0, the NICs nearest to it through its node's PCIe tree, in the
    topology's NIC order (NCCL's net index order)."""
    node = topo.nodes[0].name
    kinds = {d.id: d.kind for d in topo.devices if d.node == node}
    order = {d.id: i for i, d in enumerate(topo.devices)}
    nbrs: dict[str, list[str]] = {}
    for link in topo.links:
        if link.a in kinds and link.b in kinds:
            nbrs.setdefault(link.a, []).append(link.b)
            nbrs.setdefault(link.b, []).append(link.a)
    out = []
    for i in range(topo.gpus_per_node):
        start = topo.gpu_id(i)
        frontier, seen = [start], {start}
        found: set[str] = set()
        while frontier and not found:
            nxt = []
            for u in frontier:
                for v in nbrs.get(u, []):
                    if v in seen or kinds.get(v) == DeviceKind.GPU:
                        continue
                    seen.add(v)
                    if kinds.get(v) == DeviceKind.NIC:
                        found.add(v)
                    else:
                        nxt.append(v)
            frontier = nxt
        out.append(tuple(sorted(found, key=order.__getitem__)))
    return out


def channel_nics(topo: ClusterTopology) -> list[tuple[str, ...]]:
    """Per local GPU of node 0: its NIC for channel c is entry c mod len (routing.local_nets,
    NCCL's ncclTopoGetLocalNet); empty when no NIC is near it."""
    groups = _nic_groups(topo)
    sharing: dict[str, int] = {}
    for g in groups:
        for nic in g:
            sharing[nic] = sharing.get(nic, 0) + 1
    return [local_nets(g, sharing[g[0]], i) if g else () for i, g in enumerate(groups)]


def net_order(topo: ClusterTopology) -> list[tuple[str, int]]:
    """NCCL's ring/tree search order of NICs with each NIC's local GPU (the channel's entry).

    search.cc ncclTopoPrefNetsChannelFirst: GPU by GPU, each GPU's NICs in channel order;
    channel c starts at NIC c mod count (ncclTopoSearchRecNet), from the GPU that uses that NIC
    for the lowest channel (topo.cc ncclTopoGetLocalGpu)."""
    choices = channel_nics(topo)
    nets: list[str] = []
    for per_gpu in choices:
        nets.extend(n for n in per_gpu if n not in nets)
    width = max((len(c) for c in choices), default=0)
    out = []
    for n in nets:
        owner = next(g for c in range(width) for g, ch in enumerate(choices)
                     if ch and ch[c % len(ch)] == n)  # fmt: skip
        out.append((n, owner))
    return out


def ring_layouts(topo: ClusterTopology) -> list[list[int]]:
    """Candidate per-channel intra-node orders (local indices); channel c uses entry c mod len.

    Across nodes NCCL keeps a channel on one NIC (NCCL_CROSS_NIC=0 first): the ring enters a node
    at the GPU that owns the channel's NIC and leaves from a GPU near the same NIC, so on a
    rail-optimized fabric it stays on its rail, and channel c takes the c-th NIC of NCCL's search
    order (`net_order`), so a GPU with several NICs spreads its channels over all of them. Among
    the rotations that fit a NIC we take the least used exit GPU, then ring. When some intra-node
    ring has no rotation that keeps its NIC, keeping the NIC would cost that ring's links, and
    NCCL's default NCCL_CROSS_NIC=2 lets rings cross NICs instead (search.cc retries with
    crossNic=2 before lowering bandwidth): every rotation is kept, spread over exits.
    """
    gpn = topo.gpus_per_node
    cycles = nvlink_cycles(topo)
    rotations = [[c[(i + off) % gpn] for i in range(gpn)] for off in range(gpn) for c in cycles]
    if topo.node_count > 1 and gpn > 1:
        groups = [set(g) for g in _nic_groups(topo)]
        shared = len(set(map(frozenset, groups))) < gpn  # some GPUs share their NICs
        every_cycle_keeps_its_nic = not shared or all(
            any(groups[c[i - 1]] & groups[c[i]] for i in range(gpn)) for c in cycles
        )
        per_nic = _per_nic_rotations(rotations, groups, net_order(topo))
        if per_nic and every_cycle_keeps_its_nic:
            return per_nic
        rotations = _spread(rotations)
    out: list[list[int]] = []
    for r in rotations:
        if r not in out:
            out.append(r)
    return out


def _per_nic_rotations(
    rotations: list[list[int]], groups: list[set[str]], nets: list[tuple[str, int]]
) -> list[list[int]]:
    """One rotation per NIC in search order (entry at its owner, exit near it), or [] if some NIC
    has none."""
    used: dict[tuple[str, object], int] = {}
    out: list[list[int]] = []
    for nic, owner in nets:
        fits = [r for r in rotations if r[0] == owner and nic in groups[r[-1]]]
        if not fits and len(set(map(frozenset, groups))) == len(groups):
            # No GPU shares a NIC: NCCL's ring leaves through the owner's NIC by PXN (NVLink to
            # the owner, then its NIC), so any exit will do.
            fits = [r for r in rotations if r[0] == owner]
        if not fits:
            return []

        def load(r: list[int]) -> tuple[int, int]:
            ring = frozenset(zip(r, r[1:] + r[:1], strict=True))
            return used.get(("exit", r[-1]), 0), used.get(("ring", ring), 0)

        best = min(fits, key=load)
        out.append(best)
        used[("exit", best[-1])] = used.get(("exit", best[-1]), 0) + 1
        ring = frozenset(zip(best, best[1:] + best[:1], strict=True))
        used[("ring", ring)] = used.get(("ring", ring), 0) + 1
    return out


def _spread(rotations: list[list[int]]) -> list[list[int]]:
    """Order rotations so consecutive channels leave and enter on different GPUs (hence NICs)
    and use different rings: each next one is the least used in exit, entry, then ring."""
    def keys(r: list[int]) -> tuple[tuple[str, object], ...]:
        ring = frozenset(zip(r, r[1:] + r[:1], strict=True))
        return ("exit", r[-1]), ("entry", r[0]), ("ring", ring)

    left = list(rotations)
    used: dict[tuple[str, object], int] = {}
    out: list[list[int]] = []
    while left:
        best = min(left, key=lambda r: tuple(used.get(k, 0) for k in keys(r)))
        left.remove(best)
        out.append(best)
        for k in keys(best):
            used[k] = used.get(k, 0) + 1
    return out


def node_chain(
    topo: ClusterTopology,
    node: int,
    channel: int,
    layouts: Sequence[Sequence[int]] | None = None,
) -> list[int]:
    """Global ranks of `node` in the channel's intra-node order (the tree's chain, head first)."""
    gpn = topo.gpus_per_node
    layouts = layouts if layouts is not None else ring_layouts(topo)
    return [node * gpn + x for x in layouts[channel % len(layouts)]]


def ring_order(topo: ClusterTopology, channel: int = 0) -> list[int]:
    """Global ranks in the order of the channel's ring: node by node, in each its layout."""
    layouts = ring_layouts(topo)
    out: list[int] = []
    for node in range(topo.node_count):
        out.extend(node_chain(topo, node, channel, layouts))
    return out


def btree(n: int, rank: int) -> tuple[int, list[int]]:
    """NCCL's binary tree over `n` nodes (trees.cc ncclGetBtree): (parent or -1, children).

    Node r's lowest set bit b fixes its level: its parent is (r ^ b) | 2b (or r ^ b when that is
    out of range) and its children are r - b/2 and r + b/2 (halving the step until in range).
    Node 0 is the root and has the single child p/2, p the smallest power of two >= n.
    """
    if n <= 1:
        return -1, []
    bit = 1
    while bit < n and not (bit & rank):
        bit <<= 1
    if rank == 0:
        return -1, [bit >> 1]
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    children: list[int] = []
    if low:
        children.append(rank - low)
        down1 = rank + low
        while low and down1 >= n:
            low >>= 1
            down1 = rank + low
        if low:
            children.append(down1)
    return up, children


def dtree(n: int, rank: int, tree: int) -> tuple[int, list[int]]:
    """NCCL's double binary tree: tree 0 is btree; tree 1 mirrors it (n even) or shifts it by
    one (n odd), so that nodes interior in one tree are leaves in the other."""
    if tree == 0:
        return btree(n, rank)
    if n % 2 == 1:
        parent, children = btree(n, (rank - 1) % n)
        return (-1 if parent < 0 else (parent + 1) % n), [(c + 1) % n for c in children]
    parent, children = btree(n, n - 1 - rank)
    return (-1 if parent < 0 else n - 1 - parent), [n - 1 - c for c in children]


def dtree_root(n: int, tree: int) -> int:
    return next(r for r in range(n) if dtree(n, r, tree)[0] < 0)


# ---------------------------------------------------------------------------------------------
# Builders.


def _check_params(chunks: int, channels: int) -> None:
    if chunks < 1:
        raise BaselineError(f"chunks must be >= 1, got {chunks}")
    if channels < 1:
        raise BaselineError(f"channels must be >= 1, got {channels}")


def _ring_positions(topo: ClusterTopology, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """[channels, n] ring orders and each rank's position in its channel's ring."""
    rings = np.asarray([ring_order(topo, c) for c in range(channels)], dtype=np.int64)
    pos = np.empty_like(rings)
    np.put_along_axis(pos, rings, np.arange(rings.shape[1])[None, :], axis=1)
    return rings, pos


def _chains(
    name: str, coll: Collective, n: int, chunks_per_rank: int, channels: int,
    src: np.ndarray, dst: np.ndarray, chunk: np.ndarray, channel: np.ndarray, prev: np.ndarray,
    reduce: np.ndarray, in_flight: int,
) -> ScheduleArrays:  # fmt: skip
    """Flat arrays of transfers in build order, each waiting for its chain predecessor `prev`
    (-1: none) and, as `_Builder` does, for the transfer `in_flight` before it on its
    connection (src, dst, channel). Rings are ~n^2 transfers: built in numpy, not one by one."""
    m = len(src)
    win = np.full(m, -1, dtype=np.int64)
    if in_flight and m:
        conn = (src * n + dst) * channels + channel
        order = np.argsort(conn, kind="stable")
        first = np.concatenate([[True], conn[order][1:] != conn[order][:-1]])
        start = np.maximum.accumulate(np.where(first, np.arange(m), 0))
        k = np.arange(m) - start  # index within the connection
        back = order[np.maximum(np.arange(m) - in_flight, 0)]
        win[order] = np.where(k >= in_flight, back, -1)
    deps = np.stack([prev, win], axis=1)
    has = deps >= 0
    dep_ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(has.sum(axis=1), out=dep_ptr[1:])
    return ScheduleArrays(
        name=name, collective=coll, nranks=n, chunks_per_rank=chunks_per_rank,
        src=src.astype(np.int32), dst=dst.astype(np.int32), chunk=chunk.astype(np.int64),
        count=np.ones(m, dtype=np.int32), reduce=reduce, channel=channel.astype(np.int32),
        dep_ptr=dep_ptr, dep_idx=deps[has].astype(np.int64), channels=channels,
    )  # fmt: skip


def _ring_pass(
    topo: ClusterTopology, chunks: int, channels: int, shift: int
) -> tuple[np.ndarray, ...]:
    """Every rank's chunk j travelling N-1 hops on channel j % channels' ring, in build order
    (chunk j, hop h, owner o): hop h goes from ring position p(o) + h - 1 + shift to the next."""
    n = topo.world_size
    cpr = chunks * channels
    rings, pos = _ring_positions(topo, channels)
    j, h, o = (a.ravel() for a in np.meshgrid(np.arange(cpr), np.arange(1, n), np.arange(n),
                                              indexing="ij"))  # fmt: skip
    ch = j % channels
    at = pos[ch, o] + h - 1 + shift
    prev = np.where(h > 1, np.arange(len(j)) - n, -1)
    return rings[ch, at % n], rings[ch, (at + 1) % n], o * cpr + j, ch, prev


def ring_allgather(
    topo: ClusterTopology, *, chunks: int = 1, channels: int = 1, in_flight: int = 0
) -> ScheduleArrays:
    """NCCL ring allgather: each rank's chunk travels N-1 hops around its channel's ring."""
    _check_params(chunks, channels)
    n = topo.world_size
    src, dst, chunk, ch, prev = _ring_pass(topo, chunks, channels, 0)
    return _chains(f"nccl-ring-allgather-{channels}ch-{chunks}c", Collective.ALLGATHER, n,
                   chunks * channels, channels, src, dst, chunk, ch, prev,
                   np.zeros(len(src), dtype=bool), in_flight)  # fmt: skip


def ring_reducescatter(
    topo: ClusterTopology, *, chunks: int = 1, channels: int = 1, in_flight: int = 0
) -> ScheduleArrays:
    """NCCL ring reduce-scatter: each output chunk is reduced along N-1 hops ending at its owner."""
    _check_params(chunks, channels)
    n = topo.world_size
    src, dst, chunk, ch, prev = _ring_pass(topo, chunks, channels, 1)
    return _chains(f"nccl-ring-reducescatter-{channels}ch-{chunks}c", Collective.REDUCESCATTER,
                   n, chunks * channels, channels, src, dst, chunk, ch, prev,
                   np.ones(len(src), dtype=bool), in_flight)  # fmt: skip


def ring_allreduce(
    topo: ClusterTopology, *, chunks: int = 1, channels: int = 1, in_flight: int = 0
) -> ScheduleArrays:
    """NCCL ring allreduce: per loop, N segments reduce-scattered then all-gathered on the ring.

    Chunk space: chunks * channels loops of N segments each (chunks_per_rank = N*chunks*channels),
    numbered by the rank the segment is reduced on, then the loop (rank r's part of the buffer,
    as synth/assemble.allreduce numbers it; sim/symmetric_sim.py reads chunks that way).
    Build order: loop u, phase (N-1 reduce-scatter hops, then N-1 allgather hops), segment s;
    segment s ends reduced on ring[s], then travels on from it.
    """
    _check_params(chunks, channels)
    n = topo.world_size
    loops = chunks * channels
    rings, _ = _ring_positions(topo, channels)
    u, phase, seg = (a.ravel() for a in np.meshgrid(np.arange(loops), np.arange(2 * (n - 1)),
                                                    np.arange(n), indexing="ij"))  # fmt: skip
    ch = u % channels
    reduce = phase < n - 1
    at = seg + np.where(reduce, phase + 1, phase - (n - 1))  # sender's ring position
    prev = np.where(phase > 0, np.arange(len(u)) - n, -1)
    return _chains(f"nccl-ring-allreduce-{channels}ch-{chunks}c", Collective.ALLREDUCE, n,
                   n * loops, channels, rings[ch, at % n], rings[ch, (at + 1) % n],
                   rings[ch, seg] * loops + u, ch, prev, reduce, in_flight)  # fmt: skip


def ring_broadcast(
    topo: ClusterTopology,
    *,
    root: int = 0,
    chunks: int = 1,
    channels: int = 1,
    in_flight: int = IN_FLIGHT,
) -> ScheduleArrays:
    """NCCL ring broadcast: a pipelined chain from the root along each channel's ring."""
    _check_params(chunks, channels)
    n = topo.world_size
    _check_root(root, n)
    c_total = chunks * channels
    rings = [ring_order(topo, c) for c in range(channels)]
    b = _Builder(in_flight)
    for j in range(c_total):
        ch = j % channels
        ring = rings[ch]
        p = ring.index(root)
        prev = -1
        for h in range(1, n):
            prev = b.add(ring[(p + h - 1) % n], ring[(p + h) % n], j, (prev,), channel=ch)
    return b.arrays(f"nccl-ring-broadcast-{channels}ch-{chunks}c", Collective.BROADCAST, n,
                    c_total, root=root, channels=channels)  # fmt: skip


def direct_alltoall(
    topo: ClusterTopology, *, chunks: int = 1, channels: int = 1, in_flight: int = 0
) -> ScheduleArrays:
    """NCCL alltoall: every rank sends its block for peer d straight to d.

    NCCL posts the sends in rank+i order; nothing orders them but the connection slots, so on a
    symmetric fabric they are emitted as translates of rank 0's sends instead (peer s + i in the
    fabric's coordinates), which the symmetric simulator runs one orbit at a time. The set of
    transfers, and every per-connection queue, is the same either way.
    """
    _check_params(chunks, channels)
    n = topo.world_size
    c = chunks * channels
    b = _Builder(in_flight)
    sym = Translations([d.size for d in topo.dimensions]) if topo.dimensions else None
    ranks = np.arange(n, dtype=np.int64)
    for j in range(c):
        ch = j % channels
        if sym is not None and sym.n == n:
            pairs = [(s, int(d)) for s in range(n) for d in sym.add(np.full(n - 1, s), ranks[1:]).tolist()]
        else:
            pairs = [(s, (s + i) % n) for i in range(1, n) for s in range(n)]
        for s, d in pairs:
            b.add(s, d, (s * n + d) * c + j, channel=ch)
    return b.arrays(f"nccl-direct-alltoall-{channels}ch-{chunks}c", Collective.ALLTOALL, n, c,
                    channels=channels)  # fmt: skip


def _check_root(root: int, n: int) -> None:
    if not 0 <= root < n:
        raise BaselineError(f"root {root} is not a rank (0..{n - 1})")


def _tree_reduce_bcast(
    b: _Builder,
    chains: list[list[int]],
    tree: int,
    chunk: int,
    channel: int,
    *,
    count: int = 1,
    reduce_up: bool = True,
    root_node: int | None = None,
) -> None:
    """Reduce up (optional) then broadcast down one chunk over node chains + a node tree.

    chains[v] is node v's chain, head first. With `root_node`, the node tree is relabeled so
    that node sits at the tree's root (broadcast).
    """
    nn = len(chains)
    shift = 0 if root_node is None else (root_node - dtree_root(nn, tree)) % nn

    def parent_children(v: int) -> tuple[int, list[int]]:
        par, kids = dtree(nn, (v - shift) % nn, tree)
        return (-1 if par < 0 else (par + shift) % nn), [(k + shift) % nn for k in kids]

    rels = [parent_children(v) for v in range(nn)]
    root = next(v for v in range(nn) if rels[v][0] < 0)
    order = [root]  # breadth-first from the root: parents before children
    for v in order:
        order.extend(rels[v][1])
    # Writes into one buffer must be ordered (ir.py/check.py): each reduce into a head waits for
    # the previous one, so last_into[v] alone stands for "head v holds its subtree's sum".
    last_into = [-1] * nn
    if reduce_up:
        for v in range(nn):
            chain, prev = chains[v], -1
            for k in range(len(chain) - 1, 0, -1):
                prev = b.add(chain[k], chain[k - 1], chunk, (prev,), reduce=True, channel=channel,
                             count=count)  # fmt: skip
            last_into[v] = prev
        for v in reversed(order):
            par = rels[v][0]
            if par >= 0:
                last_into[par] = b.add(chains[v][0], chains[par][0], chunk,
                                       (last_into[v], last_into[par]), reduce=True,
                                       channel=channel, count=count)  # fmt: skip
    have: dict[int, list[int]] = {root: [last_into[root]]}  # deps for "head holds the result"
    for v in order:
        deps = have[v]
        for kid in rels[v][1]:
            have[kid] = [b.add(chains[v][0], chains[kid][0], chunk, deps, channel=channel,
                               count=count)]  # fmt: skip
        chain, prev_deps = chains[v], deps
        for k in range(1, len(chain)):
            prev_deps = [b.add(chain[k - 1], chain[k], chunk, prev_deps, channel=channel,
                               count=count)]  # fmt: skip


def tree_allreduce(
    topo: ClusterTopology, *, chunks: int = 1, channels: int = 1, in_flight: int = IN_FLIGHT
) -> ScheduleArrays:
    """NCCL double-binary-tree allreduce: chain in each node, binary tree over nodes, up then down."""
    _check_params(chunks, channels)
    n = topo.world_size
    c_total = chunks * channels
    layouts = ring_layouts(topo)
    chains = [[node_chain(topo, v, ch, layouts) for v in range(topo.node_count)]
              for ch in range(channels)]  # fmt: skip
    b = _Builder(in_flight)
    for j in range(c_total):
        ch = j % channels
        _tree_reduce_bcast(b, chains[ch], ch % 2, j, ch)
    return b.arrays(f"nccl-tree-allreduce-{channels}ch-{chunks}c", Collective.ALLREDUCE, n,
                    c_total, channels=channels)  # fmt: skip


def tree_broadcast(
    topo: ClusterTopology,
    *,
    root: int = 0,
    chunks: int = 1,
    channels: int = 1,
    in_flight: int = IN_FLIGHT,
) -> ScheduleArrays:
    """Broadcast down a double binary tree rooted at the root's node (chains start at root)."""
    _check_params(chunks, channels)
    n = topo.world_size
    _check_root(root, n)
    gpn = topo.gpus_per_node
    root_node = root // gpn
    c_total = chunks * channels
    layouts = ring_layouts(topo)
    b = _Builder(in_flight)
    for j in range(c_total):
        ch = j % channels
        chains = [node_chain(topo, v, ch, layouts) for v in range(topo.node_count)]
        rc = chains[root_node]
        k = rc.index(root)
        chains[root_node] = rc[k:] + rc[:k]
        _tree_reduce_bcast(b, chains, ch % 2, j, ch, reduce_up=False, root_node=root_node)
    return b.arrays(f"nccl-tree-broadcast-{channels}ch-{chunks}c", Collective.BROADCAST, n,
                    c_total, root=root, channels=channels)  # fmt: skip


def hierarchical_allreduce(
    topo: ClusterTopology,
    *,
    inter: str = "ring",
    chunks: int = 1,
    channels: int = 1,
    in_flight: int = IN_FLIGHT,
) -> ScheduleArrays:
    """Intra-node ring reduce-scatter, inter-node allreduce per slice, intra-node ring allgather.

    The point-to-point shape of NCCL's NVLS (inter="ring") and NVLS_TREE (inter="tree").
    Chunk space: loops of N chunks; chunk u*N + s*nodes + m is sub-slice m of local slice s.
    """
    _check_params(chunks, channels)
    if inter not in ("ring", "tree"):
        raise BaselineError(f"inter must be 'ring' or 'tree', got {inter!r}")
    n, gpn, nn = topo.world_size, topo.gpus_per_node, topo.node_count
    loops = chunks * channels
    layouts = ring_layouts(topo)
    b = _Builder(in_flight)
    for u in range(loops):
        ch = u % channels
        chains = [node_chain(topo, v, ch, layouts) for v in range(nn)]
        base = u * n
        # 1. intra-node reduce-scatter of slice s (nn consecutive chunks) onto chains[v][s].
        rs_last: dict[tuple[int, int], int] = {}
        for v in range(nn):
            ring = chains[v]
            prev = [-1] * gpn
            for h in range(1, gpn):
                for s in range(gpn):
                    prev[s] = b.add(ring[(s + h) % gpn], ring[(s + h + 1) % gpn],
                                    base + s * nn, (prev[s],), reduce=True, channel=ch,
                                    count=nn)  # fmt: skip
            for s in range(gpn):
                rs_last[(v, s)] = prev[s]
        # 2. inter-node allreduce of slice s among the nodes' slice owners.
        done: dict[tuple[int, int], list[int]] = {}  # (node, slice) -> deps for "owner has sum"
        for s in range(gpn):
            owners = [chains[v][s] for v in range(nn)]
            local = [rs_last[(v, s)] for v in range(nn)]
            if nn == 1:
                done[(0, s)] = [local[0]]
            elif inter == "ring":
                done.update(_inter_ring(b, owners, local, s, base + s * nn, ch))
            else:
                have = _inter_tree(b, owners, local, ch % 2, base + s * nn, ch, nn)
                done.update({(v, s): have[v] for v in range(nn)})
        # 3. intra-node allgather of slice s from chains[v][s].
        for v in range(nn):
            ring = chains[v]
            prev_deps = {s: done[(v, s)] for s in range(gpn)}
            for h in range(1, gpn):
                for s in range(gpn):
                    prev_deps[s] = [
                        b.add(
                            ring[(s + h - 1) % gpn],
                            ring[(s + h) % gpn],
                            base + s * nn,
                            prev_deps[s],
                            channel=ch,
                            count=nn,
                        )
                    ]
    name = "nvls" if inter == "ring" else "nvls_tree"
    return b.arrays(f"nccl-{name}-p2p-allreduce-{channels}ch-{chunks}c", Collective.ALLREDUCE, n,
                    n * loops, channels=channels)  # fmt: skip


def _inter_ring(
    b: _Builder, owners: list[int], local: list[int], s: int, chunk0: int, ch: int
) -> dict[tuple[int, int], list[int]]:
    """Ring allreduce of one slice (nn sub-slices from chunk0) among per-node owners.

    local[v] completes owner v's node-local sum; a rank forwards only after it.
    """
    nn = len(owners)
    last = [-1] * nn
    for h in range(1, nn):  # reduce-scatter: sub-slice m ends on owners[m]
        for m in range(nn):
            src, dst = (m + h) % nn, (m + h + 1) % nn
            last[m] = b.add(
                owners[src],
                owners[dst],
                chunk0 + m,
                (last[m], local[src], local[dst]),
                reduce=True,
                channel=ch,
            )
    done = {(v, s): [last[v], local[v]] for v in range(nn)}
    prev = [[last[m], local[m]] for m in range(nn)]
    for h in range(1, nn):  # allgather from owners[m]
        for m in range(nn):
            src, dst = (m + h - 1) % nn, (m + h) % nn
            t = b.add(owners[src], owners[dst], chunk0 + m, prev[m], channel=ch)
            prev[m] = [t]
            done[(dst, s)].append(t)
    return done


def _inter_tree(
    b: _Builder, owners: list[int], local: list[int], tree: int, chunk: int, ch: int, count: int
) -> dict[int, list[int]]:
    """Double-binary-tree allreduce of one slice among per-node owners; returns, per node, the
    transfers after which its owner holds the result."""
    nn = len(owners)
    rels = [dtree(nn, v, tree) for v in range(nn)]
    root = next(v for v in range(nn) if rels[v][0] < 0)
    order = [root]
    for v in order:
        order.extend(rels[v][1])
    last_into = list(local)  # serialized writes into each owner, as in _tree_reduce_bcast
    for v in reversed(order):
        par = rels[v][0]
        if par >= 0:
            last_into[par] = b.add(owners[v], owners[par], chunk, (last_into[v], last_into[par]),
                                   reduce=True, channel=ch, count=count)  # fmt: skip
    have = {root: [last_into[root]]}
    for v in order:
        for kid in rels[v][1]:
            have[kid] = [b.add(owners[v], owners[kid], chunk, have[v], channel=ch, count=count)]
    return have


# ---------------------------------------------------------------------------------------------
# Entry point.


def _window(in_flight: int | None) -> dict[str, int]:
    if in_flight is None:
        return {}
    if in_flight < 0:
        raise BaselineError(f"in_flight must be >= 0, got {in_flight}")
    return {"in_flight": in_flight}


def nccl_schedule_arrays(
    collective: Collective | str,
    algorithm: str,
    topo: ClusterTopology,
    *,
    chunks: int = 1,
    channels: int = 1,
    root: int = 0,
    in_flight: int | None = None,
) -> ScheduleArrays:
    """NCCL's `algorithm` for `collective` on `topo`, as flat arrays (large clusters)."""
    coll = Collective(collective)
    algo = algorithm.lower()
    if coll == Collective.ALLTOALL and algo in ("ring", "p2p"):
        algo = "direct"  # NCCL has no ring alltoall: it is always grouped send/recv
    allowed = SUPPORTED[coll]
    if algo not in allowed:
        raise BaselineError(
            f"algorithm {algorithm!r} is not available for {coll.value} (use {', '.join(allowed)})"
        )
    if coll == Collective.ALLREDUCE:
        if algo == "ring":
            return ring_allreduce(topo, chunks=chunks, channels=channels, **_window(in_flight))
        if algo == "tree":
            return tree_allreduce(topo, chunks=chunks, channels=channels, **_window(in_flight))
        inter = "ring" if algo == "nvls" else "tree"
        return hierarchical_allreduce(
            topo, inter=inter, chunks=chunks, channels=channels, **_window(in_flight)
        )
    if coll == Collective.ALLGATHER:
        return ring_allgather(topo, chunks=chunks, channels=channels, **_window(in_flight))
    if coll == Collective.REDUCESCATTER:
        return ring_reducescatter(topo, chunks=chunks, channels=channels, **_window(in_flight))
    if coll == Collective.BROADCAST:
        if algo == "ring":
            return ring_broadcast(
                topo, root=root, chunks=chunks, channels=channels, **_window(in_flight)
            )
        return tree_broadcast(
            topo, root=root, chunks=chunks, channels=channels, **_window(in_flight)
        )
    return direct_alltoall(topo, chunks=chunks, channels=channels, **_window(in_flight))


def nccl_schedule(
    collective: Collective | str,
    algorithm: str,
    topo: ClusterTopology,
    *,
    chunks: int = 1,
    channels: int = 1,
    root: int = 0,
    in_flight: int | None = None,
) -> Schedule:
    """NCCL's `algorithm` ("ring", "tree", "direct", "nvls", "nvls_tree") as a Schedule.

    `chunks` is the pipeline depth per channel; `channels` the number of NCCL channels;
    `in_flight` the chunks a connection may have outstanding (0 = unlimited; None = the
    algorithm's default, see the module docstring).
    """
    return nccl_schedule_arrays(
        collective,
        algorithm,
        topo,
        chunks=chunks,
        channels=channels,
        root=root,
        in_flight=in_flight,
    ).to_schedule()


def has_nvswitch(topo: ClusterTopology) -> bool:
    return any(d.kind == DeviceKind.NVSWITCH for d in topo.devices)
