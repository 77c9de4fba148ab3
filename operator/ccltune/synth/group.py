"""One group of one dimension as a small graph: the topology a sub-demand is solved on.

A dimension of a symmetric fabric (api.cluster.Dimension) is a set of identical groups of `size`
GPUs. Positions inside a group are the coordinate along that dimension; translation
(position + t mod size) is an automorphism of every kind we model, which is what lets a pattern
solved for the group of the root be reused in every other group (SyCCL, topology symmetry).

Capacity model (per GPU `bandwidth_gbps` per direction into the dimension, as api/cluster.py says):
- switch: one port per GPU, egress and ingress each carry B.
- fully_connected: g-1 links per GPU, each B/(g-1).
- ring: two links per GPU (to +1 and -1), each B/2; a 2-ring has a single link of B.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.cluster import Dimension


@dataclass(frozen=True, slots=True)
class GroupTopo:
    kind: str  # "switch" | "ring" | "fully_connected"
    size: int
    bandwidth_gbps: float  # per GPU per direction
    latency_us: float

    @classmethod
    def of(cls, dim: Dimension) -> GroupTopo:
        return cls(dim.kind, dim.size, dim.bandwidth_gbps, dim.latency_us)

    def links(self) -> list[tuple[int, int]]:
        """Directed links (u, v) a transfer may use in one hop."""
        g = self.size
        if g == 1:
            return []
        if self.kind == "ring" and g > 2:
            return [(u, (u + d) % g) for u in range(g) for d in (1, g - 1)]
        return [(u, v) for u in range(g) for v in range(g) if u != v]

    def link_gbps(self) -> float:
        """Bandwidth of one directed link (for a switch: of one port)."""
        g = self.size
        if self.kind == "fully_connected" and g > 1:
            return self.bandwidth_gbps / (g - 1)
        if self.kind == "ring" and g > 2:
            return self.bandwidth_gbps / 2
        return self.bandwidth_gbps

    def link_class(self, u: int, v: int) -> int:
        """Orbit of link (u, v) under translation: links in one class share load symmetrically."""
        return (v - u) % self.size

    def hops(self, u: int, v: int) -> int:
        if u == v:
            return 0
        if self.kind == "ring" and self.size > 2:
            d = (v - u) % self.size
            return min(d, self.size - d)
        return 1

    def shortest_paths(self, u: int, v: int) -> list[list[int]]:
        """All shortest paths as node lists (two on a ring when the distance ties)."""
        if u == v:
            return [[u]]
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
