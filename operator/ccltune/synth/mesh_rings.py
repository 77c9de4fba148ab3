"""ReduceScatter / AllReduce on a small mesh of unequal links as several rings at once
(issue 18).

On the DGX-1 cube-mesh quad GPUs 0 and 1 have 4 NVLink lanes in, so with equal shards each
receives 1.5 buffers at 80 GB/s at best. Four directed rings, each through one 1-lane pair
(0-1-2-3, 0-3-2-1, 0-2-1-3, 0-3-1-2), use every 1-lane link once and a 2-lane link at most
twice: 20 GB/s each, 80 GB/s into every GPU, on 2 channels each (the 8-threadblock budget). Every
chunk is reduced around its ring, then passed on (msccl-tools' ring AllReduce, per ring);
the ReduceScatter is the first half. The AllGather half alone loses to NCCL's ring there (831.4
against 693.1 us at 64 MiB, simulated: its own chunks' copy is charged), so it is not offered.
`rings` picks the set from the mesh's directed Hamiltonian cycles; docs/synthesis.md
"Session 10: the cube-mesh".
"""

from __future__ import annotations

import itertools

from ..api.common import Collective
from ..model.formats.msccl.limits import MAX_STEPS
from ..model.schedule.ir import ScheduleArrays
from . import assemble as asm
from .group import GroupTopo

MAX_GPUS = 5  # (n - 1)! directed cycles, subsets of up to 4 of them: 24 and 12,950 at n = 5
MAX_RINGS = 4
DEPTH = 4  # chunks per ring channel and shard: later chunks overlap a ring step's latency


def rings(group: GroupTopo, budget: int, lane_gbps: float, tb_gbps: float,
          ) -> list[list[int]] | None:  # fmt: skip
    """The directed Hamiltonian cycles that together move the most, each at the same rate (equal
    shares of the data): k rings dividing the budget, each at the least of its links' capacity
    over the rings that share it and its budget / k threadblocks; ties to fewer rings. None
    where no cycle exists or the mesh is too large to enumerate."""
    n = group.size
    if not 3 <= n <= MAX_GPUS:
        return None
    links = set(group.links())
    cycles = [[0, *p] for p in itertools.permutations(range(1, n))
              if all((u, v) in links for u, v in itertools.pairwise([0, *p, 0]))]  # fmt: skip
    best: tuple[float, int, list[list[int]]] | None = None
    for k in range(1, min(MAX_RINGS, len(cycles), budget) + 1):
        if budget % k:
            continue
        for subset in itertools.combinations(cycles, k):
            users: dict[tuple[int, int], int] = {}
            for ring in subset:
                for hop in itertools.pairwise([*ring, ring[0]]):
                    users[hop] = users.get(hop, 0) + 1
            rate = min(min(group.capacity(*hop) * lane_gbps / c for hop, c in users.items()),
                       budget // k * tb_gbps)  # fmt: skip
            if best is None or k * rate > best[0] * (1 + 1e-9):
                best = (k * rate, k, [list(r) for r in subset])
    return None if best is None else best[2]


def depth_for(n: int) -> int:
    """Chunks per ring channel and shard within the step limit: a threadblock sends and receives
    n - 1 times per chunk in each of the two phases."""
    return max(1, min(DEPTH, MAX_STEPS // (4 * (n - 1))))


def ring_reduce(n: int, ring_set: list[list[int]], per_ring: int, depth: int, coll: Collective,
                name: str) -> ScheduleArrays:  # fmt: skip
    """Every ring on `per_ring` channels of its own; each (ring, channel) slot takes `depth`
    chunks of every shard: reduced around the ring into the owner (ReduceScatter), then, for
    AllReduce, passed on around it.
    Emitted chunk by chunk (each chunk's hops before the next chunk's), one queue per
    connection: so simulated, the schedule ran 1,303.4 us at 64 MiB against 1,339.3 emitted hop
    by hop, which NCCL's ring (1,339.7) would have kept from being timed as a file."""
    slots = [(ring, k * per_ring + h) for k, ring in enumerate(ring_set) for h in range(per_ring)]
    cpr = len(slots) * depth

    def phase(reduce: bool) -> ScheduleArrays:
        b = asm.Builder()
        last: dict[int, int] = {}
        for d, i in itertools.product(range(depth), range(n - 1)):
            for s, (ring, ch) in enumerate(slots):
                pos = {g: x for x, g in enumerate(ring)}
                for q in range(n):
                    c = q * cpr + d * len(slots) + s
                    a = pos[q] + i + (1 if reduce else 0)  # reduces start after the owner
                    u, v = ring[a % n], ring[(a + 1) % n]
                    dep = last.get(c)
                    last[c] = b.add(u, v, c, () if dep is None else (dep,), channel=ch,
                                    reduce=reduce, stream=ch)  # fmt: skip
        kind = Collective.REDUCESCATTER if reduce else Collective.ALLGATHER
        return b.arrays(name, kind, n, cpr, channels=len(slots))

    rs = phase(True)
    return rs if coll == Collective.REDUCESCATTER else asm.allreduce(rs, phase(False), name)
