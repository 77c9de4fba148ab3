"""Task keys: (collective, size bucket, ranks, nodes, role).

Configurations are not portable across keys (AutoCCL, section 2.2): the best settings change with
message size, communicator size and placement, and a TP group inside a node needs other settings
than a DP group across nodes. Each key is tuned on its own; one key = one tuner-table row.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from ..api.common import Collective, format_size, parse_size
from ..api.errors import InputError
from ..api.plan import TaskKey

_ALIASES = {
    "allreduce": Collective.ALLREDUCE,
    "all_reduce": Collective.ALLREDUCE,
    "all-reduce": Collective.ALLREDUCE,
    "allgather": Collective.ALLGATHER,
    "all_gather": Collective.ALLGATHER,
    "all-gather": Collective.ALLGATHER,
    "reducescatter": Collective.REDUCESCATTER,
    "reduce_scatter": Collective.REDUCESCATTER,
    "reduce-scatter": Collective.REDUCESCATTER,
    "alltoall": Collective.ALLTOALL,
    "all_to_all": Collective.ALLTOALL,
    "all-to-all": Collective.ALLTOALL,
    "broadcast": Collective.BROADCAST,
    "bcast": Collective.BROADCAST,
}


def parse_collective(text: str, field: str = "collective") -> Collective:
    c = _ALIASES.get(text.strip().lower())
    if c is None:
        known = ", ".join(sorted({v.value for v in _ALIASES.values()}))
        raise InputError(f"{field}: unknown collective {text!r} (known: {known})")
    return c


def parse_size_range(text: str, field: str = "sizes") -> tuple[int, int]:
    """'1K:1G' -> (1024, 1 << 30); a single size means that size only."""
    parts = text.split(":")
    if len(parts) > 2 or not all(p.strip() for p in parts):
        raise InputError(f"{field}: {text!r} is not a size range like 1K:1G")
    try:
        lo = parse_size(parts[0])
        hi = parse_size(parts[-1])
    except ValueError as exc:
        raise InputError(f"{field}: {exc}") from None
    if lo > hi:
        raise InputError(f"{field}: {format_size(lo)} is larger than {format_size(hi)}")
    return lo, hi


def size_points(lo: int, hi: int, factor: int = 2) -> list[int]:
    """lo, lo*f, lo*f^2, ... below hi, then hi (nccl-tests' -b/-e/-f sweep)."""
    if factor < 2:
        raise InputError(f"size factor must be >= 2, got {factor}")
    points, size = [], lo
    while size < hi:
        points.append(size)
        size *= factor
    points.append(hi)
    return points


def bucket_keys(key: TaskKey, factor: int = 2) -> list[TaskKey]:
    """Split a key's size range into buckets [p, p*f - 1] for p = min, min*f, ... (the last one
    ends at the key's max), each measured at its lower end p."""
    if factor < 2:
        raise InputError(f"size factor must be >= 2, got {factor}")
    points, p = [], key.min_bytes
    while p <= key.max_bytes:
        points.append(p)
        p *= factor
    out = []
    for i, lo in enumerate(points):
        hi = min(points[i + 1] - 1, key.max_bytes) if i + 1 < len(points) else key.max_bytes
        out.append(key.model_copy(update={"min_bytes": lo, "max_bytes": hi}))
    return out


def make_keys(
    collectives: Iterable[Collective | str],
    lo: int,
    hi: int,
    *,
    ranks: int,
    nodes: int,
    role: str = "world",
    factor: int = 2,
) -> list[TaskKey]:
    keys: list[TaskKey] = []
    for c in collectives:
        coll = c if isinstance(c, Collective) else parse_collective(c)
        whole = TaskKey(collective=coll, min_bytes=lo, max_bytes=hi, ranks=ranks, nodes=nodes, role=role)
        keys += bucket_keys(whole, factor)
    return keys


def sample_size(key: TaskKey) -> int:
    """The size a key is measured at: its lower end (a point of the nccl-tests sweep)."""
    return key.min_bytes


def check_keys(keys: Sequence[TaskKey]) -> None:
    """Reject overlapping buckets for the same (collective, ranks, nodes, role)."""
    groups: dict[tuple[str, int, int, str], list[TaskKey]] = {}
    for k in keys:
        groups.setdefault((str(k.collective), k.ranks, k.nodes, k.role), []).append(k)
    for (coll, ranks, nodes, role), ks in groups.items():
        ks = sorted(ks, key=lambda k: k.min_bytes)
        for a, b in itertools.pairwise(ks):
            if b.min_bytes <= a.max_bytes:
                raise InputError(
                    f"task keys overlap for {coll} {role} {ranks} ranks/{nodes} nodes: "
                    f"{a.min_bytes}-{a.max_bytes} and {b.min_bytes}-{b.max_bytes}"
                )
        for k in ks:
            if k.min_bytes > k.max_bytes:
                raise InputError(f"task {k.label()}: min_bytes is larger than max_bytes")


__all__ = [
    "bucket_keys",
    "check_keys",
    "make_keys",
    "parse_collective",
    "parse_size_range",
    "sample_size",
    "size_points",
]
