"""Lower bounds on collective time, true under the simulator's cost model (simulate.py).

The simulator runs a transfer `alpha = step latency + path latency` after it becomes ready, then
moves its bytes along its path at no more than `capacity * efficiency` per directed link, and on an
NVLink also x the protocol cost's `nvlink_efficiency` (SM-driven copies reach ~80% of line rate;
1.0 in the bare protocol costs, so a bound from those counts NVLink at line rate). So for any
correct schedule, and any set S of ranks whose GPUs sit inside a device set D:
- every byte that must enter S crosses a link into D, and none flows before the smallest alpha of
  any transfer into S; hence T >= alpha_min(into S) + bytes_in(S) / (cap_in(D) * efficiency);
  likewise for bytes that must leave S.
- S = one rank gives the per-rank bound (its injection bandwidth); S = a block of the fabric
  (a node, a dimension's group) gives a cut bound; the whole cluster gives the aggregate bound.
  A rank's injection counts only the links some route of sim/routing.py uses (`injection_at`):
  on a mesh every peer is one NVLink hop away, so no route enters a GPU by its PCIe link.
- hop latency: data of rank a must reach rank b, through relays if need be; each transfer pays the
  step latency and its path's latency, so T >= the cheapest such route (Dijkstra over the device
  graph where passing through a GPU costs another step).

Bytes that must cross (M = nccl-tests size, N ranks, s = |S|, 0 < s < N):
  allgather     in (N-s)/N M, out s/N M        reducescatter  in s/N M, out (N-s)/N M
  allreduce     in M, out M                     alltoall       in = out = s (N-s) M / N
  broadcast     M into S if the root is outside, M out of S if inside.
Aggregate (total bytes received by all ranks): allreduce 2(N-1) M, since every element needs at
least 2(N-1) one-way transfers (the one-way gossip minimum 2n-2); the others (N-1) M.
Partition (allreduce): split the ranks into k blocks (nodes, a dimension's groups); moves inside a
block are free, so each element is still a one-way gossip among k blocks: >= 2(k-1) M bytes
enter some block, T >= alpha_min + 2(k-1) M / (sum of the blocks' in-capacity). For k = 2 it is
the cut bound; for more blocks it is tighter than "M into every block".
Channel caps (LL128) only slow the simulator further, so the bounds ignore them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...api.cluster import ClusterTopology, DeviceKind, LinkKind
from ...api.common import Collective
from .busbw import busbw_gbps
from .protocols import PROTOCOL_COSTS, ProtocolCost, canonical_protocol

_FULL_LATENCY_RANKS = 256  # beyond this, the hop-latency bound samples source ranks (still valid)
_EPS = 1e-9  # routing.Router's tolerance for equal-latency paths


@dataclass(frozen=True, slots=True)
class Bound:
    time_us: float
    busbw_gbps: float  # the busbw this time implies (nccl-tests factors); an upper bound on busbw
    binding: str  # which bound is the largest: "rank-bandwidth", "aggregate", "cut:<name>", ...
    parts: dict[str, float] = field(default_factory=dict)  # every bound computed, us


class _Graph:
    """Directed device graph of a topology (like routing.Router, without path choice)."""

    def __init__(self, topo: ClusterTopology) -> None:
        self.topo = topo
        names: dict[str, int] = {}
        for dev in topo.devices:
            names.setdefault(dev.id, len(names))
        for link in topo.links:
            names.setdefault(link.a, len(names))
            names.setdefault(link.b, len(names))
        self.names = names
        nv = len(names)
        self.adj: list[list[tuple[int, float, float]]] = [[] for _ in range(nv)]  # (v, lat, bw)
        self.nvlink: list[set[int]] = [set() for _ in range(nv)]  # neighbours over an NVLink
        self.adj_link: list[list[int]] = [[] for _ in range(nv)]  # topo.links index per adj entry
        for i, link in enumerate(topo.links):
            a, b = names[link.a], names[link.b]
            self.adj[a].append((b, link.latency_us, link.bandwidth_gbps))
            self.adj[b].append((a, link.latency_us, link.bandwidth_gbps))
            self.adj_link[a].append(i)
            self.adj_link[b].append(i)
            if LinkKind(link.kind) == LinkKind.NVLINK:  # as sim/capacity.py nvlink_channels
                self.nvlink[a].add(b)
                self.nvlink[b].add(a)
        self.is_gpu = [False] * nv
        for dev in topo.devices:
            if dev.kind == DeviceKind.GPU:
                self.is_gpu[names[dev.id]] = True
        self.rank_vertex: list[int] = []
        for r in range(topo.world_size):
            v = names.get(topo.gpu_id(r), -1)
            self.rank_vertex.append(v)
            if v >= 0:
                self.is_gpu[v] = True
        self.vertex_rank = {v: r for r, v in enumerate(self.rank_vertex) if v >= 0}
        self.node_of = {names[d.id]: d.node for d in topo.devices if d.node is not None}
        self._routed: list[list[int]] | None = None  # per rank: its links some route uses
        self._dist: dict[tuple[float, int], list[float]] = {}
        self._near: dict[tuple[float, int], tuple[float, float]] = {}
        self._between: dict[tuple[float, frozenset[int], bool], float] = {}
        self._blocks: dict[frozenset[int], frozenset[int]] = {}

    def into(self, ranks: set[int], step: float, inward: bool) -> float:
        """Route latency from the nearest rank outside `ranks` into them (or out, `inward`
        False); cached: every size of a synthesis asks for the same cuts."""
        key = (step, frozenset(ranks), inward)
        got = self._between.get(key)
        if got is None:
            outside = set(range(len(self.rank_vertex))) - ranks
            d = self.distances(outside, step, stop=ranks) if inward else \
                self.distances(ranks, step, stop=outside)  # fmt: skip
            assert isinstance(d, float)
            got = self._between[key] = d
        return got

    def distances(self, sources: Iterable[int], step: float, stop: set[int] | None = None) -> (
        list[float] | float
    ):  # fmt: skip
        """Cheapest route latency from the source ranks' GPUs (multi-source).

        Leaving a GPU that is not a source costs `step` (a relay = another transfer). With
        `stop` (rank set), returns the distance to the nearest of them instead of the array.
        """
        nv = len(self.adj)
        inf = float("inf")
        dist = [inf] * nv
        heap: list[tuple[float, int]] = []
        srcs = {self.rank_vertex[r] for r in sources if self.rank_vertex[r] >= 0}
        for v in srcs:
            dist[v] = 0.0
            heap.append((0.0, v))
        heapq.heapify(heap)
        targets = None if stop is None else {self.rank_vertex[r] for r in stop}
        done = [False] * nv
        while heap:
            d, u = heapq.heappop(heap)
            if done[u]:
                continue
            done[u] = True
            if targets is not None and u in targets:
                return d
            extra = step if (self.is_gpu[u] and u not in srcs) else 0.0
            for v, lat, _ in self.adj[u]:
                nd = d + lat + extra
                if nd < dist[v]:
                    dist[v] = nd
                    heapq.heappush(heap, (nd, v))
        return inf if targets is not None else dist

    def nearest(self, r: int, step: float) -> tuple[float, float]:
        """Route latency into rank r from the nearest other rank, and out of r to the nearest
        other; cached, as it does not depend on the size (synthesis asks at every size)."""
        key = (step, r)
        got = self._near.get(key)
        if got is None:
            others = set(range(len(self.rank_vertex))) - {r}
            d_in = self.distances(others, step, stop={r})
            d_out = self.distances([r], step, stop=others)
            assert isinstance(d_in, float) and isinstance(d_out, float)
            got = self._near[key] = (d_in, d_out)
        return got

    def rank_distances(self, src: int, step: float) -> list[float]:
        key = (step, src)
        got = self._dist.get(key)
        if got is None:
            dv = self.distances([src], step)
            assert isinstance(dv, list)
            inf = float("inf")
            got = [dv[v] if v >= 0 else inf for v in self.rank_vertex]
            self._dist[key] = got
        return got

    def block_devices(self, ranks: set[int]) -> set[int]:
        """A device set owned by `ranks` with a small boundary: their GPUs, every device of the
        nodes they fill, and any switch with more link capacity into the set than out of it
        (fixpoint); cached per rank set."""
        key = frozenset(ranks)
        if key not in self._blocks:
            self._blocks[key] = frozenset(self._block_devices(ranks))
        return set(self._blocks[key])

    def _block_devices(self, ranks: set[int]) -> set[int]:
        gpn = self.topo.gpus_per_node
        full_nodes = {
            self.topo.nodes[i].name
            for i in range(self.topo.node_count)
            if all(i * gpn + k in ranks for k in range(gpn))
        }
        inside = {self.rank_vertex[r] for r in ranks if self.rank_vertex[r] >= 0}
        inside |= {v for v, node in self.node_of.items()
                   if node in full_nodes and not self._foreign_gpu(v, ranks)}  # fmt: skip
        # Any device set holding no other rank's GPU is a valid cut, so a switch joins when its
        # links into the set carry more than its links out: an oversubscribed leaf's uplink
        # (astra-3tier-128: 32 NICs x 50 GB/s under one 800 GB/s uplink) is then the cut.
        changed = True
        while changed:
            changed = False
            for v in range(len(self.adj)):
                if v in inside or self.is_gpu[v] or not self.adj[v]:
                    continue
                into = sum(bw for w, _, bw in self.adj[v] if w in inside)
                out = sum(bw for w, _, bw in self.adj[v] if w not in inside)
                if into > 0 and (out == 0 or into > out):
                    inside.add(v)
                    changed = True
        return inside

    def _foreign_gpu(self, v: int, ranks: set[int]) -> bool:
        return self.is_gpu[v] and self.vertex_rank.get(v, -1) not in ranks

    def cut_capacity(self, inside: set[int], nvlink_efficiency: float = 1.0) -> float:
        """GB/s per direction across the boundary of `inside` (links are full duplex), NVLinks
        at `nvlink_efficiency` of their line rate."""
        return sum(bw * (nvlink_efficiency if v in self.nvlink[u] else 1.0)
                   for u in inside for v, _, bw in self.adj[u] if v not in inside)  # fmt: skip

    def injection_at(self, r: int, nvlink_efficiency: float) -> float:
        """GB/s per direction over rank r's links that some route into or out of r uses, its
        NVLinks at `nvlink_efficiency` of line rate."""
        if self.rank_vertex[r] < 0:
            return 0.0
        if self._routed is None:
            self._routed = [self.routed_links(r) for r in range(len(self.rank_vertex))]
        links = self.topo.links
        return sum(links[i].bandwidth_gbps
                   * (nvlink_efficiency if LinkKind(links[i].kind) == LinkKind.NVLINK else 1.0)
                   for i in self._routed[r])  # fmt: skip

    def routed_links(self, r: int) -> list[int]:
        """Indices in topo.links of rank r's links that some simulated route may use.

        sim/routing.py routes a transfer on a shortest path by hop count, then latency, never
        through a third GPU, choosing only among such paths. Links are full duplex with one
        latency, so the routes into r are the routes out of r reversed: a link of r is used iff
        it starts a shortest path from r to another rank. A GPU-to-GPU link is such a path
        (one hop), so the search runs for ranks with one (meshes, bridged pairs); the others
        keep every link, a weaker bound that is still true (docs/cost-model.md says where the
        search would find more)."""
        v = self.rank_vertex[r]
        if v < 0:
            return []
        if not any(self.is_gpu[w] for w, _, _ in self.adj[v]):
            return list(self.adj_link[v])
        return self.links_on_routes(r)

    def links_on_routes(self, r: int) -> list[int]:
        """`routed_links` without the shortcut: searched for every rank."""
        v = self.rank_vertex[r]
        adj = self.adj[v]
        # Layered search as routing.Router._tree: per vertex its (hops, latency) and the tight
        # predecessors; GPUs other than r end a path.
        inf = float("inf")
        lat: dict[int, float] = {v: 0.0}
        preds: dict[int, list[int]] = {}
        frontier = [v]
        while frontier:
            best: dict[int, float] = {}
            cands: list[tuple[int, int, float]] = []
            for u in frontier:
                if u != v and self.is_gpu[u]:
                    continue
                for w, link_lat, _ in self.adj[u]:
                    if w in lat:
                        continue
                    c = lat[u] + link_lat
                    cands.append((u, w, c))
                    if c < best.get(w, inf):
                        best[w] = c
            for u, w, c in cands:
                if c <= best[w] + _EPS * max(1.0, best[w]):
                    preds.setdefault(w, []).append(u)
            lat.update(best)
            frontier = list(best)
        # Vertices on some tight path to another rank's GPU.
        on_route: set[int] = set()
        todo = [w for w in (self.rank_vertex[t] for t in range(len(self.rank_vertex)) if t != r)
                if w in lat]  # fmt: skip
        while todo:
            w = todo.pop()
            if w in on_route or w == v:
                continue
            on_route.add(w)
            todo.extend(preds.get(w, ()))
        return [self.adj_link[v][j] for j, (w, link_lat, _) in enumerate(adj)
                if w in on_route and link_lat <= lat[w] + _EPS * max(1.0, lat[w])]  # fmt: skip


_CACHE: dict[int, tuple[ClusterTopology, _Graph]] = {}


def _graph(topo: ClusterTopology) -> _Graph:
    hit = _CACHE.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    g = _Graph(topo)
    if len(_CACHE) >= 16:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(topo)] = (topo, g)
    return g


graph_of = _graph  # for the other bounds of this package (sm_bound.py)


def _crossing(
    coll: Collective, n: int, s: int, size: float, root_inside: bool
) -> tuple[float, float]:
    """(bytes that must enter S, bytes that must leave S) for |S| = s of n ranks."""
    if s <= 0 or s >= n:
        return 0.0, 0.0
    if coll == Collective.ALLGATHER:
        return (n - s) / n * size, s / n * size
    if coll == Collective.REDUCESCATTER:
        return s / n * size, (n - s) / n * size
    if coll == Collective.ALLREDUCE:
        return size, size
    if coll == Collective.ALLTOALL:
        v = s * (n - s) * size / n
        return v, v
    return (0.0, size) if root_inside else (size, 0.0)


def _aggregate_bytes(coll: Collective, n: int, size: float) -> float:
    if coll == Collective.ALLREDUCE:
        return 2.0 * (n - 1) * size
    return (n - 1) * size


def _cut_sets(topo: ClusterTopology, root: int) -> list[tuple[str, set[int]]]:
    """Rank sets to cut at: each dimension's group (prefix blocks) and each node, for the group
    holding rank 0, the last rank and the root."""
    n, gpn = topo.world_size, topo.gpus_per_node
    probes = sorted({0, n - 1, root})
    out: list[tuple[str, set[int]]] = []
    seen: set[frozenset[int]] = set()

    def add(name: str, ranks: set[int]) -> None:
        key = frozenset(ranks)
        if 0 < len(ranks) < n and key not in seen:
            seen.add(key)
            out.append((name, ranks))

    if topo.dimensions:
        block = 1
        for d in range(1, len(topo.dimensions)):
            block *= topo.dimensions[d - 1].size
            name = f"cut:{topo.dimensions[d].name}"
            for p in probes:
                start = p // block * block
                add(name, set(range(start, start + block)))
    if topo.node_count > 1:
        for p in probes:
            node = p // gpn
            add("cut:node", set(range(node * gpn, node * gpn + gpn)))
    return out


def _partitions(topo: ClusterTopology) -> list[tuple[str, int]]:
    """(name, block size) of the partitions into > 2 equal blocks of consecutive ranks."""
    n = topo.world_size
    out: dict[int, str] = {}
    if topo.dimensions:
        block = 1
        for d in range(1, len(topo.dimensions)):
            block *= topo.dimensions[d - 1].size
            out.setdefault(block, topo.dimensions[d].name)
    if topo.node_count > 1:
        out.setdefault(topo.gpus_per_node, "node")
    return [(name, b) for b, name in sorted(out.items()) if n % b == 0 and n // b > 2]


def lower_bound(
    collective: Collective | str,
    size_bytes: int | float,
    topo: ClusterTopology,
    protocol: str | ProtocolCost = "Simple",
    *,
    root: int = 0,
) -> Bound:
    """Largest of the per-rank, aggregate, cut and hop-latency bounds for one collective call."""
    coll = Collective(collective)
    if size_bytes <= 0:
        raise ValueError(f"size must be positive, got {size_bytes} bytes")
    proto = (
        protocol
        if isinstance(protocol, ProtocolCost)
        else PROTOCOL_COSTS[canonical_protocol(protocol)]
    )
    n = topo.world_size
    if not 0 <= root < n:
        raise ValueError(f"root {root} is not a rank (0..{n - 1})")
    if n <= 1:
        return Bound(0.0, float("inf"), "single-rank", {})
    g = _graph(topo)
    step, eff, nvl = proto.step_latency_us, proto.efficiency, proto.nvlink_efficiency
    size = float(size_bytes)
    parts: dict[str, float] = {}

    def bw_time(nbytes: float, cap_gbps: float) -> float:
        if nbytes <= 0:
            return 0.0
        return nbytes / (cap_gbps * eff * 1e3) if cap_gbps > 0 else float("inf")

    def note(name: str, t: float) -> None:
        if t > parts.get(name, -1.0):
            parts[name] = t

    # Per rank: its own injection links, after the earliest any transfer can reach/leave it.
    alpha_in: list[float] = []
    for r in range(n):
        d_in, d_out = g.nearest(r, step)
        a_in, a_out = step + d_in, step + d_out
        alpha_in.append(a_in)
        b_in, b_out = _crossing(coll, n, 1, size, r == root)
        cap = g.injection_at(r, nvl)
        note("rank-bandwidth", max(a_in + bw_time(b_in, cap) if b_in else 0.0,
                                   a_out + bw_time(b_out, cap) if b_out else 0.0))  # fmt: skip
    # Aggregate: all bytes every rank must receive, over all injection bandwidth.
    total_cap = sum(g.injection_at(r, nvl) for r in range(n))
    note("aggregate", min(alpha_in) + bw_time(_aggregate_bytes(coll, n, size), total_cap))
    # Cuts.
    for name, ranks in _cut_sets(topo, root):
        inside = g.block_devices(ranks)
        cap = g.cut_capacity(inside, nvl)
        b_in, b_out = _crossing(coll, n, len(ranks), size, root in ranks)
        t = 0.0
        if b_in:
            t = max(t, step + g.into(ranks, step, True) + bw_time(b_in, cap))
        if b_out:
            t = max(t, step + g.into(ranks, step, False) + bw_time(b_out, cap))
        note(name, t)
    if coll == Collective.ALLREDUCE:
        for name, block in _partitions(topo):
            k = n // block
            cap = sum(g.cut_capacity(g.block_devices(set(range(b, b + block))), nvl)
                      for b in range(0, n, block))  # fmt: skip
            note(f"partition:{name}", min(alpha_in) + bw_time(2.0 * (k - 1) * size, cap))
    # Hop latency: the farthest pair whose data must meet.
    sources = [root] if coll == Collective.BROADCAST else _latency_sources(topo)
    far = 0.0
    for src in sources:
        dist = g.rank_distances(src, step)
        far = max(far, max(d for r, d in enumerate(dist) if r != src))
    note("hop-latency", step + far)
    binding = max(parts, key=lambda k: parts[k])
    t = parts[binding]
    return Bound(t, busbw_gbps(coll, n, size, t) if t > 0 else float("inf"), binding, parts)


def _latency_sources(topo: ClusterTopology) -> list[int]:
    n = topo.world_size
    if n <= _FULL_LATENCY_RANKS:
        return list(range(n))
    gpn = topo.gpus_per_node
    # A subset of sources still gives a valid (if weaker) bound: first and last node, and a
    # spread of others.
    picks = set(range(gpn)) | set(range(n - gpn, n)) | set(range(0, n, max(1, n // 64)))
    return sorted(picks)
