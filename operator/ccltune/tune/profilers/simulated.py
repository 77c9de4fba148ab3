"""`simulated`: an NCCL performance surface over every knob, with interference and noise.

This is a surface model, not the event simulator. It follows AutoCCL's two-phase bottleneck view
(NSDI'25, section 3): a collective's bandwidth is the smaller of
- the transport phase: the algorithm's bus bandwidth on this fabric, shared by `channels`
  pipelines that each move one chunk per step and pay a per-step synchronisation cost, degraded by
  congestion when channels x chunk in flight exceeds what the fabric buffers; and
- the protocol phase: channels x threads copying (and reducing) data, each thread at a fixed rate.
Latency is NCCL's own model (model.cost.nccl_latency_us, tuning.cc tables) plus a small per-channel
launch cost, and one pipeline fill of a chunk.

The surface's own constants (per-thread copy rates, per-step sync cost, fabric buffering, the
algorithms' share of the link bandwidth) are modelling choices stated in docs/tuning.md, not
measurements. `interference` in [0, 1] is the share of SM time and memory bandwidth that a
concurrent training kernel takes (AutoCCL section 2.3): it slows the protocol phase by
(1 - interference/2) and strengthens congestion. `noise` is the relative standard deviation of one
repetition; repetitions are averaged. Noise is seeded per (seed, task, config, repetition index).

MSCCL schedule variants (`msccl:<family>[-anything]`) run on the same surface: a family gives the
bus bandwidth share and the number of dependent steps of a hand-written schedule shape (ring:
2(n-1) steps for AllReduce; allpairs: direct exchange in 2 steps, full bandwidth only through an
NVSwitch; hierarchical: intra-node reduce-scatter, inter-node ring, intra-node all-gather), and
channels x instances threadblock channels take the place of NCCL's channels. Each step pays
NCCL's per-hop latency for the protocol (model/cost.py HW_LAT, BASE_LAT once). `simulated_variants`
lists the variants this surface knows for a communicator; they are simulated, never measured.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...api.cluster import ClusterTopology
from ...api.common import Collective, Source
from ...api.errors import InputError
from ...api.plan import TaskKey
from ...model.cost.busbw import busbw_factor
from ...model.cost.protocols import (
    BASE_LAT,
    HW_LAT,
    LL_MAX_BW,
    PER_CH_MAX_RING_LL128_BW,
    PROTOCOLS,
    Arch,
    Hw,
    nccl_latency_us,
    nodes_class,
)
from ..fabric import FabricFacts, facts_for
from ..space import (
    DEFAULT_BUFFSIZE,
    DEFAULT_THREADS,
    LL128_THREADS,
    MSCCL_PREFIX,
    Config,
    ScheduleVariant,
    TaskSpace,
    build_space,
    is_msccl,
)
from ..space import PROTOCOLS as ALL_PROTOCOLS
from .base import Measurement, ProfilerError, stable_seed

# Share of the fabric's per-GPU bandwidth each algorithm turns into bus bandwidth (surface
# constants; NVLS above 1 because the switch reduces in flight and halves NVLink traffic).
_INTRA_EFF = {"nvswitch": 0.85, "nvlink": 0.78, "xgmi": 0.72, "pcie": 0.80}
_NET_EFF = 0.92
# Bytes per microsecond one thread copies (= GB/s per thread / 1e-3).
_THREAD_GBPS = {"LL": 0.035, "LL128": 0.050, "Simple": 0.060}
_PAYLOAD = {"LL": 0.5, "LL128": 120.0 / 128.0, "Simple": 1.0}  # wire formats, model/cost.py
_STEP_SYNC_US = {"LL": 0.3, "LL128": 0.6, "Simple": 2.0}  # flag/fifo handling per chunk step
# Chunk moved per step: Simple uses buffsize / NCCL_STEPS * chunk steps (= buffsize / 2 for
# ring/tree allreduce, NCCL's ALLREDUCE_CHUNKSTEPS = NCCL_STEPS / 2); LL/LL128 use their own
# fixed buffers.
_FIXED_CHUNK = {"LL": 16 << 10, "LL128": 120 << 10}
# Bytes the fabric absorbs in flight per GPU before congestion (surface constants).
_BUFFERING = {"nvswitch": 48 << 20, "nvlink": 24 << 20, "xgmi": 24 << 20, "pcie": 6 << 20}
_NET_BUFFERING = 32 << 20
_CONGESTION = 0.05
_CHANNEL_LAUNCH_US = 0.08
_SHM_SHARE = 0.70  # SHM through host memory: share of PCIe bandwidth (two copies)
_CROSS_SOCKET_P2P = 0.45  # P2P across the CPU interconnect: share of PCIe bandwidth
MSCCL_FAMILIES = ("ring", "allpairs", "hierarchical")
_ALLPAIRS_MESH_SHARE = 0.6  # direct exchange without a switch: links shared by several peers


def msccl_family(algorithm: str) -> str:
    """`msccl:allpairs-2ch` -> `allpairs`; an unknown family is a ProfilerError."""
    family = algorithm[len(MSCCL_PREFIX):].split("-", 1)[0]
    if family not in MSCCL_FAMILIES:
        raise ProfilerError(f"the simulated surface has no model of schedule {algorithm!r} "
                            f"(families: {', '.join(MSCCL_FAMILIES)})")
    return family


def sweep_csv(topo: ClusterTopology, ranks: int, nodes: int, collectives: Sequence[Collective],
              sizes: Sequence[int], *, variants: bool = True, interference: float = 0.0) -> str:
    """A replay table written from the surface (its numbers are simulated): NCCL's sweep rows
    (algorithm x protocol x channel count, at the sweep's default threads and buffer) and, with
    `variants`, the MSCCL variants of `simulated_variants` over protocol x channels x instances,
    in the replay schema (sweep CSV + instances, threads, buffsize; docs/tuning.md)."""
    from .replay import OPTIONAL_COLUMNS, SWEEP_COLUMNS  # replay does not import this module

    facts = facts_for(topo, ranks, nodes)
    sim = SimulatedProfiler(topo, interference=interference, noise=0.0)
    lines = [",".join((*SWEEP_COLUMNS, *OPTIONAL_COLUMNS))]
    for coll in collectives:
        space = build_space(coll, facts, variants=simulated_variants(coll, facts) if variants else (),
                            runtime="msccl")
        grid = [c for c in space if c.impl.transport == "p2p" and c.buffsize == DEFAULT_BUFFSIZE
                and c.threads in (DEFAULT_THREADS, LL128_THREADS)]
        for size in sizes:
            key = TaskKey(collective=coll, min_bytes=size, max_bytes=size, ranks=ranks, nodes=nodes)
            for c in grid:
                t = sim.true_time_us(key, size, c)
                lines.append(f"{coll},{size},{c.impl.algorithm},{c.impl.protocol},{c.channels},{nodes},{ranks},"
                             f"latency,{size / t / 1e3:.6g},{t:.6g},{c.instances},{c.threads},{c.buffsize}")
    return "\n".join(lines) + "\n"


def simulated_variants(collective: Collective, facts: FabricFacts) -> list[ScheduleVariant]:
    """The MSCCL variants the surface can time for this communicator (each family, every
    protocol, the channel counts such schedules are generated with)."""
    if collective not in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER):
        return []
    out = [ScheduleVariant("ring", collective, ALL_PROTOCOLS, (1, 2, 4, 8)),
           ScheduleVariant("allpairs", collective, ALL_PROTOCOLS, (1, 2, 4))]
    if facts.nodes > 1 and facts.gpus_per_node > 1:
        out.append(ScheduleVariant("hierarchical", collective, ("LL", "Simple"), (1, 2, 4)))
    return out


def _log2(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


@dataclass
class Surface:
    """The noise-free surface: time in microseconds of one call."""

    facts: FabricFacts
    interference: float = 0.0
    cpu_sockets: int = 1

    def algorithm_busbw(self, collective: Collective, cfg: Config) -> float:
        f = self.facts
        algo = cfg.impl.algorithm
        kind = "nvswitch" if f.nvswitch else f.intra_kind
        intra = f.intra_gbps * _INTRA_EFF[kind]
        if f.intra_kind == "pcie" and f.gpus_per_node > 1:
            if cfg.impl.transport == "shm":
                intra = f.intra_gbps * _SHM_SHARE
            elif self.cpu_sockets > 1:
                intra = f.intra_gbps * _CROSS_SOCKET_P2P
        net = f.net_gbps_per_node * _NET_EFF
        multi = f.nodes > 1
        single_gpu = f.gpus_per_node == 1
        if is_msccl(algo):
            return self._msccl_busbw(msccl_family(algo), intra, net)
        if algo == "ring":
            if single_gpu:
                return net
            return min(intra, net) if multi else intra
        if algo == "tree":
            chain = 0.8 * intra
            return min(chain, 2 * net) if multi else chain
        if algo == "nvls":
            boost = 1.25 if collective == Collective.ALLREDUCE else 1.05
            return min(boost * f.intra_gbps * 0.85, 2 * net) if multi else boost * f.intra_gbps * 0.85
        if algo == "nvls_tree":
            return min(1.2 * f.intra_gbps * 0.85, 2 * net)
        if algo == "collnet_direct":
            return min(0.95 * intra, 2 * net)
        if algo == "collnet_chain":
            return min(0.85 * intra, 2 * net)
        if algo == "pat":
            return 0.95 * net
        if algo == "p2p":
            if not multi:
                return intra
            n, g = f.ranks, f.gpus_per_node
            crossing = (n - g) / max(n - 1, 1)
            return min(intra, net / max(crossing, 1e-9))
        raise ValueError(f"unknown algorithm {algo}")

    def _msccl_busbw(self, family: str, intra: float, net: float) -> float:
        f = self.facts
        if family == "allpairs":
            share = intra if f.nvswitch else intra * _ALLPAIRS_MESH_SHARE
            if f.nodes == 1:
                return share
            crossing = (f.ranks - f.gpus_per_node) / max(f.ranks - 1, 1)
            return min(share, net / max(crossing, 1e-9))
        if family == "hierarchical" and f.nodes > 1:
            # Only 1/g of the data crosses the network per GPU after the intra-node phase.
            return min(intra * 0.9, net * f.gpus_per_node / max(f.gpus_per_node - 1, 1))
        return min(intra, net) if f.nodes > 1 and f.gpus_per_node > 1 else (net if f.gpus_per_node == 1 else intra)

    def _msccl_steps(self, collective: Collective, family: str) -> tuple[int, int]:
        """(intra-node steps, inter-node steps) one chunk goes through."""
        f = self.facts
        twice = 2 if collective == Collective.ALLREDUCE else 1
        if family == "allpairs":
            return (twice, 0) if f.nodes == 1 else (0, twice)
        if family == "hierarchical" and f.nodes > 1:
            return twice * (f.gpus_per_node - 1), twice * (f.nodes - 1)
        inter = twice * (f.nodes - 1) if f.nodes > 1 else 0
        return twice * (f.ranks - 1) - inter, inter

    def latency_us(self, collective: Collective, cfg: Config) -> float:
        f = self.facts
        algo, proto = cfg.impl.algorithm, cfg.impl.protocol
        link = "pcie" if f.intra_kind == "pcie" else "nvlink"
        pi = PROTOCOLS.index(proto)
        if is_msccl(algo):
            intra_steps, inter_steps = self._msccl_steps(collective, msccl_family(algo))
            hw = Hw.PCI if link == "pcie" else Hw.NVLINK
            per_net = HW_LAT[Hw.NET]["ring"][pi] + f.net_latency_us
            return BASE_LAT["ring"][pi] + intra_steps * HW_LAT[hw]["ring"][pi] + inter_steps * per_net
        if algo == "pat":
            return BASE_LAT["ring"][pi] + 2 * _log2(f.ranks) * HW_LAT[Hw.NET]["ring"][pi]
        if algo == "p2p":
            hw = Hw.NET if f.nodes > 1 else (Hw.PCI if link == "pcie" else Hw.NVLINK)
            return BASE_LAT["ring"][pi] + (f.ranks - 1) * 0.5 * HW_LAT[hw]["ring"][pi]
        lat = nccl_latency_us(
            algo, proto, link, f.ranks, f.nodes,
            collective=str(collective), net_latency_us=f.net_latency_us if f.nodes > 1 else 0.0,
        )
        if cfg.impl.transport == "shm":
            lat *= 1.6  # host-memory hand-off on every intra-node step
        return lat

    def time_us(self, collective: Collective, size: int, cfg: Config) -> float:
        f = self.facts
        proto = cfg.impl.protocol
        nc, nt = cfg.channels * cfg.instances, cfg.threads  # MSCCL: every instance is a channel more
        factor = busbw_factor(collective, f.ranks) if f.ranks > 1 else 1.0
        bus_bytes = max(size * factor, 1.0)
        # Transport phase: channels share the algorithm's bus bandwidth (GB/s == bytes/ns).
        link = self.algorithm_busbw(collective, cfg) * _PAYLOAD[proto] * (1 - 0.15 * self.interference)
        # NCCL's own caps on the low-latency protocols (tuning.cc llMaxBws, perChMaxRingLL128Bw).
        arch = {"volta": Arch.VOLTA, "hopper": Arch.HOPPER, "blackwell": Arch.HOPPER}.get(f.arch, Arch.AMPERE)
        cls = nodes_class(f.nodes)
        if proto == "LL":
            link = min(link, LL_MAX_BW[arch.value][cls])
        elif proto == "LL128":
            link = min(link, nc * PER_CH_MAX_RING_LL128_BW[arch][cls])
        per_channel_bytes = bus_bytes / nc
        chunk = cfg.buffsize // 2 if proto == "Simple" else _FIXED_CHUNK[proto]
        chunk_eff = max(min(chunk, per_channel_bytes), 64.0)
        rate_ch = link * 1e3 / nc  # bytes/us per channel
        sync = _STEP_SYNC_US[proto]
        transport = nc * chunk_eff / (chunk_eff / rate_ch + sync)  # bytes/us
        kind = "nvswitch" if f.nvswitch else f.intra_kind
        capacity = _BUFFERING[kind] if f.nodes == 1 else min(_BUFFERING[kind], _NET_BUFFERING)
        in_flight = 2 * nc * chunk_eff
        if in_flight > capacity:
            transport /= 1 + _CONGESTION * (1 + self.interference) * (in_flight / capacity - 1)
        # Protocol phase: channels x threads copy and reduce.
        reduce_cost = 1.3 if collective in (Collective.ALLREDUCE, Collective.REDUCESCATTER) else 1.0
        protocol = nc * nt * _THREAD_GBPS[proto] * 1e3 * (1 - 0.5 * self.interference) / reduce_cost
        rate = min(transport, protocol)
        fill = chunk_eff / min(rate_ch, nt * _THREAD_GBPS[proto] * 1e3)
        return self.latency_us(collective, cfg) + nc * _CHANNEL_LAUNCH_US + fill + bus_bytes / rate


def _cpu_sockets(topo: ClusterTopology) -> int:
    node0 = topo.nodes[0].name
    return max(1, sum(1 for d in topo.devices if d.kind == "cpu" and d.node == node0))


@dataclass
class SimulatedProfiler:
    """Measures on the surface with seeded noise; `true_time_us` gives the noise-free value."""

    topo: ClusterTopology
    interference: float = 0.0
    noise: float = 0.02
    seed: int = 0
    sharp: bool | None = None
    name: str = "simulated"
    source: Source = Source.SIMULATED
    _counts: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    _surfaces: dict[tuple[int, int], Surface] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.interference <= 1.0:
            raise InputError(f"interference must be in [0, 1], got {self.interference}")
        if not 0.0 <= self.noise < 0.5:
            raise InputError(f"noise must be in [0, 0.5), got {self.noise}")

    def surface(self, key: TaskKey) -> Surface:
        k = (key.ranks, key.nodes)
        if k not in self._surfaces:
            facts = facts_for(self.topo, key.ranks, key.nodes, sharp=self.sharp)
            self._surfaces[k] = Surface(facts, self.interference, _cpu_sockets(self.topo))
        return self._surfaces[k]

    def space(self, key: TaskKey, facts: FabricFacts, full: TaskSpace) -> TaskSpace:
        return full

    def true_time_us(self, key: TaskKey, size: int, config: Config) -> float:
        return self.surface(key).time_us(key.collective, size, config)

    def measure(self, key: TaskKey, size: int, config: Config, reps: int = 1) -> Measurement:
        base = self.true_time_us(key, size, config)
        if self.noise == 0.0:
            return Measurement(base, self.source, reps)
        tag = (key.label(), f"{size}:{config.label()}")
        start = self._counts[tag]
        self._counts[tag] += reps
        values = []
        for i in range(start, start + reps):
            rng = np.random.default_rng(stable_seed(self.seed, tag[0], tag[1], i))
            # Lognormal: measurement noise is multiplicative and never makes time negative.
            values.append(base * float(np.exp(rng.normal(0.0, self.noise))))
        return Measurement(sum(values) / reps, self.source, reps)


__all__ = ["MSCCL_FAMILIES", "SimulatedProfiler", "Surface", "msccl_family", "simulated_variants", "sweep_csv"]
