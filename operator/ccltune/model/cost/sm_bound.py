"""A lower bound at an SM budget: no schedule on <= T threadblocks per GPU runs faster.

The simulator (sim/simulate.py) charges every transfer to a threadblock side on its sender and
one on its receiver, each carrying at most the protocol's per-threadblock payload rate r
(cost/gpu.py); a GPU running T threadblocks has at most T receive sides and T send sides. No
byte flows before the call's launch and the transfer's own latency (one protocol step plus the
cheapest path into or out of the GPU). So by time t a GPU has received at most
T r (t - launch - alpha) bytes, and for any schedule and protocol p

    t >= max(floor_p, launch_p + alpha_p + D / (T r_p))

where D is the bytes the busiest GPU must receive (or send), M = nccl-tests size, N ranks:
  allgather, reducescatter, alltoall   (N-1)/N M   (every rank receives, or sends, that much)
  allreduce                            2 (N-1)/N M (the one-way gossip minimum, bounds.py,
                                                     averaged over the ranks)
  broadcast                            M           (every non-root receives the whole buffer)
The bound at the budget is the larger of this, under the most favourable protocol, and the link
bound with NVLink at the GPU's SM-copy efficiency (`copy_link_bound_us`): every schedule the
model runs, NCCL's or an MSCCL file, moves its bytes with SM copies, and the simulator caps every
NVLink channel at that fraction of line rate (sim/capacity.py), so no schedule beats the link
bound at line rate x 0.8 either. Where threadblocks do not bind the bound at the budget is that
link bound; the line-rate link bound stays its own number ("% bound").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...api.cluster import ClusterTopology
from ...api.common import Collective
from .bounds import graph_of, lower_bound
from .gpu import GpuPhysics, gpu_physics
from .protocols import BASE_LAT, PROTOCOL_COSTS, PROTOCOLS, Hw, step_overhead_us


@dataclass(frozen=True, slots=True)
class SmBound:
    time_us: float  # 0.0 when the GPU's threadblock rates are unknown (no cap modelled)
    protocol: str  # the protocol giving the smallest (binding) value; "" when none
    threadblocks: int


def demand_bytes(collective: Collective | str, nranks: int, size_bytes: float) -> float:
    """Bytes the busiest GPU must receive (or send) in one call (table above)."""
    coll, n, m = Collective(collective), nranks, float(size_bytes)
    if n <= 1:
        return 0.0
    if coll == Collective.ALLREDUCE:
        return 2.0 * (n - 1) / n * m
    if coll == Collective.BROADCAST:
        return m
    return (n - 1) / n * m


def sm_bound(collective: Collective | str, size_bytes: float, topo: ClusterTopology,
             threadblocks: int, *, gpu: GpuPhysics | None = None) -> SmBound:  # fmt: skip
    """The threadblock bound alone, minimised over the protocols (`gpu`: default the topology's
    GPU). The step cost is each protocol's cheapest over NCCL's hardware classes, so the bound
    holds whichever link kind the simulator is given."""
    if threadblocks < 1:
        raise ValueError(f"threadblocks must be >= 1, got {threadblocks}")
    phys = gpu or gpu_physics(topo.gpu_model)
    n = topo.world_size
    if phys is None or n <= 1:
        return SmBound(0.0, "", threadblocks)
    g = graph_of(topo)
    need = demand_bytes(collective, n, size_bytes)
    best = (float("inf"), "")
    for i, p in enumerate(PROTOCOLS):
        step = min(step_overhead_us(p, hw) for hw in Hw)
        # Earliest any byte can enter or leave some GPU (routes through a relay cost a step).
        alpha = step + min(min(g.nearest(r, step)) for r in range(n))
        launch = BASE_LAT["ring"][i]  # MSCCL's kernel is charged as NCCL's ring launch
        t = launch + alpha + need / (threadblocks * phys.tb(p) * 1e3)
        best = min(best, (max(t, phys.floor_us.get(p, 0.0)), p))
    return SmBound(best[0], best[1], threadblocks)


def copy_link_bound_us(collective: Collective | str, size_bytes: float, topo: ClusterTopology,
                       *, gpu: GpuPhysics | None = None) -> float:  # fmt: skip
    """The link bound (bounds.lower_bound) with every NVLink at the GPU's SM-copy efficiency,
    minimised over the protocols, each with its cheapest step over NCCL's hardware classes (so
    it holds whichever link kind the simulator is given). 0.0 when the GPU is unknown: the
    simulator then runs NVLink at line rate, which the line-rate link bound covers."""
    phys = gpu or gpu_physics(topo.gpu_model)
    if phys is None or topo.world_size <= 1:
        return 0.0
    return min(
        lower_bound(collective, size_bytes, topo, replace(
            PROTOCOL_COSTS[p], step_latency_us=min(step_overhead_us(p, hw) for hw in Hw),
            nvlink_efficiency=phys.nvlink_efficiency)).time_us
        for p in PROTOCOLS
    )  # fmt: skip


def budget_bound_us(collective: Collective | str, size_bytes: float, topo: ClusterTopology,
                    threadblocks: int, link_bound_us: float) -> float:  # fmt: skip
    """The bound at the SM budget: the largest of the link bound given (line rate), the link
    bound at SM-copy efficiency and the threadblock bound."""
    return max(link_bound_us, copy_link_bound_us(collective, size_bytes, topo),
               sm_bound(collective, size_bytes, topo, threadblocks).time_us)  # fmt: skip


def launched_bound_us(collective: Collective | str, size_bytes: float, topo: ClusterTopology,
                      threadblocks: int) -> float:  # fmt: skip
    """No schedule the model runs on <= `threadblocks` per GPU is faster: per protocol, its
    launch (the simulator charges NCCL's baseLat before any byte flows; an MSCCL file pays the
    ring kernel's, the cheapest) plus the link bound with NVLink at the SM-copy efficiency,
    at least the protocol's floor; the smallest over the protocols, and at least `sm_bound`.
    The budget bound leaves the launch out; synthesis uses this one to skip the sizes where
    NCCL's own time is already at it (model/nccl: AlltoAll's p2p is, at most sizes)."""
    phys = gpu_physics(topo.gpu_model)
    if topo.world_size <= 1:
        return 0.0
    best = float("inf")
    for i, p in enumerate(PROTOCOLS):
        cost = replace(PROTOCOL_COSTS[p], step_latency_us=min(step_overhead_us(p, hw) for hw in Hw),
                       nvlink_efficiency=phys.nvlink_efficiency if phys else 1.0)  # fmt: skip
        launch = min(v[i] for v in BASE_LAT.values() if v[i] > 0) if phys else 0.0
        t = launch + lower_bound(collective, size_bytes, topo, cost).time_us
        best = min(best, max(t, phys.floor_us.get(p, 0.0) if phys else 0.0))
    return max(best, sm_bound(collective, size_bytes, topo, threadblocks).time_us)
