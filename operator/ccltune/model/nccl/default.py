"""What NCCL picks on its own: algorithm, protocol and channels, from NCCL's tuning model.

NCCL (src/graph/tuning.cc ncclTopoTuneModel + ncclTopoGetAlgoTime, src/enqueue.cc getAlgoInfo;
v2.19 shape, latency and LL tables of 2.30.7, model/cost.py) predicts, per (algorithm, protocol),
time = latency + size / bandwidth and takes the minimum; then it trims channels and threads for
small sizes. We rebuild its inputs from the ClusterTopology instead of from NCCL's topology search:

- ring/tree graphs: per-channel speed = the highest entry of NCCL's speed array (search.cc, sm90
  array on Hopper) that fits the GPU's ring bandwidth (sum of its NVLink/xGMI links, else its PCIe
  link; across nodes also the node's NIC bandwidth per rail-ring), channels = bandwidth / speed
  up to MAXCHANNELS/2, then NCCL's channel duplication when the speed is >= 25 GB/s
  (search.cc ncclTopoDupChannels). Its bandwidth model counts these graph channels; the kernels run
  on comm->nChannels, which connect.cc ncclTopoPostset doubles (and doubles again on Hopper across
  nodes when a channel's speed exceeds 45 GB/s and fewer than 16 remain).
- bandwidth refinements, latencies, tree correction factors, ring plateau: tuning.cc restated.
- the simulated pipeline uses NCCL's chunk sizes (enqueue.cc calcCollChunking; tree/LL128 halves
  its chunk for mid sizes), within a transfer budget (docs/cost-model.md).
- LL128 is on by default only with NVLink inside the node, one GPU generation of Volta/Ampere/
  Hopper, and across nodes a NIC under the GPU's PCIe switch (or Hopper with NVLink, PXN).
- alltoall is not a tuned collective in NCCL (grouped send/recv): we report it as "p2p" with LL
  below NCCL_P2P_LL_THRESHOLD (16 KiB per peer) and Simple above.

Deviations (docs/cost-model.md): no NVLS/CollNet (their in-switch reductions are not in the IR);
the speed/channel search is a closed form, not NCCL's backtracking search; AMD GPUs use NCCL's
Ampere tables with LL128 off (RCCL has its own tuning); CPU vendor assumed Intel (net overhead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ...api.cluster import ClusterTopology, DeviceKind, LinkKind
from ...api.common import Collective, Source
from ...api.plan import Choice, Estimate
from ..cost.bounds import lower_bound
from ..cost.busbw import algbw_gbps, busbw_gbps
from ..cost.gpu import NVLINK_SM_EFFICIENCY, gpu_physics
from ..cost.protocols import (
    MAX_THREADS,
    MAXCHANNELS,
    PCI_BW,
    PER_CH_MAX_RING_LL128_BW,
    PER_CH_MAX_TREE_BW,
    PER_CH_MAX_TREE_LL128_BW,
    PROTOCOLS,
    SIMPLE_SLICES_PER_CHUNK,
    STEP_BYTES,
    THREAD_THRESHOLD,
    WARP_SIZE,
    Arch,
    ProtocolCost,
    arch_of,
    comp_cap_of,
    ll_max_bw,
    nccl_latency_us,
    nodes_class,
    protocol_cost,
    speed_arrays,
    tree_correction,
)
from ..schedule.ir import ScheduleArrays
from ..sim.routing import Router
from ..sim.simulate import simulate
from .baselines import nccl_schedule_arrays

P2P_LL_THRESHOLD = 16384  # NCCL_P2P_LL_THRESHOLD default, bytes per peer


@dataclass(frozen=True, slots=True)
class NcclGraph:
    """What NCCL's topology search would report for this cluster (our closed-form model)."""

    arch: Arch | None
    comp_cap: int | None
    intra_kind: LinkKind  # NVLINK (incl. xGMI) or PCIE
    ring_bw_gbps: float  # per-GPU bandwidth a ring can use
    speed_gbps: float  # per-channel bandwidth (bwIntra = bwInter)
    channels: int  # graph channels: the bandwidth model's nChannels (tuning.cc)
    ll128_ok: bool
    nranks: int
    nnodes: int
    comm_channels: int = 0  # comm->nChannels after ncclTopoPostset: the kernels' channels

    @property
    def run_channels(self) -> int:
        return self.comm_channels or self.channels


@dataclass(frozen=True, slots=True)
class NcclDefault:
    choice: Choice
    predicted_time_us: float  # NCCL's own model (its formula), not simulated
    table: dict[str, float] = field(default_factory=dict)  # "algo/proto" -> predicted us


def _gpu_links(topo: ClusterTopology, rank: int) -> list[tuple[str, LinkKind, float]]:
    gid = topo.gpu_id(rank)
    out = []
    for link in topo.links:
        if gid in (link.a, link.b):
            other = link.b if link.a == gid else link.a
            out.append((other, LinkKind(link.kind), link.bandwidth_gbps))
    return out


def nccl_graph(topo: ClusterTopology) -> NcclGraph:
    """Closed-form stand-in for NCCL's ring/tree search on `topo`."""
    arch = arch_of(topo.gpu_model)
    cc = comp_cap_of(topo.gpu_model)
    gpn, nn = topo.gpus_per_node, topo.node_count
    links = _gpu_links(topo, 0)
    fast = [bw for _, kind, bw in links if kind in (LinkKind.NVLINK, LinkKind.XGMI)]
    pcie = [bw for _, kind, bw in links if kind == LinkKind.PCIE]
    if fast and gpn > 1:
        intra_kind, ring_bw = LinkKind.NVLINK, sum(fast)
        if nn == 1:
            # NCCL's search books NVLink at its nominal rate (topo.h: 20 GB/s per 25 GB/s
            # NVLink3 lane), what SM stores reach. Across nodes the NICs bound the search (below).
            nvl = [bw for _, kind, bw in links if kind == LinkKind.NVLINK]
            ring_bw -= sum(nvl) * (1.0 - NVLINK_SM_EFFICIENCY)
    else:
        intra_kind, ring_bw = LinkKind.PCIE, (max(pcie) if pcie else PCI_BW)
    if nn > 1:
        ring_bw = min(ring_bw, _node_nic_bw(topo))
    intra_arr, inter_arr = speed_arrays(arch)
    arr = intra_arr if nn == 1 else inter_arr
    speed = next((s for s in arr if s <= ring_bw), arr[-1])
    channels = max(1, min(MAXCHANNELS // 2, int(ring_bw // speed)))
    if _duplicates(speed, channels, cc):
        channels, speed = min(2 * channels, MAXCHANNELS // 2), speed / 2
    comm = min(MAXCHANNELS, 2 * channels)  # connect.cc ncclTopoPostset: "Duplication"
    if (cc or 0) >= 90 and nn > 1 and speed > 45.0 and comm < 16:
        comm *= 2  # "Use 4 compute channels per search channel to reach peak BW on <8 PPN"
    ll128 = intra_kind == LinkKind.NVLINK and arch is not None
    if nn > 1 and ll128:
        ll128 = arch == Arch.HOPPER or _nic_near_gpu(topo)
    return NcclGraph(
        arch, cc, intra_kind, ring_bw, speed, channels, ll128, topo.world_size, nn, comm
    )


def _duplicates(speed: float, channels: int, cc: int | None) -> bool:
    """search.cc ncclTopoDupChannels (2.30.7): fast channels are duplicated at half the speed,
    except on post-Ampere GPUs between 25 and 50 GB/s with more than 4 channels."""
    if speed < 25.0:
        return False
    return not ((cc or 0) > 80 and speed < 50.0 and channels > 4)


def _node_nic_bw(topo: ClusterTopology) -> float:
    """Network bandwidth out of node 0 (sum of its NICs' links to the fabric), GB/s."""
    node = topo.nodes[0].name
    nics = {d.id for d in topo.devices if d.kind == DeviceKind.NIC and d.node == node}
    total = 0.0
    for link in topo.links:
        if link.kind != LinkKind.NET:
            continue
        if (link.a in nics) != (link.b in nics):
            total += link.bandwidth_gbps
    return total if total > 0 else float("inf")


def _nic_near_gpu(topo: ClusterTopology) -> bool:
    """Does some GPU of node 0 share a PCIe switch with a NIC (NCCL's PATH_PXB)?"""
    kinds = {d.id: d.kind for d in topo.devices}
    node = topo.nodes[0].name
    nbrs: dict[str, set[str]] = {}
    for link in topo.links:
        nbrs.setdefault(link.a, set()).add(link.b)
        nbrs.setdefault(link.b, set()).add(link.a)
    for d in topo.devices:
        if d.kind != DeviceKind.PCIE_SWITCH or d.node != node:
            continue
        around = {kinds.get(x) for x in nbrs.get(d.id, set())}
        if DeviceKind.GPU in around and DeviceKind.NIC in around:
            return True
    return False


def allowed_algorithms(collective: Collective) -> tuple[str, ...]:
    """Algorithms NCCL 2.19 considers per collective (without NVLS/CollNet)."""
    return ("tree", "ring") if collective == Collective.ALLREDUCE else ("ring",)


def _bandwidth(g: NcclGraph, coll: Collective, algo: str, proto: str) -> float:
    """NCCL's algorithm bandwidth (GB/s) for (algo, proto): tuning.cc refinements verbatim."""
    n, nn = g.nranks, g.nnodes
    ci = nodes_class(nn)
    arch = g.arch or Arch.AMPERE
    bus = g.channels * g.speed_gbps
    ll_max = ll_max_bw(g.arch, nn)
    if algo == "ring":
        if proto == "LL":  # NCCL 2.30.7 (v2.19: x1/4, or x1/3 for a 1-node non-allreduce)
            bus = min(ll_max, bus * 0.5)
        elif proto == "LL128":
            bus = min(
                bus * 0.92,
                g.channels * PER_CH_MAX_RING_LL128_BW[arch][ci],  # 2.30.7: no ppn case
            )
        nsteps = (
            2 * (n - 1)
            if coll == Collective.ALLREDUCE
            else (n - 1 if coll in (Collective.ALLGATHER, Collective.REDUCESCATTER) else n)
        )
        return bus * n / nsteps
    # tree
    bus = min(bus * 0.92, g.channels * PER_CH_MAX_TREE_BW[arch][ci])
    if proto == "LL":
        bus = min(bus / 3.8, ll_max)
    elif proto == "LL128":
        bus = min(bus * (7 / 9 if nn == 1 else 120 / 128),
                  g.channels * PER_CH_MAX_TREE_LL128_BW[arch][ci])  # fmt: skip
    return bus * 0.5


def nccl_default(
    collective: Collective | str, size_bytes: int, topo: ClusterTopology
) -> NcclDefault:
    """NCCL's default choice for one call of `collective` moving `size_bytes` on `topo`."""
    coll = Collective(collective)
    if size_bytes <= 0:
        raise ValueError(f"size must be positive, got {size_bytes} bytes")
    g = nccl_graph(topo)
    if g.nranks < 2:
        # NCCL turns a 1-rank collective into a local copy: no algorithm, protocol or model.
        return NcclDefault(
            Choice(kind="nccl", algorithm="ring", protocol="Simple", channels=1), 0.0
        )
    if coll == Collective.ALLTOALL:
        per_peer = size_bytes / max(g.nranks, 1)
        proto = "LL" if per_peer <= P2P_LL_THRESHOLD else "Simple"
        return NcclDefault(Choice(kind="nccl", algorithm="p2p", protocol=proto), 0.0, {})
    table: dict[str, float] = {}
    best: tuple[float, str, str] | None = None
    for algo in allowed_algorithms(coll):
        for proto in PROTOCOLS:
            if proto == "LL128" and not g.ll128_ok:
                continue
            t = predicted_time_us(coll, algo, proto, size_bytes, g)
            table[f"{algo}/{proto}"] = t
            if best is None or t < best[0]:
                best = (t, algo, proto)
    assert best is not None
    t, algo, proto = best
    nc, nt = _channels_threads(g, algo, proto, size_bytes)
    choice = Choice(kind="nccl", algorithm=algo, protocol=proto, channels=nc, threads=nt)
    return NcclDefault(choice, t, table)


def predicted_time_us(
    coll: Collective | str, algo: str, proto: str, size_bytes: int, g: NcclGraph
) -> float:
    """ncclTopoGetAlgoTime: latency (with the ring plateau) + size / corrected bandwidth."""
    coll = Collective(coll)
    bw = _bandwidth(g, coll, algo, proto)
    if algo == "tree":
        bw *= tree_correction(proto, size_bytes)
    lat = nccl_latency_us(algo, proto, g.intra_kind, g.nranks, g.nnodes, collective=coll.value)
    if (
        algo == "ring" and proto == "Simple" and g.nnodes > 1 and coll == Collective.ALLREDUCE
        and size_bytes / (g.run_channels * g.nranks) >= 64
    ):  # fmt: skip
        lat *= 1.9 if (g.comp_cap or 80) < 80 else 1.4  # NCCL: "plateau effect of ring"
    return lat + size_bytes / (1000.0 * bw)


def _channels_threads(g: NcclGraph, algo: str, proto: str, size_bytes: int) -> tuple[int, int]:
    """enqueue.cc: drop channels, then halve threads, while the message is too small for them."""
    nc = g.run_channels
    if algo == "ring" and proto == "Simple":
        nt = 256 if g.speed_gbps * g.channels <= PCI_BW else MAX_THREADS["Simple"]
    else:
        nt = MAX_THREADS[proto]
    thr = THREAD_THRESHOLD[proto] * (g.nranks if (algo == "ring" and proto == "LL") else 1)
    while size_bytes < nc * nt * thr:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0:
            nt //= 2
        else:
            break
    if proto == "Simple":
        nt += WARP_SIZE * (4 if algo == "tree" else 1)
    return nc, nt


# Bytes per pipeline chunk NCCL moves per step (approximate; see docs/cost-model.md).
_CHUNK_TARGET = {
    "Simple": 512 * 1024,
    "LL128": 576_000,
    "LL": 32 * 1024,
}  # stepSize (LL: /2, LL128: x15/16)
_CUT_THROUGH_PIECE = 16 * 1024  # bytes: simulated piece of an LL/LL128 pipeline (a guess)
_RING_CHUNK_STEPS = 4  # ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS for Simple


def _per_unit_transfers(coll: Collective, algo: str, n: int) -> int:
    if coll == Collective.ALLREDUCE:
        return 2 * n * (n - 1) if algo == "ring" else 2 * max(n - 1, 1)
    if coll == Collective.BROADCAST:
        return max(n - 1, 1)
    return n * max(n - 1, 1)


def _pipelined(coll: Collective, algo: str) -> bool:
    return coll == Collective.BROADCAST or algo not in ("ring", "direct")


def tree_ll128_chunk(size_bytes: int, channels: int, nranks: int, nnodes: int) -> int:
    """NCCL's tree/LL128 chunk (enqueue.cc calcCollChunking): the 576 000-byte step halves while a
    channel's share holds fewer chunks than the pipeline needs (1 + log2(nNodes) + 0.1 ppn steps)."""
    chunk = _CHUNK_TARGET["LL128"]
    nnodes = max(nnodes, 1)
    ppn = nranks / nnodes
    steps = 1 + _log2i(nnodes) + 0.1 * ppn
    while size_bytes // (channels * chunk) < steps * 64 / ppn and chunk > 131072:
        chunk //= 2
    while size_bytes // (channels * chunk) < steps * 16 / ppn and chunk > 32768:
        chunk //= 2
    return chunk


def _log2i(n: int) -> int:
    return n.bit_length() - 1


def simulation_shape(
    coll: Collective | str, algo: str, proto: str, size_bytes: int, channels: int, n: int,
    max_transfers: int, *, nnodes: int = 1,
) -> tuple[int, int]:  # fmt: skip
    """(chunks per channel, channels) for simulating NCCL's pipeline within a transfer budget."""
    coll = Collective(coll)
    target = _CHUNK_TARGET[proto]
    if algo == "ring" and proto == "Simple" and coll != Collective.BROADCAST:
        target *= _RING_CHUNK_STEPS
    if algo == "tree" and proto == "LL128":
        target = tree_ll128_chunk(size_bytes, channels, n, nnodes)
    if proto != "Simple" and _pipelined(coll, algo):
        # LL/LL128 forward each line as it lands (flags ride with the data), not a chunk at a
        # time: the simulator's store-and-forward per piece approaches that with small pieces.
        target = min(target, _CUT_THROUGH_PIECE)
    per_chunk = size_bytes / channels
    if coll in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL) or (
        coll == Collective.ALLREDUCE and algo == "ring"
    ):
        per_chunk /= n
    ideal = max(1, math.ceil(per_chunk / target))
    if not _pipelined(coll, algo):
        ideal = 1  # rings/alltoall run every link at every step: chunks change nothing but cost
    units = max(1, max_transfers // _per_unit_transfers(coll, algo, n))
    # p2p alltoall: NCCL's channels only split each peer's buffer; the links see the same bytes.
    sim_channels = 1 if coll == Collective.ALLTOALL else max(1, min(channels, units))
    chunks = max(1, min(ideal, units // sim_channels))
    return chunks, sim_channels


def nccl_step_bytes(
    coll: Collective, algo: str, proto: str, size_bytes: int, channels: int, topo: ClusterTopology
) -> float:
    """Payload bytes NCCL moves per step (one flag/sync each) for this call.

    Ring/Simple: the chunk is min(ALLREDUCE_CHUNKSTEPS steps, a channel's share per rank) and
    is cut in SlicePerChunk = 2 slices of at least a 32nd of 2 steps (prims_simple.h genericOp:
    sliceSize = max(divUp(nelem, 16 * SlicePerChunk) * 16, stepSize * StepPerSlice / 32)), so
    mid sizes pay many small steps. Tree/LL128: NCCL's halved chunk. Else one buffer step.
    """
    n = max(topo.world_size, 1)
    if algo == "ring" and proto == "Simple" and coll != Collective.BROADCAST:
        slice_max = STEP_BYTES["Simple"] * 2  # ALLREDUCE_SLICESTEPS
        chunk = min(slice_max * SIMPLE_SLICES_PER_CHUNK, size_bytes / (max(channels, 1) * n))
        return min(max(chunk / SIMPLE_SLICES_PER_CHUNK, slice_max / 32), slice_max)
    if algo == "tree" and proto == "LL128":
        return float(tree_ll128_chunk(size_bytes, channels, n, topo.node_count))
    return STEP_BYTES[proto]


def nccl_protocol_cost(
    coll: Collective, algo: str, proto: str, size_bytes: int, channels: int,
    topo: ClusterTopology, g: NcclGraph | None = None,
) -> ProtocolCost:  # fmt: skip
    """What the simulator charges NCCL's kernels for this call: the GPU's threadblock physics
    (cost/gpu.py), NCCL's step size for it, its launch cost (baseLat of the algorithm)."""
    g = g or nccl_graph(topo)
    cost = protocol_cost(proto, link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model),
                         algorithm="ring" if algo in ("p2p", "direct") else algo)  # fmt: skip
    step = nccl_step_bytes(coll, algo, proto, size_bytes, channels, topo)
    return replace(cost, step_bytes=step)


# NCCL's schedule per (collective, algorithm, chunks, channels) on the last topology: a sweep's
# sizes share a few shapes (21 sizes, 4-5 shapes on h800-rail-64) and building one is Python
# per transfer (0.3 s at 512 ranks). Shared, so never written after they are cached.
_SCHEDULES: dict[tuple[Collective, str, int, int], ScheduleArrays] = {}
_SCHEDULES_TOPO: list[ClusterTopology] = []
_SCHEDULES_MAX = 8


def _schedule(coll: Collective, algo: str, topo: ClusterTopology, chunks: int,
              channels: int) -> ScheduleArrays:  # fmt: skip
    if not _SCHEDULES_TOPO or _SCHEDULES_TOPO[0] is not topo:
        _SCHEDULES.clear()
        _SCHEDULES_TOPO[:] = [topo]
    key = (coll, algo, chunks, channels)
    if key not in _SCHEDULES:
        if len(_SCHEDULES) >= _SCHEDULES_MAX:
            _SCHEDULES.pop(next(iter(_SCHEDULES)))
        sched = nccl_schedule_arrays(coll, algo, topo, chunks=chunks, channels=channels)
        # NCCL's kernels run one threadblock per channel (rings and trees alike); p2p alltoall
        # one per peer connection (tb None: one per (channel, peer)).
        if algo == "ring":
            # Numbered per (rank, channel), which the symmetric simulator can relabel rank by
            # rank. A ring threadblock receives from one peer only, so its receive side is the
            # same resource as with tb = channel (sim/capacity.py threadblock_ports).
            sched.tb = (sched.src.astype(np.int64) * channels + sched.channel).astype(np.int32)
        elif coll != Collective.ALLTOALL:
            sched.tb = sched.channel
        _SCHEDULES[key] = sched
    return _SCHEDULES[key]


def _ring_may_be_symmetric(coll: Collective, algo: str, topo: ClusterTopology) -> bool:
    """Can sim/symmetric_sim.py simulate NCCL's ring through one orbit? Inside one node the ring
    is N translates of rank 0's transfers; across nodes every node runs the same intra-node
    layout, so the ring is the node shifts' translates of one node's transfers. A broadcast has
    a root, a tree a root node: neither qualifies. Where the ring's layouts or the routes still
    break a premise, the simulator says so and runs in full. The time is the same either way,
    within 1e-12 relative (other summation order; tests/model/test_nccl_default_symmetric.py),
    at a fraction of the cost (docs/cli-startup.md)."""
    return algo == "ring" and coll != Collective.BROADCAST and topo.dimensions is not None


def default_estimate(
    collective: Collective | str,
    size_bytes: int,
    topo: ClusterTopology,
    *,
    router: Router | None = None,
    max_transfers: int = 50_000,
    with_bound: bool = True,
    choice: Choice | None = None,
) -> Estimate:
    """Simulate NCCL's default choice (its baseline schedule, protocol and channels), or the
    NCCL `choice` given (a tuned algorithm/protocol/channels; model/evaluate.py)."""
    coll = Collective(collective)
    if topo.world_size < 2:
        raise ValueError(
            f"cluster {topo.name!r} has 1 GPU: a collective there moves no data, nothing to estimate"
        )
    run = choice or nccl_default(coll, size_bytes, topo).choice
    g = nccl_graph(topo)
    algo = run.algorithm or "ring"
    proto = run.protocol or "Simple"
    sched_algo = "direct" if algo == "p2p" else algo
    channels = run.channels or g.run_channels
    chunks, sim_channels = simulation_shape(
        coll,
        sched_algo,
        proto,
        size_bytes,
        channels,
        topo.world_size,
        max_transfers,
        nnodes=topo.node_count,
    )
    sched = _schedule(coll, sched_algo, topo, chunks, sim_channels)
    cost = nccl_protocol_cost(coll, algo, proto, size_bytes, channels, topo, g)
    if coll != Collective.ALLTOALL and cost.tb_gbps is not None and sim_channels < channels:
        # Each simulated channel stands for channels / sim_channels of NCCL's threadblocks (else
        # a 512-rank ring squeezed into 1 simulated channel runs at one threadblock's rate).
        cost = replace(cost, tb_gbps=cost.tb_gbps * channels / sim_channels)
    # alltoall runs every flow at once: on a symmetric fabric one orbit per flow class is
    # simulated (direct_alltoall emits translates); else the batched engine handles that
    # contention far faster than the heap.
    if coll == Collective.ALLTOALL:
        res = simulate(sched, topo, size_bytes, cost, router, engine="symmetric", fallback="batch")
    elif _ring_may_be_symmetric(coll, sched_algo, topo):
        res = simulate(sched, topo, size_bytes, cost, router, engine="symmetric", fallback="auto")
    else:
        res = simulate(sched, topo, size_bytes, cost, router)
    t = max(res.time_us, 1e-9)
    bound_us = pct = None
    if with_bound:
        b = lower_bound(coll, size_bytes, topo, cost)
        bound_us, pct = b.time_us, 100.0 * b.time_us / t
    return Estimate(
        size_bytes=size_bytes,
        time_us=t,
        algbw_gbps=algbw_gbps(size_bytes, t),
        busbw_gbps=busbw_gbps(coll, topo.world_size, size_bytes, t),
        source=Source.SIMULATED,
        bound_us=bound_us,
        pct_of_bound=pct,
        choice=run,
    )
