"""Routing on a ClusterTopology: directed channels and shortest GPU-to-GPU paths.

Every full-duplex `Link` becomes two directed channels: 2*i is a->b and 2*i+1 is b->a, each with
the link's bandwidth (GB/s) and latency (us). GPUs are path endpoints only: traffic between two GPUs
crosses NVSwitches, NICs, PCIe switches, CPUs and leaf/spine switches, never a third GPU (NCCL's
relaying through GPUs is a schedule decision, expressed as separate transfers).

Paths are shortest by hop count, then by summed latency. Among equally short paths the choice is
a deterministic hash of (src, dst, hop), as ECMP switches spread flows over equal-cost uplinks;
`ecmp=False` takes the lowest channel index instead.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...api.cluster import ClusterTopology, DeviceKind
from ...api.errors import InternalError
from .arrays import sorted_unique


class RoutingError(InternalError):
    """Two ranks cannot reach each other, or a rank has no device in the topology."""


_EPS = 1e-9


def _mix(src: int, dst: int, hop: int) -> int:
    # SplitMix-style integer hash: deterministic across runs (unlike hash() of str).
    x = (src * 0x9E3779B1 + dst * 0x85EBCA77 + hop * 0xC2B2AE3D) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 29
    return x


class Router:
    """Directed channels of a topology and cached shortest paths between ranks."""

    def __init__(self, topo: ClusterTopology, *, ecmp: bool = True) -> None:
        self.topo = topo
        self.ecmp = ecmp
        self.nranks = topo.world_size
        vertices: dict[str, int] = {}
        for dev in topo.devices:
            vertices.setdefault(dev.id, len(vertices))
        for link in topo.links:
            vertices.setdefault(link.a, len(vertices))
            vertices.setdefault(link.b, len(vertices))
        self.vertex_names = list(vertices)
        nvert = len(self.vertex_names)
        gpu = np.zeros(nvert, dtype=bool)
        for dev in topo.devices:
            if dev.kind == DeviceKind.GPU:
                gpu[vertices[dev.id]] = True
        self.rank_vertex = np.full(self.nranks, -1, dtype=np.int64)
        for rank in range(self.nranks):
            v = vertices.get(topo.gpu_id(rank))
            if v is not None:
                self.rank_vertex[rank] = v
                gpu[v] = True
        self.is_gpu = gpu
        nch = 2 * len(topo.links)
        self.capacity = np.empty(nch, dtype=np.float64)  # GB/s per direction
        self.latency = np.empty(nch, dtype=np.float64)  # us
        self.chan_src = np.empty(nch, dtype=np.int64)
        self.chan_dst = np.empty(nch, dtype=np.int64)
        for i, link in enumerate(topo.links):
            a, b = vertices[link.a], vertices[link.b]
            for c, (u, v) in ((2 * i, (a, b)), (2 * i + 1, (b, a))):
                self.capacity[c] = link.bandwidth_gbps
                self.latency[c] = link.latency_us
                self.chan_src[c] = u
                self.chan_dst[c] = v
        # Out-channels of each vertex as CSR, for the layer-by-layer search.
        order = np.lexsort((np.arange(nch), self.chan_src))
        self._out_ch = order.astype(np.int64)
        self._out_ptr = np.searchsorted(self.chan_src[order], np.arange(nvert + 1))
        self._trees: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}
        self._behind: dict[int, set[int]] = {}
        nic = np.zeros(nvert, dtype=bool)
        for dev in topo.devices:
            if dev.kind == DeviceKind.NIC:
                nic[vertices[dev.id]] = True
        self.home_nic = self._bind_nics(nic)

    def _bind_nics(self, nic: np.ndarray) -> np.ndarray:
        """Each GPU's own NIC among the nearest ones, as NCCL binds them (-1: none).

        GPUs that see the same nearest NICs share them round-robin in rank order, so GPU k of a
        PCIe switch with two NICs uses NIC k: traffic leaves by the GPU's own rail instead of a
        hash, which also keeps routes equivariant under the fabric's symmetries.
        """
        home = np.full(len(nic), -1, dtype=np.int64)
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.nranks):
            g = int(self.rank_vertex[rank])
            if g < 0:
                continue
            seen, frontier = {g}, [g]
            found: list[int] = []
            while frontier and not found:
                nxt: list[int] = []
                for u in frontier:
                    for c in self._out_ch[self._out_ptr[u] : self._out_ptr[u + 1]].tolist():
                        v = int(self.chan_dst[c])
                        if v in seen or self.is_gpu[v]:
                            continue
                        seen.add(v)
                        (found if nic[v] else nxt).append(v)
                frontier = nxt
            if found:
                groups.setdefault(tuple(sorted(found)), []).append(g)
        for nics, gpus in groups.items():
            for k, g in enumerate(gpus):
                home[g] = nics[k % len(nics)]
        return home

    @property
    def nchannels(self) -> int:
        return len(self.capacity)

    def channel_name(self, channel: int) -> str:
        names = self.vertex_names
        return f"{names[self.chan_src[channel]]}->{names[self.chan_dst[channel]]}"

    def _vertex(self, rank: int) -> int:
        if not 0 <= rank < self.nranks:
            raise RoutingError(
                f"rank {rank} is outside cluster {self.topo.name!r} ({self.nranks} ranks)"
            )
        v = int(self.rank_vertex[rank])
        if v < 0:
            raise RoutingError(
                f"rank {rank} ({self.topo.gpu_id(rank)}) has no links in cluster {self.topo.name!r}"
            )
        return v

    def _tree(self, src: int) -> tuple[np.ndarray, np.ndarray]:
        """Tight predecessor channels of every vertex on shortest (hops, latency) paths from src.

        Breadth-first by hop count (the primary key), so each BFS layer is a DAG level and the
        best latency per vertex is a min over the previous layer: vectorized per layer.
        Returns CSR (ptr, channels) indexed by vertex, channels sorted by index.
        """
        tree = self._trees.get(src)
        if tree is not None:
            return tree
        s = self._vertex(src)
        nvert = len(self.vertex_names)
        seen = np.zeros(nvert, dtype=bool)
        lat = np.full(nvert, np.inf)
        seen[s] = True
        lat[s] = 0.0
        frontier = np.array([s], dtype=np.int64)
        tight_parts: list[np.ndarray] = []
        first = True
        while len(frontier):
            if not first:
                frontier = frontier[~self.is_gpu[frontier]]  # GPUs are endpoints, never transit
            first = False
            lo, hi = self._out_ptr[frontier], self._out_ptr[frontier + 1]
            lens = hi - lo
            total = int(lens.sum())
            if total == 0:
                break
            idx = np.repeat(lo - np.cumsum(lens) + lens, lens) + np.arange(total)
            ch = self._out_ch[idx]
            v = self.chan_dst[ch]
            fresh = ~seen[v]
            ch, v = ch[fresh], v[fresh]
            if not len(ch):
                break
            cand = lat[self.chan_src[ch]] + self.latency[ch]
            best = np.full(nvert, np.inf)
            np.minimum.at(best, v, cand)
            bv = best[v]
            tight_parts.append(ch[cand <= bv + _EPS * np.maximum(1.0, bv)])
            frontier = sorted_unique(v)
            seen[frontier] = True
            lat[frontier] = best[frontier]
        tch = np.concatenate(tight_parts) if tight_parts else np.zeros(0, dtype=np.int64)
        tv = self.chan_dst[tch]
        order = np.lexsort((tch, tv))
        tch, tv = tch[order], tv[order]
        tree = (np.searchsorted(tv, np.arange(nvert + 1)), tch)
        self._trees[src] = tree
        return tree

    def path(self, src: int, dst: int) -> tuple[int, ...]:
        """Directed channel indices from rank `src` to rank `dst`, in order."""
        key = (src, dst)
        cached = self._paths.get(key)
        if cached is not None:
            return cached
        if src == dst:
            raise RoutingError(f"no path from rank {src} to itself")
        ptr, tch = self._tree(src)
        s, v = self._vertex(src), self._vertex(dst)
        if ptr[v] == ptr[v + 1]:
            raise RoutingError(
                f"rank {src} ({self.topo.gpu_id(src)}) cannot reach rank {dst} "
                f"({self.topo.gpu_id(dst)}) in cluster {self.topo.name!r}"
            )
        rev: list[int] = []
        hop = 0
        prefer = {int(self.home_nic[v]), int(self.home_nic[s])} - {-1}
        via_home = self._behind_home_nic(src)
        while v != s:
            cands = tch[ptr[v] : ptr[v + 1]].tolist()
            # Past the source's NIC (rail and spine switches) keep to routes that leave by it: the
            # NIC a channel uses is NCCL's choice (graph->inter), not a hash at the spine.
            behind = [c for c in cands if int(self.chan_src[c]) in via_home]
            if behind:
                cands = behind
            own = [c for c in cands if int(self.chan_src[c]) in prefer] if len(cands) > 1 else []
            if len(own) == 1:
                c = own[0]
            else:
                c = cands[_mix(src, dst, hop) % len(cands)] if self.ecmp else cands[0]
            rev.append(c)
            v = int(self.chan_src[c])
            hop += 1
        result = tuple(reversed(rev))
        self._paths[key] = result
        return result

    def _behind_home_nic(self, src: int) -> set[int]:
        """Vertices that shortest routes from `src` reach through its home NIC (incl. the NIC)."""
        cached = self._behind.get(src)
        if cached is not None:
            return cached
        nic = int(self.home_nic[self._vertex(src)])
        ptr, tch = self._tree(src)
        if nic < 0 or ptr[nic] == ptr[nic + 1]:
            self._behind[src] = set()
            return self._behind[src]
        children: dict[int, list[int]] = {}
        for c in tch.tolist():
            children.setdefault(int(self.chan_src[c]), []).append(int(self.chan_dst[c]))
        seen, todo = {nic}, [nic]
        while todo:
            u = todo.pop()
            for w in children.get(u, []):
                if w not in seen and not self.is_gpu[w]:
                    seen.add(w)
                    todo.append(w)
        self._behind[src] = seen
        return seen

    def path_latency(self, src: int, dst: int) -> float:
        return float(sum(self.latency[c] for c in self.path(src, dst)))

    def path_bandwidth(self, src: int, dst: int) -> float:
        """Bottleneck bandwidth (GB/s) of the path when nothing else uses it."""
        return float(min(self.capacity[c] for c in self.path(src, dst)))

    def paths_csr(
        self, pairs: Iterable[tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Paths of many (src, dst) pairs as CSR: (offsets, channels, summed latency)."""
        offsets = [0]
        chans: list[int] = []
        lats: list[float] = []
        for src, dst in pairs:
            p = self.path(src, dst)
            chans.extend(p)
            offsets.append(len(chans))
            lats.append(float(self.latency[list(p)].sum()))
        return (
            np.asarray(offsets, dtype=np.int64),
            np.asarray(chans, dtype=np.int64),
            np.asarray(lats, dtype=np.float64),
        )
