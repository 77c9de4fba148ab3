"""What msccl-executor-nccl accepts and when it runs a file: its limits and its selection rule.

Sources (Azure/msccl-executor-nccl c6f6b36, as vendored by the conformance kit):
- makefiles/common.mk: `MSCCL_MAX_NUM_STEPS ?= 64` (steps per threadblock; a build may raise it).
- src/include/msccl/msccl_struct.h: MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL 32, MSCCL_MAX_COUNT 72
  (a step's cnt must stay below it), threadblocks per rank = 32 x MAXCHANNELS.
- src/include/device.h: MAXCHANNELS 32 (a threadblock's chan must be below it).
- src/include/msccl/msccl_parser.h: MAX_NODES 4096 XML nodes per parse; the parse for one rank
  holds <algo>, every <gpu> and that rank's <tb> and <step> nodes (other ranks' are skipped).
  MAX_SUBS 1024 children per node, so at most 1024 <gpu>s.
- src/include/device.h NCCL_STEPS 8 (slots of a connection's FIFO), msccl_struct.h
  MSCCL_CHUNKSTEPS (NCCL_STEPS/2 = 4 slots per Simple chunk call; formats/msccl/executor.py):
  at the largest sizes (one chunk per call) a FIFO holds 2 Simple chunks before a send blocks.
- src/misc/msccl/msccl_parser.cc: sizeMultiplier = ngpus for allgather, reducescatter, alltoall,
  else 1; msccl_lifecycle.cc mscclInternalSchedulerSelectAlgo runs a file for a call of `count`
  elements only when (count x sizeMultiplier) % nchunksperloop == 0 and
  minBytes <= count x typeSize x sizeMultiplier <= maxBytes (maxBytes 0: no upper limit).
"""

from __future__ import annotations

from ....api.common import Collective

MAX_STEPS = 64
MAX_TB_PER_CHANNEL = 32
MAX_CHANNELS = 32
MAX_THREADBLOCKS = MAX_TB_PER_CHANNEL * MAX_CHANNELS
MAX_COUNT = 71
MAX_XML_NODES = 4096
MAX_GPUS = 1024
FIFO_CHUNKS = 2  # chunks a connection takes before a send blocks, in the worst case (Simple)

# Element sizes a framework calls with: fp8/int8, bf16/fp16, fp32. A file must be selected for
# each (fp64 collectives are rare in training and would halve the chunk counts that fit).
ELEMENT_BYTES = (1, 2, 4)

_TOP = 1 << 62


def size_multiplier(coll: Collective | str, nranks: int) -> int:
    coll = Collective(coll)
    if coll in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL):
        return nranks
    return 1


def xml_nodes(nranks: int, threadblocks: int, steps: int) -> int:
    """Nodes the executor's parser holds for one rank: <algo>, the <gpu>s, its <tb>s and <step>s."""
    return 1 + nranks + threadblocks + steps


def selected(coll: Collective | str, nranks: int, chunks_per_loop: int, nbytes: int,
             elem_bytes: int) -> bool:  # fmt: skip
    """Whether a call of `nbytes` (nccl-tests' size) with this element size passes the
    divisibility test; True when no such call exists (nbytes is no whole number of elements)."""
    m = size_multiplier(coll, nranks)
    if nbytes % (elem_bytes * m):
        return True
    return (nbytes // elem_bytes) % chunks_per_loop == 0


def callable_sizes(coll: Collective | str, nranks: int, lo: int, hi: int) -> list[int]:
    """The sizes in [lo, hi] a framework calls: powers of two, and sizeMultiplier x element size
    x a power of two (a rank's buffer of 2^k elements, e.g. 48 ranks' allgather)."""
    m = size_multiplier(coll, nranks)
    out = {1 << k for k in range(63) if lo <= 1 << k <= hi}
    for e in ELEMENT_BYTES:
        out |= {m * e << k for k in range(63) if lo <= m * e << k <= hi}
    return sorted(out)


def first_selected(coll: Collective | str, nranks: int, chunks_per_loop: int, lo: int,
                   hi: int = 0) -> int | None:  # fmt: skip
    """The smallest minBytes >= lo from which every callable size up to hi (0: no limit) is
    selected for every element size; None when no callable size in the range is."""
    top = hi or _TOP
    sizes = callable_sizes(coll, nranks, max(lo, 1), top)
    bad = [s for s in sizes
           if not all(selected(coll, nranks, chunks_per_loop, s, e) for e in ELEMENT_BYTES)]  # fmt: skip
    start = max(lo, bad[-1] + 1) if bad else lo
    if not any(s >= start for s in sizes):
        return None
    return start


__all__ = [
    "ELEMENT_BYTES", "FIFO_CHUNKS", "MAX_CHANNELS", "MAX_COUNT", "MAX_GPUS", "MAX_STEPS", "MAX_TB_PER_CHANNEL",
    "MAX_THREADBLOCKS", "MAX_XML_NODES", "callable_sizes", "first_selected", "selected",
    "size_multiplier", "xml_nodes",
]  # fmt: skip
