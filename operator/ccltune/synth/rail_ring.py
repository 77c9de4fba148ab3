"""Rail-ring AllGather files for the engine (docs/synthesis.md, "Rail rings (session 9)").

Where the fabric is servers of GPUs on one switch (NVSwitch) joined by a second switch
dimension each GPU reaches through its own NIC (rails), the AllGather is built directly as an
MSCCL lowering (model/formats/msccl/rail_ring.py): two rings per rail, then an NVSwitch spread.
Not a sketch of the search: its chained `rcs` steps are no schedule the writer lowers, and at 512
GPUs none of the search's schedules fit the executor's steps.
"""

from __future__ import annotations

from collections.abc import Callable

from ..api.cluster import Dimension
from ..api.common import Collective
from ..model.formats.msccl.limits import MAX_STEPS
from ..model.formats.msccl.rail_ring import rail_ring_allgather, ring_hops
from ..model.formats.msccl.writer import MscclFormatError, MscclLowering
from ..model.schedule.ir import ScheduleArrays

LABEL = "rail rings"
# Steps a rail-ring file (AllGather here, ReduceScatter and AllReduce in rail_ring_reduce.py)
# may hold in all to be offered: what its row's memory grows with (its lowering, ~700 B a step
# as Python objects, the read-back's steps and transfers, the sliced deps). h800-rail-512's
# 512-GPU files are offered where their row was measured within issue 18's 2 GB with a margin
# (1,850 MB; below). Set above every file the gate by
# ranks (256) let through (the largest: 245,760, ReduceScatter on 32 x 8); h800-rail-64's are
# 7,808 (AllGather), 30,720 (ReduceScatter), 61,184 (AllReduce).
# docs/synthesis-scale.md, "Session 10: the rail rings within 2 GB".
MAX_FILE_STEPS = 250_000
# Collectives whose 512-GPU rows were measured within the margin with their larger file:
# h800-rail-512 ReduceScatter (491,520 steps): 1,561-1,569 MB peak RSS, 1,609-1,632 MB PSS
# (docs/synthesis-scale.md, "Session 11: the rail-512 rings"); since session 12 its file both
# ways round (492,032 steps) instead: 1,414 MB RSS, 1,485 PSS (docs/synthesis.md, "Session 12:
# rail ReduceScatter both ways round"); AllGather (492,544 steps), once
# a file has one read-back whatever its protocol: 1,705-1,712 MB peak RSS, 1,775-1,779 MB PSS
# (1,974 / 2,031 before; 22.0 -> 61.0% of the budget bound; "Session 12: one read-back per
# file"); AllReduce (the both-ways ring, blocks of 4 servers: 309,248 steps): 1,492 MB peak
# RSS, 1,572 PSS, as without it (18.0 -> 51.3%; docs/synthesis.md, "Session 12: rail AllReduce
# within 64 steps").
MAX_FILE_STEPS_OF = {Collective.REDUCESCATTER: 500_000, Collective.ALLGATHER: 500_000,
                     Collective.ALLREDUCE: 320_000}


def max_file_steps(coll: Collective) -> int:
    """Steps a rail-ring file of `coll` may hold to be offered."""
    return MAX_FILE_STEPS_OF.get(coll, MAX_FILE_STEPS)


def shape(dims: list[Dimension]) -> tuple[int, int] | None:
    """(servers, GPUs a server) where rail rings apply: two switch dimensions, >= 2 of each."""
    if len(dims) != 2 or any(d.kind != "switch" or d.size < 2 for d in dims):
        return None
    return dims[1].size, dims[0].size


def file_steps(servers: int, local: int) -> int:
    """Steps of the whole file: per GPU two rings, and 2 (L-1) spread threadblocks of S."""
    fwd, bwd = ring_hops(servers)
    ring = fwd + 2 + (bwd + 1 if bwd else 0)  # own send, hops, and the cpy on the forward ring
    return servers * local * (ring + 2 * (local - 1) * servers)


def files(dims: list[Dimension], budget: int,
          name: Callable[[str], str]) -> list[tuple[str, ScheduleArrays, MscclLowering]]:  # fmt: skip
    """(label, schedule, lowering) of the rail-ring file where it applies and fits `budget`
    threadblocks and the executor's steps; `name` gives a label's schedule name."""
    got = shape(dims)
    if got is None:
        return []
    servers, local = got
    if servers > MAX_STEPS or 2 * local > budget:  # a spread threadblock's steps; threadblocks
        return []
    if file_steps(servers, local) > max_file_steps(Collective.ALLGATHER):
        return []
    try:
        arr, low = rail_ring_allgather(servers, local, name(LABEL), budget)
    except MscclFormatError:
        return []
    return [(LABEL, arr, low)]


__all__ = ["LABEL", "MAX_FILE_STEPS", "MAX_FILE_STEPS_OF", "file_steps", "files", "max_file_steps",
           "shape"]  # fmt: skip
