"""Rail rings on fabrics of three or more switch dimensions (issue 18, session 11; the lowering is
model/formats/msccl/tier_ring.py, decisions in docs/synthesis.md, "Session 11: the 3-tier
fabric"). The outer dimensions together are one rail: on astra-3tier-128 each GPU's one NIC
carries both its leaf and its spine traffic. Built directly as files, not searched; the engine
times them as files beside its finalists (as rail_ring_reduce's variants) and publishes one
where it is fastest.
"""

from __future__ import annotations

import math

from ..api.cluster import Dimension
from ..api.common import Collective
from ..model.formats.msccl import tier_ring as lowering
from ..model.formats.msccl.limits import MAX_STEPS
from ..model.formats.msccl.rail_ring import ring_hops
from ..model.formats.msccl.writer import MscclFormatError
from .rail_ring import MAX_FILE_STEPS
from .rail_ring_reduce import Variant

LABEL = "tier-ring"
COLLECTIVES = (Collective.ALLGATHER,)


def shape(dims: list[Dimension]) -> tuple[int, int] | None:
    """(servers, GPUs a server) where >= 3 switch dimensions make one rail of the outer ones."""
    if len(dims) < 3 or any(d.kind != "switch" or d.size < 2 for d in dims):
        return None
    return math.prod(d.size for d in dims[1:]), dims[0].size


def file_steps(servers: int, local: int) -> int:
    """Steps of the whole AllGather file: per GPU its rings (own send, hops, the cpy), each
    stage's sends and receives (S per partner each way, A x S per group peer each way)."""
    a, b = lowering.groups(local) or (1, local)
    fwd, bwd = ring_hops(servers)
    ring = fwd + 2 + (bwd + 1 if bwd else 0)
    return servers * local * (ring + 2 * servers * (a - 1) + 2 * a * servers * (b - 1))


def variants(dims: list[Dimension], coll: Collective, budget: int, name: str) -> list[Variant]:
    """The tier-ring file where it applies and fits `budget` threadblocks and the executor."""
    got = shape(dims)
    if coll not in COLLECTIVES or got is None:
        return []
    servers, local = got
    a, _ = lowering.groups(local) or (0, 0)
    if not a or a * servers > MAX_STEPS or lowering.threadblocks(local) > budget:
        return []
    if file_steps(servers, local) > MAX_FILE_STEPS:
        return []
    try:
        arr, low = lowering.tier_ring_allgather(servers, local, f"{name}-{LABEL}", budget)
    except MscclFormatError:
        return []
    return [Variant(LABEL, arr, low)]


__all__ = ["COLLECTIVES", "LABEL", "file_steps", "shape", "variants"]
