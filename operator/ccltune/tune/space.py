"""The search space: NCCL's knobs, which combinations NCCL can run, and how they split in two.

Implementation parameters (algorithm x protocol x transport) form subspaces; resource parameters
(channels, threads, buffer size) are searched inside each (AutoCCL, NSDI'25, section 4).

Validity rules, from NCCL's documentation and release notes (cited per rule below):
- NCCL_ALGO values Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT; Tree, NVLSTree and
  CollnetChain implement AllReduce only; Broadcast/Reduce run on Ring only; AllGather and
  ReduceScatter on Ring, NVLS, CollnetDirect and PAT (NCCL env docs, NCCL_ALGO).
- NVLS / NVLSTree need NVSwitch with NVLink SHARP, i.e. Hopper or newer (NCCL 2.17/2.18 notes).
- CollNet needs in-network reduction (SHARP) on the scale-out network and >1 node;
  CollnetDirect supports at most 8 GPUs per node (NCCL enqueue.cc comment).
- PAT (NCCL 2.23) runs AllGather/ReduceScatter with one GPU per node.
- NVLS, CollNet and PAT use the Simple protocol only. LL128 is enabled by default only on NVLink
  platforms; NCCL warns that forcing it elsewhere can corrupt data (NCCL_PROTO docs), so ccltune
  never proposes it there. NCCL_NTHREADS takes 64, 128, 256 or 512 and applies to Simple and LL
  (LL128 has its own thread count); NCCL_BUFFSIZE (default 4 MiB) sizes the Simple buffers.
- Channels are 1..32 (MAXCHANNELS); the tuner plugin must be given an explicit count.
- AllToAll runs on NCCL's point-to-point path (no algorithm/protocol choice; the tuner plugin is
  not consulted); only transport, threads and buffer size apply.

The schedule dimension (TuCCL's joint space): for runtimes that run MSCCL (msccl-executor-nccl,
RCCL), candidate MSCCL schedule variants are implementations next to NCCL's algorithms, named
`msccl:<schedule>`, with protocol, channels and instances as their parameters. A variant states
the protocols, channel counts, instance counts and sizes it exists for (`ScheduleVariant`);
channels x instances threadblock channels must stay within MAXCHANNELS (msccl-executor-nccl
src/include/device.h, via model.msccl_limits). Categorical dimensions (algorithm or schedule,
protocol, transport) are subspaces; only ordered numbers (channels, threads, buffer, instances)
form the resource grid searched inside them, so no searcher depends on the order variants are
listed in (docs/tuning.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..api.common import Collective
from ..api.errors import InputError
from ..model.formats.msccl.limits import MAX_CHANNELS as MSCCL_MAX_CHANNELS
from .fabric import FabricFacts

ALGOS_BY_COLLECTIVE: dict[Collective, tuple[str, ...]] = {
    Collective.ALLREDUCE: ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain"),
    Collective.ALLGATHER: ("ring", "nvls", "collnet_direct", "pat"),
    Collective.REDUCESCATTER: ("ring", "nvls", "collnet_direct", "pat"),
    Collective.BROADCAST: ("ring",),
    Collective.ALLTOALL: ("p2p",),
}
PROTOCOLS = ("LL", "LL128", "Simple")
SIMPLE_ONLY = {"nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat", "p2p"}
# First NCCL release that knows the algorithm (release notes).
MIN_VERSION: dict[str, tuple[int, int]] = {
    "ring": (2, 0),
    "tree": (2, 4),
    "collnet_direct": (2, 14),
    "collnet_chain": (2, 14),
    "nvls": (2, 17),
    "nvls_tree": (2, 18),
    "pat": (2, 23),
    "p2p": (2, 0),
}
# Names NCCL_ALGO accepts (case-insensitive) for our algorithm ids.
NCCL_ALGO_NAME = {
    "ring": "ring",
    "tree": "tree",
    "nvls": "nvls",
    "nvls_tree": "nvlstree",
    "collnet_direct": "collnetdirect",
    "collnet_chain": "collnetchain",
    "pat": "pat",
}

CHANNELS = (1, 2, 4, 8, 12, 16, 24, 32)
THREADS = (64, 128, 256, 512)
LL128_THREADS = 640  # NCCL_LL128_MAX_NTHREADS; NCCL_NTHREADS does not apply to LL128
BUFFSIZES = (512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20)
DEFAULT_BUFFSIZE = 4 << 20  # NCCL_BUFFSIZE default (NCCL env docs)
DEFAULT_THREADS = 512
TRANSPORTS = ("p2p", "shm")
MSCCL_PREFIX = "msccl:"
MSCCL_RUNTIMES = ("msccl", "rccl")  # spec.publish.runtime values whose runtime runs MSCCL files
MSCCL_INSTANCES = (1, 2, 4, 8)


def is_msccl(algorithm: str) -> bool:
    return algorithm.startswith(MSCCL_PREFIX)


def msccl_algorithm(schedule: str) -> str:
    return MSCCL_PREFIX + schedule


@dataclass(frozen=True)
class ScheduleVariant:
    """A candidate MSCCL schedule for one collective and what it exists for.

    `channels`: channel counts the schedule was generated with; `instances`: replication counts
    the runtime may run it with; `min_bytes`/`max_bytes`: the sizes it is selected for
    (msccl-executor's minBytes/maxBytes, max 0 = unbounded)."""

    name: str
    collective: Collective
    protocols: tuple[str, ...] = PROTOCOLS
    channels: tuple[int, ...] = (1,)
    instances: tuple[int, ...] = MSCCL_INSTANCES
    min_bytes: int = 0
    max_bytes: int = 0

    @property
    def algorithm(self) -> str:
        return msccl_algorithm(self.name)

    def covers(self, size: int) -> bool:
        return self.min_bytes <= size and (self.max_bytes == 0 or size <= self.max_bytes)


def parse_version(text: str) -> tuple[int, int]:
    parts = text.strip().split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise InputError(f"nccl_version: {text!r} is not a version like 2.24 or 2.21.5") from None
    return major, minor


@dataclass(frozen=True, slots=True, order=True)
class Impl:
    """An implementation subspace: how the collective runs (AutoCCL's implementation params)."""

    algorithm: str
    protocol: str
    transport: str = "p2p"

    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}/{self.transport}"


Point = tuple[int, ...]  # one value per DIMS entry


@dataclass(frozen=True, slots=True, order=True)
class Config:
    impl: Impl
    channels: int
    threads: int
    buffsize: int
    instances: int = 1  # MSCCL: copies of the schedule's channels; NCCL: always 1

    @property
    def point(self) -> Point:
        return (self.channels, self.threads, self.buffsize, self.instances)

    def label(self) -> str:
        text = f"{self.impl.label()} {self.channels}ch {self.threads}t {self.buffsize >> 10}K"
        return text + (f" x{self.instances}" if is_msccl(self.impl.algorithm) else "")


DIMS = ("channels", "threads", "buffsize", "instances")


@dataclass(frozen=True)
class Subspace:
    """One implementation and the resource grid searched inside it.

    `points` restricts the grid to the points that exist (a replayed table); None = full grid.
    """

    impl: Impl
    values: tuple[tuple[int, ...], ...]  # one sorted tuple per DIMS entry
    points: frozenset[Point] | None = None

    def __post_init__(self) -> None:
        if len(self.values) == len(DIMS) - 1:  # NCCL grids may omit instances (always 1)
            object.__setattr__(self, "values", (*self.values, (1,)))
            if self.points is not None:
                object.__setattr__(self, "points", frozenset((*p, 1) if len(p) == 3 else p for p in self.points))

    def __iter__(self) -> Iterator[Config]:
        for point in itertools.product(*self.values):
            if self.points is None or point in self.points:
                yield Config(self.impl, *point)

    def __len__(self) -> int:
        if self.points is not None:
            return len(self.points)
        return math.prod(len(v) for v in self.values)

    def contains(self, point: Point) -> bool:
        if len(point) == len(DIMS) - 1:
            point = (*point, 1)
        if self.points is not None:
            return point in self.points
        return all(v in vals for v, vals in zip(point, self.values, strict=True))

    def config(self, point: Point) -> Config:
        return Config(self.impl, *point)


@dataclass(frozen=True)
class TaskSpace:
    collective: Collective
    subspaces: tuple[Subspace, ...]
    notes: tuple[str, ...] = field(default=())

    def __iter__(self) -> Iterator[Config]:
        for sub in self.subspaces:
            yield from sub

    def __len__(self) -> int:
        return sum(len(s) for s in self.subspaces)

    def subspace(self, impl: Impl) -> Subspace:
        for sub in self.subspaces:
            if sub.impl == impl:
                return sub
        raise KeyError(impl.label())


def invalid_reason(
    collective: Collective, impl: Impl, facts: FabricFacts, version: tuple[int, int] = (2, 24)
) -> str | None:
    """Why NCCL cannot run `impl` for this collective on this fabric, or None when it can."""
    algo, proto = impl.algorithm, impl.protocol
    if is_msccl(algo):
        return _msccl_reason(impl, facts)
    if algo not in ALGOS_BY_COLLECTIVE[collective]:
        return f"{algo} does not implement {collective}"
    if proto not in PROTOCOLS:
        return f"unknown protocol {proto}"
    if version < MIN_VERSION[algo]:
        return f"{algo} needs NCCL >= {MIN_VERSION[algo][0]}.{MIN_VERSION[algo][1]}"
    if algo in SIMPLE_ONLY and proto != "Simple":
        return f"{algo} runs with the Simple protocol only"
    if proto == "LL128" and not (facts.vendor == "nvidia" and facts.intra_kind == "nvlink"):
        return "LL128 is only safe on NVLink platforms"
    if impl.transport not in TRANSPORTS:
        return f"unknown transport {impl.transport}"
    if impl.transport == "shm" and not (facts.intra_kind == "pcie" and facts.gpus_per_node > 1):
        return "the SHM transport is only an option between PCIe-attached GPUs of a node"
    if algo in ("nvls", "nvls_tree"):
        if not facts.nvls:
            return f"{algo} needs NVSwitch with NVLink SHARP (Hopper or newer)"
        if facts.gpus_per_node < 2:
            return f"{algo} needs several GPUs per node"
        if algo == "nvls_tree" and facts.nodes < 2:
            return "nvls_tree needs more than one node"
        if algo == "nvls" and facts.nodes > 1 and not (collective == Collective.ALLREDUCE and facts.sharp):
            return "multi-node nvls needs CollNet (SHARP) for allreduce"
    if algo.startswith("collnet"):
        if not facts.sharp:
            return f"{algo} needs in-network reduction (SHARP) on the network"
        if facts.nodes < 2:
            return f"{algo} needs more than one node"
        if algo == "collnet_direct" and facts.gpus_per_node > 8:
            return "collnet_direct supports at most 8 GPUs per node"
    if algo == "pat" and (facts.gpus_per_node != 1 or facts.nodes < 2):
        return "pat needs one GPU per node"
    if algo == "tree" and facts.ranks < 2:
        return "tree needs two ranks"
    return None


def _msccl_reason(impl: Impl, facts: FabricFacts) -> str | None:
    if not impl.algorithm[len(MSCCL_PREFIX):]:
        return "an MSCCL variant needs a schedule name (msccl:<name>)"
    if impl.protocol not in PROTOCOLS:
        return f"unknown protocol {impl.protocol}"
    if impl.protocol == "LL128" and not (facts.vendor == "nvidia" and facts.intra_kind == "nvlink"):
        return "LL128 is only safe on NVLink platforms"
    if impl.transport != "p2p":
        return "MSCCL schedules run on the P2P transport"
    return None


def variant_reason(variant: ScheduleVariant, collective: Collective, protocol: str, facts: FabricFacts,
                   size: int | None = None) -> str | None:  # fmt: skip
    """Why this variant cannot run `protocol` for this call, or None when it can."""
    if variant.collective != collective:
        return f"{variant.algorithm} implements {variant.collective}, not {collective}"
    if protocol not in variant.protocols:
        return f"{variant.algorithm} was not generated for {protocol}"
    if size is not None and not variant.covers(size):
        return f"{variant.algorithm} is not selected for {size} bytes"
    return _msccl_reason(Impl(variant.algorithm, protocol), facts)


def variant_subspace(variant: ScheduleVariant, protocol: str) -> Subspace | None:
    """The variant's grid: its channel and instance counts within MAXCHANNELS threadblock channels."""
    threads = LL128_THREADS if protocol == "LL128" else DEFAULT_THREADS
    points = frozenset((c, threads, DEFAULT_BUFFSIZE, i) for c in variant.channels for i in variant.instances
                       if c * i <= MSCCL_MAX_CHANNELS)  # fmt: skip
    if not points:
        return None
    values = (tuple(sorted({p[0] for p in points})), (threads,), (DEFAULT_BUFFSIZE,),
              tuple(sorted({p[3] for p in points})))
    return Subspace(Impl(variant.algorithm, protocol), values, points)


def resource_values(impl: Impl) -> tuple[tuple[int, ...], ...]:
    channels: tuple[int, ...] = CHANNELS
    threads: tuple[int, ...] = (LL128_THREADS,) if impl.protocol == "LL128" else THREADS
    buffs: tuple[int, ...] = BUFFSIZES if impl.protocol == "Simple" else (DEFAULT_BUFFSIZE,)
    if impl.algorithm == "p2p":
        channels = (CHANNELS[-1],)  # p2p channels are NCCL's own; not a tunable here
    return channels, threads, buffs, (1,)


def build_space(
    collective: Collective,
    facts: FabricFacts,
    version: tuple[int, int] = (2, 24),
    *,
    algorithms: Sequence[str] | None = None,
    protocols: Sequence[str] | None = None,
    variants: Sequence[ScheduleVariant] = (),
    runtime: str = "nccl",
    size: int | None = None,
) -> TaskSpace:
    """Every valid subspace for the collective on this fabric (optionally restricted), plus the
    MSCCL variants valid for it when the runtime runs MSCCL (at `size`, when given)."""
    subs: list[Subspace] = []
    notes: list[str] = []
    for algo in ALGOS_BY_COLLECTIVE[collective]:
        if algorithms is not None and algo not in algorithms:
            continue
        for proto in PROTOCOLS:
            if protocols is not None and proto not in protocols:
                continue
            for transport in TRANSPORTS:
                impl = Impl(algo, proto, transport)
                if invalid_reason(collective, impl, facts, version) is None:
                    subs.append(Subspace(impl, resource_values(impl)))
    if not subs:
        raise ValueError(f"no NCCL configuration can run {collective} on this fabric")
    if variants and runtime not in MSCCL_RUNTIMES:
        notes.append(f"{len(variants)} MSCCL variants left out: runtime {runtime} does not run MSCCL")
    elif variants:
        seen: set[Impl] = set()
        for variant in variants:
            for proto in PROTOCOLS:
                if protocols is not None and proto not in protocols:
                    continue
                reason = variant_reason(variant, collective, proto, facts, size)
                sub = variant_subspace(variant, proto) if reason is None else None
                if sub is None or sub.impl in seen:
                    if reason is not None and proto in variant.protocols and variant.collective == collective:
                        notes.append(f"{variant.algorithm}/{proto} left out: {reason}")
                    continue
                seen.add(sub.impl)
                subs.append(sub)
    return TaskSpace(collective, tuple(subs), tuple(notes))


def _resource_reason(config: Config) -> str | None:
    if not 1 <= config.channels <= CHANNELS[-1]:
        return f"channels {config.channels} outside 1..{CHANNELS[-1]} (MAXCHANNELS)"
    if config.instances < 1:
        return f"instances {config.instances} must be at least 1"
    if not is_msccl(config.impl.algorithm) and config.instances != 1:
        return "instances apply to MSCCL schedules only"
    if config.channels * config.instances > MSCCL_MAX_CHANNELS:
        return f"{config.channels} channels x {config.instances} instances exceed MAXCHANNELS {MSCCL_MAX_CHANNELS}"
    if config.impl.protocol == "LL128":
        if config.threads != LL128_THREADS:
            return f"LL128 runs {LL128_THREADS} threads, not {config.threads}"
    elif config.threads not in THREADS:
        return f"threads {config.threads} not one of {THREADS} (NCCL_NTHREADS)"
    if config.buffsize < 1 or config.buffsize & (config.buffsize - 1):
        return f"buffer size {config.buffsize} is not a power of two"
    return None


def check_config(
    collective: Collective, config: Config, facts: FabricFacts, version: tuple[int, int] = (2, 24)
) -> None:
    """Raise ValueError when `config` is not something NCCL can run (used before emitting)."""
    reason = invalid_reason(collective, config.impl, facts, version)
    if reason is None:
        reason = _resource_reason(config)
    if reason is not None:
        raise ValueError(f"{collective} {config.label()}: {reason}")


__all__ = [
    "ALGOS_BY_COLLECTIVE",
    "BUFFSIZES",
    "CHANNELS",
    "DEFAULT_BUFFSIZE",
    "DEFAULT_THREADS",
    "DIMS",
    "MSCCL_INSTANCES",
    "MSCCL_PREFIX",
    "MSCCL_RUNTIMES",
    "NCCL_ALGO_NAME",
    "PROTOCOLS",
    "THREADS",
    "Config",
    "Impl",
    "Point",
    "ScheduleVariant",
    "Subspace",
    "TaskSpace",
    "build_space",
    "check_config",
    "invalid_reason",
    "is_msccl",
    "msccl_algorithm",
    "parse_version",
    "variant_reason",
    "variant_subspace",
]
