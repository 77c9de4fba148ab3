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

from dataclasses import dataclass, field

from ..api.common import Collective


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

    def chunk_bytes(self, size_bytes: int) -> float:
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
