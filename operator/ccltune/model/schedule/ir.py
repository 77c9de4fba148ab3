"""Schedule IR: a DAG of chunk transfers between ranks.

Chunk space of each collective (N ranks, C = chunks_per_rank):
- allgather:     N*C chunks; chunk k starts on rank k // C; every rank ends with all of them.
- reducescatter: N*C chunks; every rank starts with its own contribution to every chunk;
                 rank r ends with chunks r*C .. r*C+C-1 reduced over all N contributions.
- allreduce:     C chunks (the whole buffer); every rank starts with its contribution to every
                 chunk and ends with all of them reduced over all N contributions.
- alltoall:      N*N*C chunks; chunk (s*N + d)*C + j starts on rank s and must end on rank d.
- broadcast:     C chunks, all starting on `root`; every rank ends with all of them.

A Transfer moves `count` consecutive chunks starting at `chunk` from `src` to `dst`; with
`reduce` the receiver adds the data to its own copy, otherwise it stores it. A transfer starts only
after every transfer in `deps` has completed; the sender sends its copy of the chunks as it is at
that moment, so a schedule must list in `deps` the transfers that brought that data to `src`.
`channel` groups transfers that NCCL/MSCCL would run on the same channel (threadblock pair).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...api.common import Collective


@dataclass(frozen=True, slots=True)
class Transfer:
    src: int
    dst: int
    chunk: int
    count: int = 1
    reduce: bool = False
    deps: tuple[int, ...] = ()
    channel: int = 0


@dataclass(slots=True)
class Schedule:
    name: str
    collective: Collective
    nranks: int
    chunks_per_rank: int
    transfers: list[Transfer] = field(default_factory=list)
    root: int = 0  # broadcast only
    protocol: str = "Simple"
    channels: int = 1

    @property
    def total_chunks(self) -> int:
        n, c = self.nranks, self.chunks_per_rank
        if self.collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
            return n * c
        if self.collective == Collective.ALLTOALL:
            return n * n * c
        return c

    def chunk_bytes(self, size_bytes: float) -> float:
        """Bytes in one chunk when the collective moves `size_bytes` (nccl-tests' size column).

        nccl-tests' size is the whole output for allgather, the whole input for reducescatter,
        one rank's send buffer for alltoall (N*C chunks) and the buffer for the others.
        """
        if self.collective == Collective.ALLTOALL:
            return size_bytes / (self.nranks * self.chunks_per_rank)
        return size_bytes / self.total_chunks

    def add(self, transfer: Transfer) -> int:
        self.transfers.append(transfer)
        return len(self.transfers) - 1


@dataclass(slots=True)
class ScheduleArrays:
    """The same schedule as flat numpy arrays, for schedules too large for Transfer objects.

    Transfer i is (src[i], dst[i], chunk[i], count[i], reduce[i], channel[i]); its deps are
    dep_idx[dep_ptr[i]:dep_ptr[i+1]] (CSR). Semantics are exactly those of `Schedule`.
    """

    name: str
    collective: Collective
    nranks: int
    chunks_per_rank: int
    src: np.ndarray  # int32
    dst: np.ndarray  # int32
    chunk: np.ndarray  # int64
    count: np.ndarray  # int32
    reduce: np.ndarray  # bool
    channel: np.ndarray  # int32
    dep_ptr: np.ndarray  # int64, len = transfers + 1
    dep_idx: np.ndarray  # int64
    root: int = 0
    protocol: str = "Simple"
    channels: int = 1
    # Per transfer: the threadblock id that runs it on its sender and on its receiver
    # (sim/capacity.py caps each threadblock's throughput). NCCL's kernels: the channel; MSCCL
    # read-back: the file's <tb id>. None = one threadblock per (channel, peer), as MSCCL's
    # lowering assigns them.
    tb: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.src)

    @property
    def total_chunks(self) -> int:
        return _total_chunks(self.collective, self.nranks, self.chunks_per_rank)

    def chunk_bytes(self, size_bytes: float) -> float:
        if self.collective == Collective.ALLTOALL:
            return size_bytes / (self.nranks * self.chunks_per_rank)
        return size_bytes / self.total_chunks

    @classmethod
    def from_schedule(cls, s: Schedule) -> ScheduleArrays:
        ts = s.transfers
        ptr, idx = dep_csr([t.deps for t in ts])
        return cls(
            name=s.name,
            collective=Collective(s.collective),
            nranks=s.nranks,
            chunks_per_rank=s.chunks_per_rank,
            src=np.fromiter((t.src for t in ts), dtype=np.int32, count=len(ts)),
            dst=np.fromiter((t.dst for t in ts), dtype=np.int32, count=len(ts)),
            chunk=np.fromiter((t.chunk for t in ts), dtype=np.int64, count=len(ts)),
            count=np.fromiter((t.count for t in ts), dtype=np.int32, count=len(ts)),
            reduce=np.fromiter((t.reduce for t in ts), dtype=bool, count=len(ts)),
            channel=np.fromiter((t.channel for t in ts), dtype=np.int32, count=len(ts)),
            dep_ptr=ptr,
            dep_idx=idx,
            root=s.root,
            protocol=s.protocol,
            channels=s.channels,
        )

    def to_schedule(self) -> Schedule:
        ptr, idx = self.dep_ptr.tolist(), self.dep_idx.tolist()
        transfers = [
            Transfer(s, d, c, n, r, tuple(idx[ptr[i] : ptr[i + 1]]), ch)
            for i, (s, d, c, n, r, ch) in enumerate(
                zip(
                    self.src.tolist(),
                    self.dst.tolist(),
                    self.chunk.tolist(),
                    self.count.tolist(),
                    self.reduce.tolist(),
                    self.channel.tolist(),
                    strict=True,
                )
            )
        ]
        return Schedule(
            self.name,
            self.collective,
            self.nranks,
            self.chunks_per_rank,
            transfers,
            self.root,
            self.protocol,
            self.channels,
        )


def dep_csr(deps: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-transfer dependency lists as ScheduleArrays' (dep_ptr, dep_idx)."""
    lens = np.fromiter((len(d) for d in deps), dtype=np.int64, count=len(deps))
    ptr = np.zeros(len(deps) + 1, dtype=np.int64)
    np.cumsum(lens, out=ptr[1:])
    idx = np.fromiter((x for d in deps for x in d), dtype=np.int64, count=int(ptr[-1]))
    return ptr, idx


def _total_chunks(collective: Collective, n: int, c: int) -> int:
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return n * c
    if collective == Collective.ALLTOALL:
        return n * n * c
    return c
