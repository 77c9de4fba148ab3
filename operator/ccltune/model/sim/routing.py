"""Routing on a ClusterTopology: directed channels and shortest GPU-to-GPU paths.

Every full-duplex `Link` becomes two directed channels: 2*i is a->b and 2*i+1 is b->a, each with
the link's bandwidth (GB/s) and latency (us). GPUs are path endpoints only: traffic between two GPUs
crosses NVSwitches, NICs, PCIe switches, CPUs and leaf/spine switches, never a third GPU (NCCL's
relaying through GPUs is a schedule decision, expressed as separate transfers).

Paths are shortest by hop count, then by summed latency. Among equally short paths the choice is
a deterministic hash of (src, dst, hop), as ECMP switches spread flows over equal-cost uplinks;
`ecmp=False` takes the lowest channel index instead.

Between nodes the NICs are NCCL's per-channel choice, not a hash (NCCL src/graph/topo.cc
ncclTopoGetLocalNet, src/graph/search.cc ncclTopoGetNetDev; NVIDIA/nccl @5067397c, same in
2.30.7's topo.cc): a GPU uses ceil(L/G) of its L nearest NICs (G = GPUs sharing them), one per
channel in turn (`nic_choices`). A sender takes the NIC that the receiver's local index uses on the
sender's node when that NIC is near the sender too (NCCL's p2p rule; on NCCL's rings and trees it
is the channel's NIC, graph->inter), else its own; a receiver takes its own. A route is therefore
keyed by (src, dst, slot), slot = channel mod `nic_period`; the slot is 0 inside a node and when
every GPU has one NIC choice, so those routes (and the simulator's cost) are as before.
Not modelled: PXN's extra NVLink hop through the GPU that owns the receiver's NIC when that NIC
is not near the sender (the route then leaves by the sender's own NIC).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np

from ...api.cluster import ClusterTopology, DeviceKind
from ...api.errors import InternalError
from .arrays import sorted_unique

_Nic = TypeVar("_Nic")


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
        self._paths: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self._behind: dict[tuple[int, int], set[int]] = {}
        nic = np.zeros(nvert, dtype=bool)
        for dev in topo.devices:
            if dev.kind == DeviceKind.NIC:
                nic[vertices[dev.id]] = True
        self._near: dict[int, tuple[int, ...]] = {}  # GPU vertex -> its nearest NICs
        self.nic_choices = self._bind_nics(nic)
        self.home_nic = np.array([c[0] if c else -1 for c in self.nic_choices], dtype=np.int64)
        periods = [len(c) for c in self.nic_choices if c]
        self.nic_period = math.lcm(*periods) if periods else 1
        self.rank_node = np.arange(self.nranks, dtype=np.int64) // topo.gpus_per_node

    def _nearest_nics(self, g: int, nic: np.ndarray) -> tuple[int, ...]:
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
        return tuple(sorted(found))  # vertex order is the topology's NIC order (NCCL's net index)

    def _bind_nics(self, nic: np.ndarray) -> list[tuple[int, ...]]:
        """Per vertex, the NIC of each channel slot (empty: not a GPU, or no NIC near it)."""
        out: list[tuple[int, ...]] = [() for _ in range(len(nic))]
        gpn = self.topo.gpus_per_node
        ranks = [(rank, v) for rank, v in enumerate(self.rank_vertex.tolist()) if v >= 0]
        sharing: dict[int, int] = {}  # NIC -> GPUs it is nearest to
        for _, g in ranks:
            self._near[g] = self._nearest_nics(g, nic)
            for n in self._near[g]:
                sharing[n] = sharing.get(n, 0) + 1
        for rank, g in ranks:
            near = self._near[g]
            if near:
                out[g] = local_nets(near, sharing[near[0]], rank % gpn)
        return out

    def nic_slots(self, src: np.ndarray, dst: np.ndarray, channel: np.ndarray) -> np.ndarray:
        """Per transfer, the slot its route depends on: channel mod nic_period between nodes."""
        if self.nic_period == 1:
            return np.zeros(len(src), dtype=np.int64)
        inter = self.rank_node[src] != self.rank_node[dst]
        return np.where(inter, channel.astype(np.int64) % self.nic_period, 0)

    def message_us(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Per route: the transport's cost per network message (api NetTransport), 0 in a node."""
        per = self.topo.transport.message_us
        if per == 0:
            return np.zeros(len(src))
        return np.where(self.rank_node[src] != self.rank_node[dst], per, 0.0)

    def route_nics(self, src: int, dst: int, slot: int = 0) -> tuple[int, int]:
        """(sender NIC, receiver NIC) vertices of a route between nodes; -1 where there is none."""
        s, d = self._vertex(src), self._vertex(dst)
        if self.rank_node[src] == self.rank_node[dst]:
            return -1, -1
        send = recv = -1
        mine = self.nic_choices[s]
        if mine:
            gpn = self.topo.gpus_per_node
            twin = int(self.rank_vertex[self.rank_node[src] * gpn + dst % gpn])
            theirs = self.nic_choices[twin] if twin >= 0 else ()
            send = theirs[slot % len(theirs)] if theirs else -1
            if send not in self._near[s]:
                send = mine[slot % len(mine)]
        if self.nic_choices[d]:
            recv = self.nic_choices[d][slot % len(self.nic_choices[d])]
        return send, recv

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

    def path(self, src: int, dst: int, slot: int = 0) -> tuple[int, ...]:
        """Directed channel indices from rank `src` to rank `dst`, in order.

        `slot` is the transfer's channel (taken mod nic_period); it matters only between nodes."""
        if src == dst:
            raise RoutingError(f"no path from rank {src} to itself")
        s, v = self._vertex(src), self._vertex(dst)
        inter = bool(self.rank_node[src] != self.rank_node[dst])
        slot = slot % self.nic_period if inter else 0
        key = (src, dst, slot)
        cached = self._paths.get(key)
        if cached is not None:
            return cached
        ptr, tch = self._tree(src)
        if ptr[v] == ptr[v + 1]:
            raise RoutingError(
                f"rank {src} ({self.topo.gpu_id(src)}) cannot reach rank {dst} "
                f"({self.topo.gpu_id(dst)}) in cluster {self.topo.name!r}"
            )
        send, recv = self.route_nics(src, dst, slot) if inter else (-1, -1)
        prefer = {send, recv} - {-1}
        via_send = self._behind_nic(src, send)
        rev: list[int] = []
        hop = 0
        while v != s:
            cands = tch[ptr[v] : ptr[v + 1]].tolist()
            # Past the sender's NIC (rail and spine switches) keep to routes that leave by it: the
            # NIC a channel uses is NCCL's choice, not a hash at the spine.
            behind = [c for c in cands if int(self.chan_src[c]) in via_send]
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

    def _behind_nic(self, src: int, nic: int) -> set[int]:
        """Vertices that shortest routes from `src` reach through `nic` (incl. the NIC)."""
        cached = self._behind.get((src, nic))
        if cached is not None:
            return cached
        ptr, tch = self._tree(src)
        if nic < 0 or ptr[nic] == ptr[nic + 1]:
            self._behind[(src, nic)] = set()
            return self._behind[(src, nic)]
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
        self._behind[(src, nic)] = seen
        return seen

    def path_latency(self, src: int, dst: int, slot: int = 0) -> float:
        return float(sum(self.latency[c] for c in self.path(src, dst, slot)))

    def path_bandwidth(self, src: int, dst: int, slot: int = 0) -> float:
        """Bottleneck bandwidth (GB/s) of the path when nothing else uses it."""
        return float(min(self.capacity[c] for c in self.path(src, dst, slot)))

    def paths_csr(
        self, routes: Iterable[Sequence[int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Paths of many (src, dst) or (src, dst, slot) routes as CSR: (offsets, channels,
        summed latency). A route from a rank to itself (local work) crosses no link."""
        offsets = [0]
        chans: list[int] = []
        lats: list[float] = []
        for route in routes:
            p = self.path(*route) if route[0] != route[1] else ()
            chans.extend(p)
            offsets.append(len(chans))
            lats.append(float(self.latency[list(p)].sum()))
        return (
            np.asarray(offsets, dtype=np.int64),
            np.asarray(chans, dtype=np.int64),
            np.asarray(lats, dtype=np.float64),
        )


def local_nets(near: Sequence[_Nic], sharing: int, dev: int) -> tuple[_Nic, ...]:
    """NCCL's ncclTopoGetLocalNet for every channel: the NIC of channel c is entry c mod len.

    `near`: the GPU's nearest NICs in NCCL's net order; `sharing`: GPUs nearest to near[0];
    `dev`: the GPU's device index in its node. Each GPU uses ceil(L/G) NICs starting at
    dev mod G, bit-mirrored when L is a power of two (topo.cc, NCCL_NETDEVS_POLICY=AUTO)."""
    nl = len(near)
    start = dev % max(sharing, 1)
    if nl & (nl - 1) == 0:
        start = _mirror_bits(start, nl)
    per_gpu = -(-nl // max(sharing, 1))
    return tuple(near[(start + c) % nl] for c in range(per_gpu))


def _mirror_bits(val: int, pow2: int) -> int:
    """topo.h mirrorBits: reverse the log2(pow2) low bits of val."""
    out, b, mb = 0, 1, pow2 >> 1
    while b < pow2:
        if val & b:
            out |= mb
        b <<= 1
        mb >>= 1
    return out
