"""Alpha-beta cost model per NCCL protocol, with NCCL's own published tuning numbers.

Every number here is NCCL's, from NVIDIA/nccl (v2.19 line, commit b6475625, unless noted):
- src/graph/tuning.cc: baseLat, hwLat, the per-channel LL/LL128/tree bandwidth caps per GPU
  generation, treeCorrectionFactor, and the latency formulas in ncclTopoTuneModel; the latency and
  LL tables are NCCL 2.30.7's (tag v2.30.7-1, the conformance kit's copy), which changed them;
- src/graph/topo.h: nominal per-link bandwidths (SM*_NVLINK_BW, PCI_BW, NET_BW);
- src/graph/search.cc: the per-channel speed arrays the ring/tree search walks down;
- src/include/device.h / comm.h: NCCL_STEPS, MAXCHANNELS, thread limits and thresholds;
- protocol wire formats: LL packs 4 data bytes with a 4-byte flag in every 8 bytes (efficiency
  1/2); LL128 carries 120 payload bytes in every 128-byte line (NCCL_LL128_DATAELEMS 15 of
  NCCL_LL128_LINEELEMS 16 uint64s); Simple moves raw data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from ...api.cluster import LinkKind

if TYPE_CHECKING:
    from .gpu import GpuPhysics


@dataclass(frozen=True, slots=True)
class ProtocolCost:
    """What the simulator charges for a protocol on one GPU type (sim/simulate.py).

    The bare module constants (LL, LL128, SIMPLE) carry only the wire format and step cost;
    `protocol_cost(..., gpu=...)` adds the GPU's threadblock physics (cost/gpu.py).
    """

    name: str  # "LL", "LL128", "Simple"
    efficiency: float  # payload fraction of link bandwidth the protocol achieves (0..1]
    # Cost of one protocol step beyond the hop latency the links carry (flag/sync handling).
    step_latency_us: float
    # Payload GB/s of one threadblock, on its send side and on its receive side; None = no cap.
    tb_gbps: float | None = None
    # Payload bytes per step: a transfer pays step_latency_us per started step; None = one step.
    step_bytes: float | None = None
    launch_us: float = 0.0  # per collective call: kernel launch and setup
    floor_us: float = 0.0  # no call of this protocol completes faster
    nvlink_efficiency: float = 1.0  # payload fraction of NVLink line rate the GPU's SMs reach


ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree")
PROTOCOLS = ("LL", "LL128", "Simple")


class Hw(StrEnum):
    """NCCL's three latency classes (NCCL_HW_NVLINK / _PCI / _NET)."""

    NVLINK = "nvlink"
    PCI = "pci"
    NET = "net"


class Arch(StrEnum):
    """GPU generations NCCL's tables distinguish (compCap 70 / 80 / 90)."""

    VOLTA = "volta"
    AMPERE = "ampere"
    HOPPER = "hopper"


# tuning.cc baseLatencies[algo][proto], us (NCCL 2.30.7).
BASE_LAT: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}

# tuning.cc hwLatencies[hw][algo][proto], us: the latency of one algorithm step (NCCL 2.30.7;
# v2.19 had 28 us for tree/Simple everywhere, 23 for NVLS and 14 for NVLS-tree over the network).
HW_LAT: dict[Hw, dict[str, tuple[float, float, float]]] = {
    Hw.NVLINK: {
        "tree": (0.6, 1.25, 4.0),
        "ring": (0.6, 1.9, 3.4),
        "collnet_direct": (0.0, 0.0, 3.7),
        "collnet_chain": (0.0, 0.0, 2.8),
        "nvls": (0.0, 0.0, 25.0),
        "nvls_tree": (0.0, 0.0, 25.0),
    },
    Hw.PCI: {
        "tree": (1.0, 1.9, 4.0),
        "ring": (1.0, 2.5, 5.7),
        "collnet_direct": (0.0, 0.0, 3.7),
        "collnet_chain": (0.0, 0.0, 2.8),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
    },
    Hw.NET: {
        "tree": (5.0, 8.5, 14.0),
        "ring": (2.7, 4.0, 14.0),
        "collnet_direct": (0.0, 0.0, 31.0),
        "collnet_chain": (0.0, 0.0, 30.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls_tree": (0.0, 0.0, 20.9),
    },
}

# tuning.cc tables indexed [arch][nodes class: 1 node, 2 nodes, >2 nodes], GB/s.
# llMaxBws: first index is the GPU generation on one node, the CPU vendor (Intel/AMD) across nodes
# (row 0 = Intel, row 1 = AMD): use ll_max_bw(). NCCL 2.30.7 values (Hopper N1 141, was 87.7).
LL_MAX_BW: dict[str, tuple[float, float, float]] = {
    "volta": (39.0, 39.0, 20.4),  # Volta-N1 / Intel-N2 / Intel-N4
    "ampere": (87.7, 22.5, 19.0),  # Ampere-N1 / AMD-N2 / AMD-N4
    "hopper": (141.0, 45.0, 35.0),  # Hopper-N1 (its N2/N4 columns are never read)
}
_LL_CPU_ROW = {"intel": "volta", "amd": "ampere"}
PER_CH_MAX_RING_LL128_BW: dict[Arch, tuple[float, float, float]] = {
    Arch.VOLTA: (20.0, 20.0, 20.0),
    Arch.AMPERE: (20.0, 20.0, 20.0),
    Arch.HOPPER: (36.7, 36.7, 36.7),
}
PER_CH_MAX_TREE_LL128_BW: dict[Arch, tuple[float, float, float]] = {
    Arch.VOLTA: (20.0, 20.0, 20.0),
    Arch.AMPERE: (20.0, 20.0, 20.0),
    Arch.HOPPER: (36.7, 36.7, 29.0),
}
PER_CH_MAX_TREE_BW: dict[Arch, tuple[float, float, float]] = {
    Arch.VOLTA: (26.5, 18.5, 10.0),
    Arch.AMPERE: (24.0, 23.6, 17.8),
    Arch.HOPPER: (38.7, 41.4, 36.0),
}

# tuning.cc treeCorrectionFactor[proto][log2(bytes/64)], sizes 64 B .. 256 MiB.
TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9,
              .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
               .9, .9),
}  # fmt: skip

# topo.h nominal bandwidths, GB/s per link and direction.
NVLINK_BW: dict[int, float] = {60: 18.0, 70: 20.0, 80: 20.0, 86: 12.0, 90: 20.6}
PCI_BW = 12.0  # PCIe Gen3 x16
NET_BW = 12.0  # 100 Gb/s

# search.cc: per-channel speeds (GB/s) the ring/tree search tries, highest first.
SPEED_ARRAY_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEED_ARRAY_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
                     3.0, 2.4, 1.2, 0.24, 0.12)  # fmt: skip
SM90_SPEED_ARRAY_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_SPEED_ARRAY_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                          3.0, 2.4, 1.2, 0.24, 0.12)  # fmt: skip

# src/include/device.h: 32 up to NCCL 2.24 (64 from 2.25.1, commit 80f6bda4). Plans target 2.24 by
# default and the tune space stops at 32, so the model keeps 32; the ring search uses at most half.
MAXCHANNELS = 32
# NVLS uses its own channel (CTA) count, not the ring search's: NCCL 2.30.7 src/transport/nvls.cc
# NVLS_NCHANNELS_SM90 16; SM100 32 across nodes, NVLS_NCHANNELS_SM100_NVL 24 on one node.
NVLS_CHANNELS = {"hopper": (16, 16), "blackwell": (24, 32)}  # (one node, several nodes)
NCCL_STEPS = 8  # buffer slots per connection: at most 8 steps in flight (device.h)
WARP_SIZE = 32
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}  # NCCL_{LL,LL128,SIMPLE}_MAX_NTHREADS
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # NCCL_*_THREAD_THRESHOLD (comm.h)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}  # tuning.cc getNetOverhead (x3 for Simple)

# Payload bytes of one step per connection: buffer / NCCL_STEPS. Buffers (init.cc): Simple
# DEFAULT_BUFFSIZE 4 MiB; LL 8 lines x 512 threads x 8 steps x 16-byte lines (8 data bytes each);
# LL128 120 elems x 640 threads x 8 steps x 8 bytes (120 of every 128 bytes data).
STEP_BYTES = {
    "Simple": (1 << 22) / NCCL_STEPS,
    "LL": 8 * 512 * 16 / 2,
    "LL128": 120 * 640 * 8 * 120 / 128,
}
SIMPLE_SLICES_PER_CHUNK = 2  # ring ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS (collectives.h)


def step_overhead_us(protocol: str, hw: Hw = Hw.NVLINK) -> float:
    """A step's cost beyond the hop itself: NCCL's ring hwLat minus LL's, which is the bare hop
    latency that cluster files already carry on their links (presets cite hwLat LL for it)."""
    i = PROTOCOLS.index(protocol if protocol in PROTOCOLS else canonical_protocol(protocol))
    return round(HW_LAT[hw]["ring"][i] - HW_LAT[hw]["ring"][0], 9)


# Bare protocols: wire-format efficiency and step cost, no GPU physics (protocol_cost adds it).
LL = ProtocolCost("LL", 0.5, 0.0)
LL128 = ProtocolCost("LL128", 120.0 / 128.0, step_overhead_us("LL128"))
SIMPLE = ProtocolCost("Simple", 1.0, step_overhead_us("Simple"))
PROTOCOL_COSTS: dict[str, ProtocolCost] = {"LL": LL, "LL128": LL128, "Simple": SIMPLE}


def protocol_index(protocol: str) -> int:
    try:
        return PROTOCOLS.index(canonical_protocol(protocol))
    except ValueError:
        raise ValueError(f"unknown protocol {protocol!r} (LL, LL128 or Simple)") from None


def canonical_protocol(protocol: str) -> str:
    """'simple' / 'll128' / 'LL' -> the spelling NCCL_PROTO uses."""
    for p in PROTOCOLS:
        if protocol.lower() == p.lower():
            return p
    raise ValueError(f"unknown protocol {protocol!r} (LL, LL128 or Simple)")


def canonical_algorithm(algorithm: str) -> str:
    a = algorithm.lower().replace("-", "_")
    aliases = {"collnetdirect": "collnet_direct", "collnetchain": "collnet_chain",
               "nvlstree": "nvls_tree"}  # fmt: skip
    a = aliases.get(a, a)
    if a not in ALGORITHMS:
        raise ValueError(f"unknown NCCL algorithm {algorithm!r} ({', '.join(ALGORITHMS)})")
    return a


def arch_of(gpu_model: str) -> Arch | None:
    """GPU model string -> NCCL's generation class; None when NCCL has no table for it (AMD)."""
    m = gpu_model.upper().replace("NVIDIA", "").replace("-", " ").strip()
    if not m:
        return None
    if m.startswith(("MI", "AMD", "RADEON")):
        return None
    if m.startswith(("H100", "H800", "H200", "H20", "GH200", "B100", "B200", "GB200")):
        return Arch.HOPPER  # Blackwell: NCCL 2.19 has no table; Hopper's is the closest
    if m.startswith(("A100", "A800", "A40", "A30", "A10", "A6000", "L40", "L4")):
        return Arch.AMPERE
    if m.startswith(("V100", "TITAN V")):
        return Arch.VOLTA
    return None


def comp_cap_of(gpu_model: str) -> int | None:
    """CUDA compute capability x10 (NCCL's minCompCap) when the model is known."""
    m = gpu_model.upper().replace("NVIDIA", "").replace("-", " ").strip()
    table = (("H", 90), ("GH", 90), ("B", 100), ("GB", 100), ("A100", 80), ("A800", 80),
             ("A30", 80), ("A40", 86), ("A10", 86), ("A6000", 86), ("L40", 89), ("L4", 89),
             ("V100", 70), ("P100", 60))  # fmt: skip
    best: tuple[int, int] | None = None
    for prefix, cc in table:
        if m.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), cc)
    return best[1] if best else None


def nvls_channels(generation: str, nnodes: int) -> int:
    """Channels NCCL gives NVLS / NVLS-tree on this GPU generation ("hopper", "blackwell")."""
    one, many = NVLS_CHANNELS.get(generation, NVLS_CHANNELS["hopper"])
    return one if nnodes <= 1 else many


def hw_of(link_kind: LinkKind | str) -> Hw:
    kind = LinkKind(link_kind)
    if kind in (LinkKind.NVLINK, LinkKind.XGMI):
        return Hw.NVLINK
    if kind == LinkKind.NET:
        return Hw.NET
    return Hw.PCI


def ll_max_bw(arch: Arch | None, nnodes: int, cpu_vendor: str = "intel") -> float:
    """tuning.cc llMaxBw: by GPU generation on one node, by CPU vendor across nodes."""
    if nnodes <= 1:
        return LL_MAX_BW[(arch or Arch.AMPERE).value][0]
    return LL_MAX_BW[_LL_CPU_ROW.get(cpu_vendor, "volta")][nodes_class(nnodes)]


def nodes_class(nnodes: int) -> int:
    """Column of NCCL's per-arch tables: 0 for 1 node, 1 for 2, 2 for more."""
    return 0 if nnodes <= 1 else (1 if nnodes == 2 else 2)


def protocol_cost(
    protocol: str,
    *,
    link_kind: LinkKind | str = LinkKind.NVLINK,
    arch: Arch | None = None,
    nnodes: int = 1,
    gpu: GpuPhysics | None = None,
    algorithm: str = "ring",
) -> ProtocolCost:
    """The simulator's cost for `protocol` on a fabric whose GPU-GPU steps use `link_kind`.

    Step cost = NCCL's ring hwLat for that hardware class beyond LL's (`step_overhead_us`), per
    step of STEP_BYTES. With `gpu` (cost/gpu.py): its threadblock throughput, floor and NVLink
    efficiency, and NCCL's baseLat of `algorithm` as the per-call launch cost. `arch` and
    `nnodes` are kept for callers; the threadblock cap comes from `gpu` alone.
    """
    del arch, nnodes
    p = canonical_protocol(protocol)
    base = PROTOCOL_COSTS[p]
    step = step_overhead_us(p, hw_of(link_kind))
    cost = replace(base, step_latency_us=step, step_bytes=STEP_BYTES[p])
    if gpu is None:
        return cost
    i = PROTOCOLS.index(p)
    launch = BASE_LAT[canonical_algorithm(algorithm)][i] or BASE_LAT["ring"][i]  # NVLS etc.: 0
    return replace(
        cost,
        tb_gbps=gpu.tb(p),
        launch_us=launch,
        floor_us=gpu.floor_us.get(p, 0.0),
        nvlink_efficiency=gpu.nvlink_efficiency,
    )


def nccl_latency_us(
    algorithm: str,
    protocol: str,
    link_kind: LinkKind | str,
    nranks: int,
    nnodes: int,
    *,
    collective: str = "allreduce",
    net_latency_us: float = 0.0,
    cpu_vendor: str = "intel",
    same_channels: bool = True,
) -> float:
    """NCCL's modeled latency (us) of one collective call (ncclTopoTuneModel, v2.19).

    `link_kind` is the intra-node link class of the algorithm's graph (NVLink vs PCI);
    `net_latency_us` is graph->latencyInter (the NIC's reported latency, 0 for IB by default).
    Returns 0.0 for combinations NCCL does not model.
    """
    a = canonical_algorithm(algorithm)
    p = canonical_protocol(protocol)
    pi = PROTOCOLS.index(p)
    if nranks <= 1:
        return 0.0
    intra_hw = Hw.NVLINK if hw_of(link_kind) == Hw.NVLINK else Hw.PCI
    hw = intra_hw if nnodes == 1 else Hw.NET
    intra_lat = HW_LAT[intra_hw][a][pi]
    ppn = nranks // max(nnodes, 1)
    # NCCL 2.30.7: with one GPU per node the network latency is fully exposed (tree's is used).
    inter_lat = HW_LAT[Hw.NET]["tree" if ppn == 1 else a][pi] + net_latency_us
    if p == "Simple":
        inter_lat += net_latency_us  # NCCL adds the flush latency too
    lat = BASE_LAT[a][pi]
    coll = collective.lower()
    if a == "ring":
        nsteps, ninter = _ring_steps(coll, nranks, nnodes)
        step = HW_LAT[hw][a][pi]
        if coll in ("broadcast", "reduce"):
            # NCCL: rings identical on every channel add one step; otherwise nsteps steps, with
            # the tree's Simple step latency standing in for Simple ("waiting for chunk modeling").
            if same_channels:
                return lat + step
            if p == "Simple":
                step = HW_LAT[hw]["tree"][pi]
            return lat + nsteps * step
        overhead = 0.0
        if nnodes > 1:
            overhead = NET_OVERHEAD_US.get(cpu_vendor, 1.0) * (3 if p == "Simple" else 1)
        intra_lat = max(intra_lat, overhead)
        return lat + (nsteps - ninter) * intra_lat + ninter * inter_lat
    if a == "tree":
        return lat + 2 * ((ppn - 1) * intra_lat + _log2i(nnodes) * inter_lat)
    if a == "collnet_direct":
        return lat + 2 * (min(1, ppn - 1) * intra_lat + (ppn - 1) * 0.4) + inter_lat
    if a == "collnet_chain":
        return lat + 2 * (ppn - 1) * intra_lat + inter_lat
    if a == "nvls":
        return intra_lat + (inter_lat if nnodes > 1 else 0.0)
    return lat + intra_lat + 2 * _log2i(nnodes) * inter_lat  # nvls_tree


def _ring_steps(coll: str, nranks: int, nnodes: int) -> tuple[int, int]:
    if coll == "allreduce":
        return 2 * (nranks - 1), (2 * nnodes if nnodes > 1 else 0)
    if coll in ("reducescatter", "allgather"):
        return nranks - 1, nnodes - 1
    return nranks, nnodes


def _log2i(n: int) -> int:
    """NCCL's log2i: floor(log2(n)) for n >= 1."""
    return n.bit_length() - 1 if n >= 1 else 0


def tree_correction(protocol: str, size_bytes: int) -> float:
    """NCCL's static tree bandwidth correction for mid-size messages (1.0 above 256 MiB)."""
    table = TREE_CORRECTION[canonical_protocol(protocol)]
    log_size = _log2i(size_bytes >> 6) if size_bytes >= 64 else 0
    return table[log_size] if log_size < len(table) else 1.0


def speed_arrays(arch: Arch | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(intra, inter) per-channel speed candidates NCCL's search uses for this generation."""
    if arch == Arch.HOPPER:
        return SM90_SPEED_ARRAY_INTRA, SM90_SPEED_ARRAY_INTER
    return SPEED_ARRAY_INTRA, SPEED_ARRAY_INTER
