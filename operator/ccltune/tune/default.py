"""NCCL's own choice for a call: the baseline every tuned number is compared against.

Algorithm, protocol, channels and threads: model.nccl_default (the cost model's rendition of NCCL's
selection) when it covers every algorithm the fabric offers; it leaves out NVLS and CollNet, so on
fabrics where those are valid (and when that module is missing) NCCL's static selection computed
here from the same published tables decides (model/cost.py: tuning.cc latencies, LL/LL128/tree
bandwidth caps, tree correction).
Resources: NCCL's defaults - NCCL_NTHREADS 512 (LL128: 640), NCCL_BUFFSIZE 4 MiB, P2P transport,
and the channel count its topology search typically finds, reduced for small messages the way
NCCL does (while bytes < channels x threads x per-thread threshold: fewer channels, then fewer
threads; NCCL_*_THREAD_THRESHOLD in comm.h).
The same static model, applied to every implementation subspace, is the searchers' prior
(`nccl_prior`): NCCL's own ranking of the implementations.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..api.cluster import ClusterTopology
from ..api.common import Collective
from ..model.cost.busbw import busbw_factor
from ..model.cost.protocols import (
    LL_MAX_BW,
    PER_CH_MAX_RING_LL128_BW,
    PER_CH_MAX_TREE_BW,
    THREAD_THRESHOLD,
    Arch,
    canonical_algorithm,
    canonical_protocol,
    nccl_latency_us,
    nodes_class,
    nvls_channels,
    tree_correction,
)
from .fabric import FabricFacts
from .searchers.prior import Prior
from .space import (
    DEFAULT_BUFFSIZE,
    DEFAULT_THREADS,
    LL128_THREADS,
    THREADS,
    Config,
    Impl,
    TaskSpace,
    invalid_reason,
    is_msccl,
)


def default_channels(facts: FabricFacts) -> int:
    """Channels NCCL's topology search usually builds (assumption per fabric; docs/tuning.md)."""
    if facts.nvswitch:
        return 32 if facts.arch in ("hopper", "blackwell") else 16
    if facts.intra_kind in ("nvlink", "xgmi"):
        return 16 if facts.intra_kind == "xgmi" else 8
    return 2


def _arch(facts: FabricFacts) -> Arch:
    return {"volta": Arch.VOLTA, "hopper": Arch.HOPPER, "blackwell": Arch.HOPPER}.get(facts.arch, Arch.AMPERE)


def static_time_us(collective: Collective, size: int, impl: Impl, facts: FabricFacts, channels: int) -> float:
    """NCCL's static estimate (tuning.cc shape): latency + bytes / modelled bus bandwidth."""
    nc = channels
    per_ch = facts.intra_gbps / max(default_channels(facts), 1)
    if facts.nodes > 1:
        per_ch = min(per_ch, facts.net_gbps_per_node / max(default_channels(facts), 1))
    bw = nc * per_ch
    algo, proto = impl.algorithm, impl.protocol
    cls = nodes_class(facts.nodes)
    arch = _arch(facts)
    if algo == "tree":
        bw = min(bw * 0.92, nc * PER_CH_MAX_TREE_BW[arch][cls]) * tree_correction(proto, size)
    elif algo in ("nvls", "nvls_tree"):
        bw = facts.intra_gbps * 0.85 * (1.25 if collective == Collective.ALLREDUCE else 1.0)
    elif algo.startswith("collnet"):
        bw = bw * 0.9
    if proto == "LL":
        share = 0.25 if (facts.nodes > 1 or collective == Collective.ALLREDUCE) else 1 / 3
        bw = min(LL_MAX_BW[arch.value][cls], bw * share)
    elif proto == "LL128":
        bw = min(bw * (0.92 if facts.gpus_per_node >= 8 else 0.7), nc * PER_CH_MAX_RING_LL128_BW[arch][cls])
    if algo in ("pat", "p2p"):
        lat = nccl_latency_us("ring", proto, "nvlink", facts.ranks, facts.nodes, collective=str(collective))
    else:
        link = "pcie" if facts.intra_kind == "pcie" else "nvlink"
        lat = nccl_latency_us(algo, proto, link, facts.ranks, facts.nodes, collective=str(collective))
    factor = busbw_factor(collective, facts.ranks) if facts.ranks > 1 else 1.0
    return lat + size * factor / (max(bw, 1e-6) * 1e3)


def shrink_resources(size: int, protocol: str, channels: int, threads: int) -> tuple[int, int]:
    """NCCL's small-message reduction of channels, then threads (enqueue.cc getAlgoInfo)."""
    threshold = THREAD_THRESHOLD[protocol]
    nc, nt = channels, threads
    while size < nc * nt * threshold:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0 and nt > 64:
            nt //= 2
        else:
            break
    return nc, nt


@dataclass(frozen=True)
class DefaultChoice:
    config: Config
    source: str  # which model picked the algorithm/protocol


_UNMODELLED = ("nvls", "nvls_tree", "collnet_direct", "collnet_chain")  # not in model.nccl_default


def _model_pick(collective: Collective, size: int, topo: ClusterTopology | None) -> Config | None:
    """model.nccl_default's choice (algorithm, protocol, channels, threads), when it is available."""
    if topo is None:
        return None
    try:
        module = importlib.import_module("ccltune.model.nccl.default")
        choice = module.nccl_default(collective, size, topo).choice
    except (ImportError, ValueError):
        return None
    if choice.kind != "nccl" or not choice.algorithm or not choice.protocol:
        return None
    algo = choice.algorithm.lower()
    try:
        algo = algo if algo in ("pat", "p2p") else canonical_algorithm(algo)
        proto = canonical_protocol(choice.protocol)
    except ValueError:
        return None
    if proto == "LL128":
        threads = LL128_THREADS
    else:  # the model counts NCCL's extra Simple warp(s); NCCL_NTHREADS is the base count
        threads = max([t for t in THREADS if t <= (choice.threads or DEFAULT_THREADS)] or [THREADS[0]])
    channels = choice.channels or 1
    return Config(Impl(algo, proto, "p2p"), channels, threads, DEFAULT_BUFFSIZE)


def nccl_default_config(
    collective: Collective,
    size: int,
    facts: FabricFacts,
    space: TaskSpace,
    topo: ClusterTopology | None = None,
) -> DefaultChoice:
    """NCCL's choice as a Config (measured like any trial).

    model.nccl_default decides when it covers every algorithm the fabric offers; it does not model
    NVLS or CollNet, so where those are valid NCCL's static selection here (which has them) decides.
    """
    impls = [s.impl for s in space.subspaces if s.impl.transport == "p2p"] or [s.impl for s in space.subspaces]
    if not any(i.algorithm in _UNMODELLED for i in impls):
        picked = _model_pick(collective, size, topo)
        if picked is not None and picked.impl.algorithm == "p2p":
            picked = Config(Impl("p2p", "Simple", "p2p"), space.subspace(Impl("p2p", "Simple")).values[0][0],
                            picked.threads, DEFAULT_BUFFSIZE)
        if picked is not None and invalid_reason(collective, picked.impl, facts) is None and picked.impl in impls:
            return DefaultChoice(picked, "model.nccl_default")
    nc0 = default_channels(facts)
    impl = min(impls, key=lambda i: (static_time_us(collective, size, i, facts, nc0), i))
    if impl.algorithm in ("nvls", "nvls_tree"):
        nc0 = nvls_channels(facts.arch, facts.nodes)  # NVLS has its own CTA count (model/cost.py)
    threads = LL128_THREADS if impl.protocol == "LL128" else DEFAULT_THREADS
    channels = nc0 if impl.algorithm != "p2p" else space.subspace(impl).values[0][0]
    if impl.algorithm != "p2p":
        channels, threads = shrink_resources(size, impl.protocol, channels, threads)
    return DefaultChoice(Config(impl, channels, threads, DEFAULT_BUFFSIZE), "NCCL static model (tuning.cc tables)")


def nearest_replayed(
    collective: Collective, size: int, config: Config, space: TaskSpace, facts: FabricFacts
) -> Config | None:
    """Stand-in for a configuration a replayed table lacks: the same implementation nearest in
    channels; without one, the table's configuration NCCL's static model ranks first."""
    same = [c for c in space if c.impl == config.impl]
    if same:
        return min(same, key=lambda c: (abs(c.channels - config.channels), c))
    if len(space) == 0:
        return None
    return min(space, key=lambda c: (static_time_us(collective, size, c.impl, facts, c.channels), c))


def nccl_prior(collective: Collective, size: int, facts: FabricFacts, space: TaskSpace) -> Prior:
    """NCCL's static estimate of every subspace, at the channels its topology search builds.

    Deliberately not the simulated surface: the benchmarks measure the searchers against it."""
    nc0 = default_channels(facts)
    # MSCCL variants are not in NCCL's model: no prediction, so visit_order never prunes them.
    predicted = {s.impl: static_time_us(collective, size, s.impl, facts, nc0) for s in space.subspaces
                 if not is_msccl(s.impl.algorithm)}
    return Prior(predicted, "NCCL static model (tuning.cc tables)")


__all__ = [
    "DefaultChoice",
    "default_channels",
    "nccl_default_config",
    "nccl_prior",
    "nearest_replayed",
    "shrink_resources",
    "static_time_us",
]
