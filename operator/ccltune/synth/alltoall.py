"""AlltoAll synthesis: which sizes are worth a search (docs/synthesis.md, "AlltoAll").

NCCL runs AlltoAll as grouped point-to-point sends, every peer on its own connection along its
shortest path: in the model that is at the lower bound at most sizes (every pair's bytes cross
the busiest cut once, and the farthest pair pays one launch and one route). Where NCCL's time
is already at the launch-inclusive bound no schedule can be faster, so those sizes are not
searched at all; the search (assembly, simulation, files) runs only where a file could win.
"""

from __future__ import annotations

from ..api.cluster import ClusterTopology
from ..api.common import Collective
from ..api.plan import Estimate
from ..model.cost.sm_bound import launched_bound_us

TIE = 1e-6  # relative: a "win" this small is the simulator's rounding, not a faster schedule


def at_bound(topo: ClusterTopology, sizes: list[int], threadblocks: int,
             defaults: dict[int, Estimate]) -> dict[int, float]:  # fmt: skip
    """Sizes at which NCCL's default AlltoAll (`defaults`, simulated) is no slower than the
    launch-inclusive bound at `threadblocks` per GPU, with that bound: nothing can beat it."""
    out: dict[int, float] = {}
    for s in sizes:
        floor = launched_bound_us(Collective.ALLTOALL, s, topo, threadblocks)
        if defaults[s].time_us <= floor * (1 + TIE):
            out[s] = floor
    return out


def worth_timing(schedule_us: float, nccl_us: float) -> bool:
    """A file only adds waits to its schedule (engine.py): one whose schedule already takes
    NCCL's time cannot win, and timing it (reading it back) is most of a file's cost."""
    return schedule_us < nccl_us


def closed_reason(default_us: float, floor_us: float) -> str:
    return (f"NCCL's default is at the lower bound here ({default_us:.1f} us, bound "
            f"{floor_us:.1f} us with the launch): no schedule can be faster, none is searched")  # fmt: skip


def slower_reason(label: str, proto: str, ratio: float) -> str:
    return (f"NCCL's default is faster: the best synthesized schedule ({label}/{proto}) takes "
            f"{ratio:.2f}x its time before it is a file (a file only adds waits), so none is timed")  # fmt: skip
