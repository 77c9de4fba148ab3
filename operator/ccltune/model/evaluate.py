"""One evaluator for every number a plan compares (docs/cost-model.md, "One evaluator").

NCCL's default, a tuned NCCL choice and an MSCCL schedule are all timed here, by the event
simulator (model/simulate.py) under the same protocol costs, so a speedup never divides numbers
from two models. Every estimate carries the same per-size bound: the lower bound under the most
favourable protocol, which bounds every choice.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Generic, TypeVar, cast

import numpy as np

from ..api.cluster import ClusterTopology
from ..api.common import Collective, Source
from ..api.plan import Choice, Estimate
from .cost.bounds import lower_bound
from .cost.busbw import algbw_gbps, busbw_gbps
from .cost.gpu import gpu_physics
from .cost.protocols import PROTOCOLS, protocol_cost
from .formats.msccl.executor import CHUNK_SLOTS
from .formats.msccl.reader import (
    ReadBack,
    check_protocol,
    file_key,
    protocol_of,
    read_msccl,
    same_file,
)
from .formats.msccl.slicing import (
    SLICE_BYTES,
    Slicing,
    extrapolate,
    iterations_to_simulate,
    slicing,
    structure,
    unit_size,
    with_slices,
)
from .nccl.baselines import SUPPORTED
from .nccl.default import default_estimate, nccl_graph
from .schedule.ir import Schedule, ScheduleArrays
from .sim.routing import Router
from .sim.simulate import simulate
from .sim.symmetric_sim import forget

EVALUATOR = "event simulator"

# The simulator's stand-in schedules for NCCL's algorithm names (nvls/nvls_tree: the
# hierarchical schedule without the in-switch reduction; p2p alltoall: direct sends).
_SCHEDULE_OF = {"p2p": "direct"}


# Bytes the read-back and sliced-structure caches hold (below, `_Cached`): a 512-rank ring
# file's read-back is ~110 MB and a sliced structure of it 70 MB an iteration; a 64-rank file's
# ~2 MB. The read-backs' bound evicts none on the rows measured (rail-512 AllGather with its
# ring file: 335 MB by this count), the structures' holds a ring file's two iterations beside
# the small files' (docs/synthesis-scale.md, "Session 10: the rail rings within 2 GB").
READ_BACK_BYTES = 768 << 20
STRUCTURE_BYTES = 192 << 20
V = TypeVar("V")

# Times within this relative difference are a tie (float noise): a tie never replaces a default.
TIE = 1e-9


def faster(time_us: float, than_us: float) -> bool:
    """Is `time_us` really below `than_us` (not a float-rounding tie)?"""
    return time_us < than_us * (1.0 - TIE)


class NotEvaluable(ValueError):
    """The evaluator has no schedule for this choice (e.g. CollNet, PAT): it cannot be timed."""


def common_bound_us(collective: Collective | str, size_bytes: int, topo: ClusterTopology) -> float:
    """The lower bound at this size under the most favourable protocol."""
    coll = Collective(collective)
    g = nccl_graph(topo)
    return min(
        lower_bound(coll, size_bytes, topo,
                    protocol_cost(p, link_kind=g.intra_kind, arch=g.arch, nnodes=g.nnodes)).time_us
        for p in PROTOCOLS
    )  # fmt: skip


def timed(collective: Collective | str, size_bytes: int, topo: ClusterTopology, time_us: float,
          choice: Choice | None) -> Estimate:  # fmt: skip
    """An estimate of `time_us` from this evaluator, with the common bound."""
    coll = Collective(collective)
    t = max(time_us, 1e-9)
    bound = common_bound_us(coll, size_bytes, topo)
    return Estimate(
        size_bytes=size_bytes, time_us=t, algbw_gbps=algbw_gbps(size_bytes, t),
        busbw_gbps=busbw_gbps(coll, topo.world_size, size_bytes, t), source=Source.SIMULATED,
        bound_us=bound, pct_of_bound=100.0 * bound / t, choice=choice, evaluator=EVALUATOR,
    )  # fmt: skip


def _protocol(name: str | None) -> str:
    for p in PROTOCOLS:
        if p.lower() == (name or "Simple").lower():
            return p
    raise NotEvaluable(f"protocol {name!r} is not one of {', '.join(PROTOCOLS)}")


def nccl_estimate(collective: Collective | str, size_bytes: int, topo: ClusterTopology,
                  choice: Choice | None = None, *, router: Router | None = None) -> Estimate:  # fmt: skip
    """NCCL running `choice` (None: its own default choice). Threads and buffer sizes are not
    modelled by the simulator: two choices differing only there time the same."""
    coll = Collective(collective)
    if choice is not None:
        if choice.kind != "nccl":
            raise NotEvaluable(f"{choice.describe()} is not an NCCL choice")
        algo = (choice.algorithm or "ring").lower()
        if _SCHEDULE_OF.get(algo, algo) not in SUPPORTED[coll] and algo != "p2p":
            raise NotEvaluable(f"the event simulator has no {algo} schedule for {coll.value}")
        choice = choice.model_copy(update={"protocol": _protocol(choice.protocol)})
    est = default_estimate(coll, size_bytes, topo, router=router, with_bound=False, choice=choice)
    return timed(coll, size_bytes, topo, est.time_us, choice or est.choice)


def msccl_estimate(collective: Collective | str, size_bytes: int, topo: ClusterTopology,
                   schedule: Schedule | ScheduleArrays, protocol: str, choice: Choice | None = None,
                   *, router: Router | None = None) -> Estimate:  # fmt: skip
    """An MSCCL schedule run with `protocol` (the synthesis engine's own timing call)."""
    g = nccl_graph(topo)
    cost = protocol_cost(_protocol(protocol), link_kind=g.intra_kind,
                         gpu=gpu_physics(topo.gpu_model))  # fmt: skip
    res = simulate(schedule, topo, size_bytes, cost, router, engine="symmetric")
    return timed(collective, size_bytes, topo, res.time_us, choice)


class _Cached(Generic[V]):
    """`fn`'s results for the arguments last asked, least recently used out first: at most
    `entries` of them and `max_bytes` as `size` counts them (the newest is kept whatever its
    size). Bounded by bytes because one 512-rank file's entries are 10^3 times a small file's
    (docs/synthesis-scale.md, "Session 10: the rail rings within 2 GB"). Keyed by the first
    `keyed` arguments (all: None); the rest are not held."""

    def __init__(self, fn: Callable[..., V], size: Callable[[V], int], entries: int,
                 max_bytes: int, keyed: int | None = None) -> None:  # fmt: skip
        self._fn, self._size, self.entries, self.max_bytes = fn, size, entries, max_bytes
        self._keyed = keyed
        self._held: OrderedDict[tuple[object, ...], tuple[V, int]] = OrderedDict()
        self.held_bytes = 0

    def __call__(self, *args: object) -> V:
        key = args[: self._keyed]
        hit = self._held.get(key)
        if hit is not None:
            self._held.move_to_end(key)
            return hit[0]
        value = self._fn(*args)
        self._held[key] = (value, self._size(value))
        self.held_bytes += self._held[key][1]
        while len(self._held) > 1 and (len(self._held) > self.entries
                                       or self.held_bytes > self.max_bytes):  # fmt: skip
            gone, (_, size) = self._held.popitem(last=False)
            self.held_bytes -= size
            self._evicted(gone)
        return value

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: tuple[object, ...]) -> bool:
        return key in self._held

    def drop(self, where: Callable[[tuple[object, ...]], bool]) -> None:
        """Let the entries whose key `where` holds for go."""
        for key in [k for k in self._held if where(k)]:
            self.held_bytes -= self._held.pop(key)[1]
            self._evicted(key)

    def _evicted(self, key: tuple[object, ...]) -> None:
        """An entry was let go (for what is held with it)."""

    def cache_clear(self) -> None:
        self.drop(lambda _: True)


def _arrays_bytes(arrays: ScheduleArrays) -> int:
    return sum(a.nbytes for a in _fields_of(arrays) if isinstance(a, np.ndarray))


def _read_back_bytes(rb: ReadBack) -> int:
    # ~200 B a transfer object and 8 a dep, measured by tracemalloc on the 512-rank ring file
    # (261,632 transfers, 7.5M deps: 110 MB); its arrays as they are
    transfers = (rb.timed or rb.schedule).transfers
    return 200 * len(transfers) + 8 * sum(len(t.deps) for t in transfers) + sum(
        a.nbytes for a in _fields_of(rb) if isinstance(a, np.ndarray))  # fmt: skip


def _fields_of(obj: object) -> list[object]:
    return [getattr(obj, f.name) for f in fields(obj)]  # type: ignore[arg-type]


class _ReadBacks(_Cached[ReadBack]):
    """Called with (file_key, text): the file's read-back, one whatever its protocol (the
    first read's: the protocol changes only the order the executor completes the steps in,
    hence the transfers' numbering, which no simulated time depends on), once the file's run
    under this protocol is checked (reader.check_protocol: a deadlock is still found). A
    second read-back per protocol was ~110 MB and its arrays ~70 MB on a 512-rank ring file
    (docs/synthesis-scale.md, "Session 12: one read-back per file")."""

    def __init__(self) -> None:
        super().__init__(lambda file, key, text: read_msccl(text, key), _read_back_bytes,
                         entries=64, max_bytes=READ_BACK_BYTES, keyed=1)  # fmt: skip
        self._ran: dict[object, set[str | None]] = {}  # per file held: the protocols run
        self._most: dict[object, int] = {}  # per file held: its largest transfer count

    def __call__(self, *args: object) -> ReadBack:
        key, text = cast(tuple[str, int, bytes], args[0]), cast(str, args[1])
        file, proto = same_file(key), protocol_of(key)
        ran = self._ran.get(file) if (file,) in self else None
        if ran is not None and proto not in ran:
            check_protocol(text, key)
            ran.add(proto)
        rb = super().__call__(file, key, text)
        if file not in self._ran:
            self._ran[file] = {proto}
            self._most[file] = max((t.count for t in (rb.timed or rb.schedule).transfers),
                                   default=1)  # fmt: skip
        return rb

    def largest_count(self, file: object) -> int:
        """The largest count of a transfer of `file`'s read-back (held)."""
        return self._most[file]

    def _evicted(self, key: tuple[object, ...]) -> None:
        # a structure of another read-back of the file may number its transfers otherwise
        self._ran.pop(key[0], None)
        self._most.pop(key[0], None)
        _structure.drop(lambda k: k[0] == key[0])


# Read-backs by file (a file is timed at many sizes and protocols: reading it is most of its
# cost) and their sliced structures (`_Structures`). The file is named by `file_key` without
# its protocol, not its text: the engine passes a new copy of a text for each protocol but its
# own, and a key held one copy per entry (rail-512 ReduceScatter: ~5 of its ring's 58 MB;
# docs/synthesis-scale.md, "Session 11: the rail-512 rings").
_read_back = _ReadBacks()


def _sliced_structure(file: object, slots: int, max_allowed_count: int, k: int,
                      key: tuple[str, int, bytes], protocol: str,
                      xml_text: str) -> ScheduleArrays:  # fmt: skip
    # what a size changes beyond the bytes (slicing.structure); the bytes are set per call
    sl = Slicing(protocol, 0.0, SLICE_BYTES[protocol], k, 0.0, max_allowed_count)
    return structure(_read_back(key, xml_text), sl, k)


class _Structures(_Cached[ScheduleArrays]):
    """Called with (file_key, protocol, max_allowed_count, k, text): the sliced structure of
    the file's read-back, one per (file, FIFO slots a primitive call takes, max_allowed_count
    up to the file's largest count, k). `slicing.structure` depends on the protocol only
    through those slots (LL and LL128: 1) and on max_allowed_count only through each step's
    calls, ceil(count / max_allowed_count): 1 for every step from its largest count up (a
    rail-ring file's steps move one chunk each: one structure per k and slot count)."""

    def __init__(self) -> None:
        super().__init__(_sliced_structure, _arrays_bytes, entries=16,
                         max_bytes=STRUCTURE_BYTES, keyed=4)  # fmt: skip

    def __call__(self, *args: object) -> ScheduleArrays:
        key, protocol = cast(tuple[str, int, bytes], args[0]), cast(str, args[1])
        allowed, k, text = cast(int, args[2]), cast(int, args[3]), cast(str, args[4])
        file = same_file(key)
        _read_back(key, text)  # held (and this protocol checked) before its count is asked
        allowed = min(allowed, _read_back.largest_count(file))
        return super().__call__(file, CHUNK_SLOTS[protocol], allowed, k, key, protocol, text)


_structure = _Structures()


def published_estimate(collective: Collective | str, size_bytes: int, topo: ClusterTopology,
                       xml_text: str, choice: Choice | None = None,
                       *, router: Router | None = None,
                       give_up_at: float = math.inf) -> Estimate:  # fmt: skip
    """An MSCCL file as published, read back and run as the executor runs it: its threadblocks
    run their steps in order, once per slice of every chunk (formats/msccl/slicing.py), which
    the synthesis engine's schedule does not charge. `give_up_at`: raise Slower (sim/simulate)
    once the time is known to be at least that."""
    key = file_key(xml_text)
    rb = _read_back(key, xml_text)  # its protocol may be another's: the file's is the key's
    sl = slicing(str(protocol_of(key)), size_bytes, rb.chunks_per_loop, collective)
    # The executor's kernels run on the GPU's threadblocks like NCCL's (cost/gpu.py); its launch
    # is charged as NCCL's ring kernel's (baseLat): MSCCL has no latency table of its own.
    g = nccl_graph(topo)
    cost = protocol_cost(_protocol(sl.protocol), link_kind=g.intra_kind,
                         gpu=gpu_physics(topo.gpu_model))  # fmt: skip
    ks = iterations_to_simulate(sl, len(rb.schedule.transfers))
    # the protocol's floor bounds the whole call, not the runs it is extrapolated from
    runs = replace(cost, floor_us=0.0)
    times = []
    for k in ks:
        shape = _structure(key, sl.protocol, sl.max_allowed_count, k, xml_text)
        arrays = with_slices(shape, rb, sl)
        try:
            # The first run only: the time is at least its (extrapolate's slope is >= 0).
            res = simulate(arrays, topo, unit_size(arrays), runs, router, engine="symmetric",
                           give_up_at=give_up_at if k == ks[0] else math.inf)  # fmt: skip
        finally:
            forget(arrays)  # a new schedule each call: its quotient is never asked for again
        times.append(res.time_us)
    t = max(extrapolate(tuple(times), ks, sl.iterations), cost.floor_us)
    return timed(collective, size_bytes, topo, t, choice)


__all__ = ["EVALUATOR", "TIE", "NotEvaluable", "common_bound_us", "faster", "msccl_estimate",
           "nccl_estimate", "published_estimate", "timed"]  # fmt: skip
