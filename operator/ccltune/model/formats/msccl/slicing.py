"""How msccl-executor-nccl slices a call: iterations, slice bytes, and the sliced schedule.

The runtime (Azure/msccl-executor-nccl c6f6b36, src/device/msccl_kernel.cu mscclRunInterpreter)
splits every MSCCL chunk, `size / nchunksperloop` bytes (msccl_setup.cc: work.count is the
whole collective's count, sizePerMscclChunk = count / nChunksPerLoop), into slices of
`chunkSize` bytes and runs ALL of a threadblock's steps once per slice (the `gridOffset` loop):

    chunkSize = buffSize / NCCL_STEPS x (MSCCL_CHUNKSTEPS = 4 for Simple, 1 otherwise)
              = Simple 2 MiB; LL 32 KiB (half of a 64 KiB step is flags);
                LL128 576000 B (15 of 16 words of a 614400 B step)
    iterations = ceil(sizePerMscclChunk / chunkSize); the last moves the remainder.

Default buffer sizes from src/init.cc DEFAULT_BUFFSIZE (4 MiB), DEFAULT_LL_BUFFSIZE (8 lines x
512 threads x 8 steps x 16 B), DEFAULT_LL128_BUFFSIZE (120 x 640 x 8 x 8 B). Dependency flags
carry the iteration (COMPUTE_FLAG(workIndex, iter, step)): a step waits for its dependency's
step of the SAME iteration. Within an iteration a step of `cnt` chunks makes
ceil(cnt / maxAllowedCount) primitive calls (msccl_setup.cc mscclSetupCount).

`expand` turns a read-back schedule into the schedule of `k` iterations: every transfer once
per iteration, moving its chunks' slice, with
- the file's dependencies inside each iteration;
- program order across iterations: a threadblock starts iteration j after finishing j-1, so
  each of its sends waits for its last send and its last receive of iteration j-1;
- FIFO room: a connection holds NCCL_STEPS = 8 slots and a primitive call takes 4 (Simple) or
  1 (LL, LL128), so a send can run at most 8 // slots-per-iteration iterations ahead of what
  its receiver has taken.
Local operations (a `cpy`, a fused run of `re`s: `ReadBack.timed`) are sliced like the sends:
each iteration runs them on their threadblock after its earlier receives and local operations,
as transfers from their GPU to itself that cross no link and run at their threadblock's rate
(sim/simulate.py). One moves cnt x (reads + 1 write) chunks of local memory, charged as
cnt x (reads + 1) / 2 chunks of payload: a send's payload byte is one read and one write
(docs/cost-model.md, "Local steps"). Its threadblock side is the threadblock's receive side
(a local operation blocks it as a receive does), else its send side, else one of its own.
Only while CHARGE_LOCAL_STEPS is on (below); off, a file's local steps cost nothing.
Each sliced transfer pays the simulator's per-step cost. Transfer counts of the result are in
bytes: simulate it at `unit_size(arrays)`, where one chunk is one byte. `structure` (what the
size does not change) and `with_slices` (the bytes) split `expand` so callers can cache the first.

Long calls (1 GiB under LL is 4096 iterations x every step) are not expanded in full:
`extrapolate` takes two runs of K and K/2 iterations and adds the steady per-iteration time of
the difference for the rest (tested against the full expansion in
tests/model/test_model_msccl_slicing.py). K is 16, less for files so large that K copies would
exceed MAX_EXPANDED transfers (at least 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ....api.common import Collective
from ...schedule.ir import Schedule, ScheduleArrays
from .executor import CHUNK_SLOTS, MAX_ALLOWED_COUNT, NCCL_STEPS
from .reader import ReadBack

# Bytes of one chunk each iteration moves (device chunkSize, see the module docstring).
SLICE_BYTES = {
    "Simple": (1 << 22) // NCCL_STEPS * 4,
    "LL": (8 * 512 * NCCL_STEPS * 16) // NCCL_STEPS // 2,
    "LL128": (120 * 640 * NCCL_STEPS * 8) // NCCL_STEPS * 15 // 16,
}
# Host chunk steps behind maxAllowedCount (msccl_parser.cc: BROADCAST/REDUCE_CHUNKSTEPS 1,
# the others NCCL_STEPS/2); LL and LL128 always 1.
_HOST_CHUNK_STEPS = {Collective.BROADCAST: 1}
# Iterations simulated in full before extrapolating (K); K/2 gives the slope. K shrinks for
# large files so that a run stays within MAX_EXPANDED transfers (a 64-rank file has ~10^5).
MAX_ITERATIONS = 16
MAX_EXPANDED = 200_000
# On (decision, session 9): a real kernel pays for its copies and reduces. It went on once the
# writer spread an out-of-place AllGather's or AlltoAll's own-chunk copy over its threadblocks
# (one `cpy` on one threadblock took mi300x-8 AllGather at 64 MiB from 190.0 to 941.8 us; spread,
# 211.5; docs/synthesis.md "Session 9: local steps charged").
# Set it before timing a file: evaluate.py caches sliced structures.
CHARGE_LOCAL_STEPS = True


@dataclass(frozen=True, slots=True)
class Slicing:
    """What the runtime does with one call of `size_bytes` (nccl-tests' size)."""

    protocol: str
    chunk_bytes: float  # one MSCCL chunk: size / nchunksperloop
    slice_bytes: int  # bytes of a chunk one iteration moves
    iterations: int  # trips of the gridOffset loop
    last_bytes: float  # bytes of a chunk the last iteration moves
    max_allowed_count: int  # chunks one primitive call moves

    def calls(self, cnt: int) -> int:
        """Primitive calls of a step of `cnt` chunks, in each iteration."""
        return -(-cnt // self.max_allowed_count)


def slicing(protocol: str, size_bytes: float, chunks_per_loop: int,
            collective: Collective | str = Collective.ALLREDUCE) -> Slicing:  # fmt: skip
    """The executor's slicing of a call of `size_bytes` with this file's `nchunksperloop`."""
    if protocol not in SLICE_BYTES:
        raise ValueError(f"protocol {protocol!r} is not one of {', '.join(SLICE_BYTES)}")
    if not size_bytes > 0 or chunks_per_loop < 1:
        raise ValueError(f"size {size_bytes} and nchunksperloop {chunks_per_loop} must be positive")
    chunk = size_bytes / chunks_per_loop
    slice_bytes = SLICE_BYTES[protocol]
    iterations = max(1, math.ceil(chunk / slice_bytes))
    last = chunk - (iterations - 1) * slice_bytes
    effective = slice_bytes
    if protocol == "Simple":
        effective = slice_bytes // 4 * _HOST_CHUNK_STEPS.get(Collective(collective), 4)
    allowed = max(1, int(effective // math.ceil(chunk)))
    return Slicing(protocol, chunk, slice_bytes, iterations, last, min(allowed, MAX_ALLOWED_COUNT))


def iterations_to_simulate(sl: Slicing, transfers: int = 0,
                           k_max: int = MAX_ITERATIONS) -> tuple[int, ...]:  # fmt: skip
    """Iteration counts to expand: all of them, or (K, K/2) to extrapolate from. K shrinks
    (down to 2) so that K x `transfers` stays within MAX_EXPANDED transfers."""
    if transfers:
        k_max = max(2, min(k_max, MAX_EXPANDED // transfers))
    if sl.iterations <= k_max:
        return (sl.iterations,)
    return (k_max, k_max // 2)


def extrapolate(times_us: tuple[float, ...], ks: tuple[int, ...], iterations: int) -> float:
    """The call's time from runs of ks iterations (see `iterations_to_simulate`)."""
    if len(ks) == 1:
        return times_us[0]
    (ta, tb), (ka, kb) = times_us, ks
    slope = max(ta - tb, 0.0) / (ka - kb)
    return ta + (iterations - ka) * slope


def unit_size(arrays: ScheduleArrays) -> float:
    """The size at which one chunk of `arrays` is one byte (expanded counts are bytes)."""
    return 1.0 / arrays.chunk_bytes(1.0)


def expand(rb: ReadBack, sl: Slicing, k: int) -> ScheduleArrays:
    """The read-back schedule run for `k` iterations: the first k-1 move full slices, the last
    `sl.last_bytes` per chunk. Transfer j*n + i is transfer i of iteration j."""
    return with_slices(structure(rb, sl, k), rb, sl)


def with_slices(shape: ScheduleArrays, rb: ReadBack, sl: Slicing) -> ScheduleArrays:
    """`shape` (from `structure`) with the bytes `sl` moves per transfer and iteration."""
    timed = _timed(rb)
    n = len(timed.transfers)
    k = len(shape) // max(n, 1)
    its = np.arange(k, dtype=np.int64)
    per_chunk = np.where(its < k - 1, float(sl.slice_bytes), sl.last_bytes)
    base_count = np.fromiter((t.count for t in timed.transfers), dtype=np.float64, count=n)
    if timed is rb.timed and rb.local_traffic is not None:  # payload-equivalent chunks
        base_count[n - len(rb.local_traffic):] *= rb.local_traffic / 2.0
    count = np.maximum(np.rint(per_chunk[:, None] * base_count[None, :]), 1.0)
    return replace(shape, count=count.reshape(-1).astype(np.int32))


def structure(rb: ReadBack, sl: Slicing, k: int) -> ScheduleArrays:
    """The k-iteration schedule's transfers and dependencies (counts: the file's own); it
    depends on the size only through `sl.protocol` and `sl.max_allowed_count`."""
    base = _arrays(rb)
    if k < 1:
        raise ValueError(f"k={k} iterations: at least 1")
    nranks = base.nranks
    tb_base = np.concatenate([[0], np.cumsum(rb.threadblocks)]).astype(np.int64)
    # a local operation is both a send and a receive of its threadblock here
    charged = _timed(rb) is rb.timed
    none = np.zeros(0, dtype=np.int32)
    local_tb = rb.local_tb if charged and rb.local_tb is not None else none
    local_step = rb.local_step if charged and rb.local_step is not None else none
    send_tb = tb_base[base.src] + np.concatenate([rb.send_tb, local_tb])  # unique across gpus
    recv_tb = tb_base[base.dst] + np.concatenate([rb.recv_tb, local_tb])
    ntb = int(tb_base[-1])

    # Last send and last receive of every threadblock in one iteration (-1: none).
    last_send = _last_by(send_tb, np.concatenate([rb.send_step, local_step]), ntb)
    last_recv = _last_by(recv_tb, np.concatenate([rb.recv_step, local_step]), ntb)
    prev = np.stack([last_send[send_tb], last_recv[send_tb]], axis=1)  # per transfer, 2 cols
    # FIFO depth in iterations per connection (src, dst, chan).
    conn = (base.src.astype(np.int64) * nranks + base.dst) * (
        int(base.channel.max()) + 1
    ) + base.channel
    _, conn_id = np.unique(conn, return_inverse=True)
    calls = -(-base.count.astype(np.int64) // sl.max_allowed_count)  # Slicing.calls, per step
    per_conn = np.bincount(conn_id, weights=CHUNK_SLOTS[sl.protocol] * calls).astype(np.int64)
    depth = np.maximum(1, NCCL_STEPS // np.maximum(per_conn, 1))[conn_id]
    ptr, dep = _sliced_deps(base, prev, depth, k)
    out = ScheduleArrays(
        name=f"{base.name} x{k} slices",
        collective=base.collective,
        nranks=nranks,
        chunks_per_rank=base.chunks_per_rank,
        src=np.tile(base.src, k),
        dst=np.tile(base.dst, k),
        chunk=np.tile(base.chunk, k),
        count=np.tile(base.count, k),
        reduce=np.tile(base.reduce, k),
        channel=np.tile(base.channel, k),
        dep_ptr=ptr,
        dep_idx=dep,  # int64 already: not copied
        root=base.root,
        protocol=base.protocol,
        channels=base.channels,
    )
    if hasattr(out, "tb"):  # the simulator's per-threadblock resources (sim/capacity.py)
        # A threadblock sends on one connection (src, dst, chan) and receives on one, and a
        # connection has one threadblock at each end (reader.py refuses two): the connection
        # names both the sending threadblock, as (src, tb), and the receiving one, as (dst, tb).
        sides = _sides(conn_id, send_tb, recv_tb, len(local_tb), ntb)
        out.tb = np.tile(sides, k).astype(np.int32)
    return out


def _sides(conn_id: np.ndarray, send_tb: np.ndarray, recv_tb: np.ndarray, nlocal: int,
           ntb: int) -> np.ndarray:  # fmt: skip
    """`conn_id` with each local operation's entry (the last `nlocal`) replaced: its
    threadblock's receive connection, else its send connection, else an id of its own. A
    transfer's sides are (src, id) and (dst, id) (sim/capacity.py): on a local operation's GPU
    the receive connection's id names the threadblock's receive side (its other side, keyed by
    a connection from another GPU, is used by no send), the send connection's its send side."""
    if not nlocal:
        return conn_id
    out = conn_id.copy()
    sends = len(conn_id) - nlocal
    side = np.full(ntb, -1, dtype=np.int64)
    side[send_tb[:sends]] = conn_id[:sends]
    side[recv_tb[:sends]] = conn_id[:sends]  # the receive side wins
    own = send_tb[sends:]
    out[sends:] = np.where(side[own] >= 0, side[own], int(conn_id.max()) + 1 + own)
    return out


# The last read-backs' transfers as arrays: `structure` is asked for one file at every size.
# Held with the read-back itself, so that the id stays its own; least recently used out first.
_ARRAYS: dict[int, tuple[ReadBack, Schedule, ScheduleArrays, int]] = {}
_ARRAYS_MAX = 4  # kept whatever their size: the files one size times on most rows
# More while small: a 64-rank ReduceScatter times ~7 read-backs a size (with 4, 48 of its 68
# asks built the arrays again); a 512-rank ring file's are hundreds of MB, so 4 there.
_ARRAYS_SMALL_MAX = 16
_ARRAYS_SMALL_BYTES = 64 << 20


def _arrays(rb: ReadBack) -> ScheduleArrays:
    hit = _ARRAYS.pop(id(rb), None)
    timed = _timed(rb)
    if hit is None or hit[0] is not rb or hit[1] is not timed:
        arrays = ScheduleArrays.from_schedule(timed)
        size = sum(a.nbytes for a in _field_values(arrays) if isinstance(a, np.ndarray))
        while _ARRAYS and (len(_ARRAYS) >= _ARRAYS_SMALL_MAX or (
                len(_ARRAYS) >= _ARRAYS_MAX
                and sum(h[3] for h in _ARRAYS.values()) + size > _ARRAYS_SMALL_BYTES)):  # fmt: skip
            _ARRAYS.pop(next(iter(_ARRAYS)))
        hit = (rb, timed, arrays, size)
    _ARRAYS[id(rb)] = hit  # the most recently used last
    return hit[2]


def _field_values(obj: object) -> list[object]:
    """A dataclass's field values."""
    return [getattr(obj, f) for f in getattr(obj, "__dataclass_fields__", ())]


def _timed(rb: ReadBack) -> Schedule:
    """What is timed of a read-back: its sends, then (when charged) its local operations."""
    return rb.timed if CHARGE_LOCAL_STEPS and rb.timed is not None else rb.schedule


# Deps copied at a time by `_sliced_deps`: its temporaries are a few int64 arrays of this many,
# not of all the file's (a 512-rank ring file has 7.5M; docs/synthesis-scale.md, "Session 10:
# the rail rings within 2 GB").
_DEP_BLOCK = 1 << 20


def _sliced_deps(base: ScheduleArrays, prev: np.ndarray, depth: np.ndarray,
                 k: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """dep_ptr and dep_idx of the k-iteration schedule (transfer j*n + i: transfer i of iteration
    j), each transfer's deps ascending and distinct: in iteration j, the file's deps (moved to
    iteration j), after them nothing; before them, from earlier iterations, the threadblock's
    last send and last receive of iteration j-1 (`prev`) and the same transfer `depth`
    iterations back (FIFO room). Those point below j*n and the file's deps at or above it, so
    each transfer's list is the earlier ones sorted, then the file's: no sort over all k*n."""
    n = len(base)
    file_ptr, file_dep = _distinct_rows(base)
    file_per = np.diff(file_ptr)
    missing = np.iinfo(np.int64).max
    per_it: list[np.ndarray] = []  # earlier deps per transfer, sorted, `missing`-padded
    for j in range(k):
        early = np.full((n, 3), missing, dtype=np.int64)
        if j:
            base_j = (j - 1) * n
            for col in range(2):
                early[:, col] = np.where(prev[:, col] >= 0, prev[:, col] + base_j, missing)
            early[:, 2] = np.where(depth <= j, np.arange(n) + (j - depth) * n, missing)
            early.sort(axis=1)
            early[:, 1:][early[:, 1:] == early[:, :-1]] = missing
            early.sort(axis=1)
        per_it.append(early)
    kept = [e != missing for e in per_it]
    counts = np.concatenate([m.sum(axis=1) + file_per for m in kept])
    ptr = np.zeros(n * k + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    dep = np.empty(int(ptr[-1]), dtype=np.int64)
    for j, (early, m) in enumerate(zip(per_it, kept, strict=True)):
        start = ptr[j * n : (j + 1) * n]
        dep[(start[:, None] + np.arange(3))[m]] = early[m]
        # each row's file deps, moved to iteration j, go after its earlier ones: one shift a row
        shift = start + m.sum(axis=1) - file_ptr[:-1]
        for a, b in _row_blocks(file_ptr, _DEP_BLOCK):
            lo, hi = int(file_ptr[a]), int(file_ptr[b])
            at = np.repeat(shift[a:b], file_per[a:b])
            at += np.arange(lo, hi, dtype=np.int64)
            dep[at] = file_dep[lo:hi].astype(np.int64, copy=False) + j * n
    return ptr, dep


def _distinct_rows(base: ScheduleArrays) -> tuple[np.ndarray, np.ndarray]:
    """`base`'s deps as CSR with each row ascending and distinct: its own arrays where they are
    already (the reader's are), else sorted."""
    n, ptr, dep = len(base), base.dep_ptr, base.dep_idx
    if len(dep) < 2:
        return ptr, dep
    up = dep[1:] > dep[:-1]
    inner = ptr[1:-1]
    up[inner[(inner > 0) & (inner < len(dep))] - 1] = True  # a row's first dep starts afresh
    if up.all():
        return ptr, dep
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    key = np.unique(owner * n + dep)
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(key // n, minlength=n), out=out[1:])
    return out, key % n


def _row_blocks(ptr: np.ndarray, per: int) -> list[tuple[int, int]]:
    """Consecutive row ranges covering all rows, each of about `per` entries (at least a row)."""
    n, out, a = len(ptr) - 1, [], 0
    while a < n:
        b = min(max(int(np.searchsorted(ptr, ptr[a] + per, side="right")) - 1, a + 1), n)
        out.append((a, b))
        a = b
    return out


def threadblocks(rb: ReadBack) -> int:
    """Threadblocks the file launches on its busiest gpu (the executor's grid size)."""
    return int(rb.threadblocks.max()) if len(rb.threadblocks) else 0


def _last_by(group: np.ndarray, position: np.ndarray, ngroups: int) -> np.ndarray:
    """Per group: the index of its member with the largest position, -1 when empty."""
    out = np.full(ngroups, -1, dtype=np.int64)
    if len(group):
        order = np.lexsort((position, group))
        last = np.flatnonzero(np.r_[group[order][1:] != group[order][:-1], True])
        out[group[order][last]] = order[last]
    return out


__all__ = ["CHARGE_LOCAL_STEPS", "MAX_EXPANDED", "MAX_ITERATIONS", "SLICE_BYTES", "Slicing",
           "expand", "extrapolate", "iterations_to_simulate", "slicing", "structure",
           "threadblocks", "unit_size", "with_slices"]  # fmt: skip
