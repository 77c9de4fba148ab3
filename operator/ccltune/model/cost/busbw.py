"""nccl-tests bandwidth conventions: algbw and busbw.

Source: nccl-tests doc/PERFORMANCE.md. algbw = size / time, where size is the nccl-tests `size`
column (allgather: whole output; reducescatter: whole input; alltoall: one rank's send buffer).
busbw = algbw * factor, the factor making numbers comparable with the hardware's peak bandwidth:
allreduce 2(n-1)/n; allgather, reducescatter and alltoall (n-1)/n; broadcast (and reduce) 1.
"""

from __future__ import annotations

from ...api.common import Collective


def busbw_factor(collective: Collective | str, nranks: int) -> float:
    """nccl-tests' busbw / algbw ratio for `collective` on `nranks` ranks."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    coll = Collective(collective)
    n = nranks
    if coll == Collective.ALLREDUCE:
        return 2.0 * (n - 1) / n
    if coll in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL):
        return (n - 1) / n
    return 1.0  # broadcast


def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s): size / time."""
    if size_bytes <= 0:
        raise ValueError(f"size must be positive, got {size_bytes} bytes")
    if time_us <= 0:
        raise ValueError(f"time must be positive, got {time_us} us")
    return size_bytes / (time_us * 1e3)  # bytes/us = 1e6 B/s; / 1e3 -> GB/s


def busbw_gbps(
    collective: Collective | str, nranks: int, size_bytes: float, time_us: float
) -> float:
    """Bus bandwidth in GB/s, nccl-tests style."""
    return algbw_gbps(size_bytes, time_us) * busbw_factor(collective, nranks)


def time_for_busbw_us(
    collective: Collective | str, nranks: int, size_bytes: float, busbw: float
) -> float:
    """Inverse of busbw_gbps: the time in us at which `size_bytes` reaches `busbw` GB/s."""
    if busbw <= 0:
        raise ValueError(f"busbw must be positive, got {busbw} GB/s")
    return size_bytes * busbw_factor(collective, nranks) / (busbw * 1e3)
