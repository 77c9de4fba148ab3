"""One group of one dimension as a small graph: the topology a sub-demand is solved on.

A dimension of a symmetric fabric (api.cluster.Dimension) is a set of identical groups of `size`
GPUs. Positions inside a group are the coordinate along that dimension; translation
(position + t mod size) is an automorphism of every kind we model, which is what lets a pattern
solved for the group of the root be reused in every other group (SyCCL, topology symmetry).

Capacity model (per GPU `bandwidth_gbps` per direction into the dimension, as api/cluster.py says):
- switch: one port per GPU, egress and ingress each carry B.
- fully_connected: g-1 links per GPU, each B/(g-1).
- ring: two links per GPU (to +1 and -1), each B/2; a 2-ring has a single link of B.
- mesh: an explicit GPU graph with no symmetry assumed (one server's NVLinks, e.g. the DGX-1
  hybrid cube-mesh): `lanes` lists every directed pair and how many links of `bandwidth_gbps`
  it has (the cube-mesh's double NVLinks are 2 lanes). Positions are never permuted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property

from ..api.cluster import ClusterTopology, Dimension, LinkKind


@dataclass(frozen=True)
class GroupTopo:
    kind: str  # "switch" | "ring" | "fully_connected" | "mesh"
    size: int
    bandwidth_gbps: float  # per GPU per direction (mesh: per lane)
    latency_us: float
    lanes: tuple[tuple[int, int, int], ...] = ()  # mesh only: (u, v, links of bandwidth_gbps)

    @classmethod
    def of(cls, dim: Dimension) -> GroupTopo:
        return cls(dim.kind, dim.size, dim.bandwidth_gbps, dim.latency_us)

    @classmethod
    def gpu_mesh(cls, topo: ClusterTopology, node: int = 0) -> GroupTopo:
        """The GPU-to-GPU links (NVLink / xGMI) of one server as a mesh. A pair's bandwidth in
        lanes of the slowest link (the cube-mesh's 50 GB/s pairs are 2 lanes of 25)."""
        n = topo.gpus_per_node
        ids = {topo.gpu_id(node * n + i): i for i in range(n)}
        pairs = [(ids[lk.a], ids[lk.b], lk) for lk in topo.links
                 if lk.kind in (LinkKind.NVLINK, LinkKind.XGMI) and lk.a in ids and lk.b in ids]  # fmt: skip
        if not pairs:
            raise ValueError(f"cluster {topo.name!r}: no GPU-to-GPU links in server {node}")
        unit = min(lk.bandwidth_gbps for _, _, lk in pairs)
        lanes = []
        for u, v, lk in pairs:
            k = round(lk.bandwidth_gbps / unit)
            if abs(k * unit - lk.bandwidth_gbps) > 1e-6 * unit:
                raise ValueError(f"link {lk.a}-{lk.b}: {lk.bandwidth_gbps} GB/s is not a "
                                 f"multiple of the slowest GPU link ({unit} GB/s)")  # fmt: skip
            lanes += [(u, v, k), (v, u, k)]
        latency = max(lk.latency_us for _, _, lk in pairs)
        return cls("mesh", n, unit, latency, tuple(sorted(lanes)))

    def links(self) -> list[tuple[int, int]]:
        """Directed links (u, v) a transfer may use in one hop."""
        g = self.size
        if self.kind == "mesh":
            return [(u, v) for u, v, k in self.lanes if k > 0]
        if g == 1:
            return []
        if self.kind == "ring" and g > 2:
            return [(u, (u + d) % g) for u in range(g) for d in (1, g - 1)]
        return [(u, v) for u in range(g) for v in range(g) if u != v]

    def capacity(self, u: int, v: int) -> int:
        """Pieces link (u, v) carries per epoch (one epoch = one piece over one lane)."""
        if self.kind == "mesh":
            return self._lanes.get((u, v), 0)
        return 1

    @cached_property
    def _lanes(self) -> dict[tuple[int, int], int]:
        return {(u, v): k for u, v, k in self.lanes}

    @cached_property
    def _distance(self) -> list[list[int]]:
        """Hop counts between positions of a mesh (breadth-first; unreachable: size)."""
        out = []
        nxt: dict[int, list[int]] = {}
        for u, v in self.links():
            nxt.setdefault(u, []).append(v)
        for s in range(self.size):
            dist = [self.size] * self.size
            dist[s] = 0
            todo = deque([s])
            while todo:
                u = todo.popleft()
                for v in nxt.get(u, []):
                    if dist[v] > dist[u] + 1:
                        dist[v] = dist[u] + 1
                        todo.append(v)
            out.append(dist)
        return out

    def link_gbps(self) -> float:
        """Bandwidth of one directed link (for a switch: of one port; for a mesh: one lane)."""
        g = self.size
        if self.kind == "fully_connected" and g > 1:
            return self.bandwidth_gbps / (g - 1)
        if self.kind == "ring" and g > 2:
            return self.bandwidth_gbps / 2
        return self.bandwidth_gbps

    def link_class(self, u: int, v: int) -> int:
        """Orbit of link (u, v) under translation: links in one class share load symmetrically
        (a mesh assumes no symmetry: every link is its own class)."""
        if self.kind == "mesh":
            return u * self.size + v
        return (v - u) % self.size

    def hops(self, u: int, v: int) -> int:
        if u == v:
            return 0
        if self.kind == "mesh":
            return self._distance[u][v]
        if self.kind == "ring" and self.size > 2:
            d = (v - u) % self.size
            return min(d, self.size - d)
        return 1

    def shortest_paths(self, u: int, v: int) -> list[list[int]]:
        """All shortest paths as node lists (two on a ring when the distance ties)."""
        if u == v:
            return [[u]]
        if self.kind == "mesh":
            return self._mesh_paths(u, v)
        if self.kind != "ring" or self.size <= 2:
            return [[u, v]]
        g = self.size
        fwd = (v - u) % g
        back = g - fwd
        paths = []
        if fwd <= back:
            paths.append([(u + i) % g for i in range(fwd + 1)])
        if back <= fwd:
            paths.append([(u - i) % g for i in range(back + 1)])
        return paths

    def _mesh_paths(self, u: int, v: int) -> list[list[int]]:
        if self.hops(u, v) >= self.size:
            return []
        paths = [[u]]
        while paths[0][-1] != v:
            paths = [[*p, w] for p in paths for x, w in self.links()
                     if x == p[-1] and self.hops(w, v) == self.hops(p[-1], v) - 1]  # fmt: skip
        return paths
