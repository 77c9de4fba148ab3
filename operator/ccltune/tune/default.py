"""NCCL's own choice for a call: the baseline every tuned number is compared against.

Algorithm and protocol: model.nccl_default (the cost model's rendition of NCCL's selection) when
that module is present; otherwise NCCL's static selection computed here from the same published
tables (model/cost.py: tuning.cc latencies, LL/LL128/tree bandwidth caps, tree correction).
Resources: NCCL's defaults - NCCL_NTHREADS 512 (LL128: 640), NCCL_BUFFSIZE 4 MiB, P2P transport,
and the channel count its topology search typically finds, reduced for small messages the way
NCCL does (while bytes < channels x threads x per-thread threshold: fewer channels, then fewer
threads; NCCL_*_THREAD_THRESHOLD in comm.h).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..api.cluster import ClusterTopology
from ..api.common import Collective
from ..model.busbw import busbw_factor
from ..model.cost import (
    LL_MAX_BW,
    PER_CH_MAX_RING_LL128_BW,
    PER_CH_MAX_TREE_BW,
    THREAD_THRESHOLD,
    Arch,
    canonical_algorithm,
    canonical_protocol,
    nccl_latency_us,
    nodes_class,
    tree_correction,
)
from .fabric import FabricFacts
from .space import (
    DEFAULT_BUFFSIZE,
    DEFAULT_THREADS,
    LL128_THREADS,
    Config,
    Impl,
    TaskSpace,
    invalid_reason,
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


def _model_pick(collective: Collective, size: int, topo: ClusterTopology | None) -> tuple[str, str] | None:
    if topo is None:
        return None
    try:
        module = importlib.import_module("ccltune.model.nccl_default")
    except ImportError:
        return None
    choice = module.nccl_default(collective, size, topo).choice
    if choice.kind != "nccl" or not choice.algorithm or not choice.protocol:
        return None
    algo = choice.algorithm.lower()
    algo = "pat" if algo == "pat" else canonical_algorithm(algo)
    return algo, canonical_protocol(choice.protocol)


def nccl_default_config(
    collective: Collective,
    size: int,
    facts: FabricFacts,
    space: TaskSpace,
    topo: ClusterTopology | None = None,
) -> DefaultChoice:
    """NCCL's choice as a Config of `space` (so it can be measured like any trial)."""
    impls = [s.impl for s in space.subspaces if s.impl.transport == "p2p"] or [s.impl for s in space.subspaces]
    picked = _model_pick(collective, size, topo)
    source = "model.nccl_default"
    impl: Impl | None = None
    if picked is not None:
        cand = Impl(picked[0], picked[1], "p2p")
        if invalid_reason(collective, cand, facts) is None and cand in impls:
            impl = cand
    if impl is None:
        source = "NCCL static model (tuning.cc tables)"
        nc0 = default_channels(facts)
        impl = min(impls, key=lambda i: (static_time_us(collective, size, i, facts, nc0), i))
    threads = LL128_THREADS if impl.protocol == "LL128" else DEFAULT_THREADS
    channels = default_channels(facts) if impl.algorithm != "p2p" else space.subspace(impl).values[0][0]
    if impl.algorithm != "p2p":
        channels, threads = shrink_resources(size, impl.protocol, channels, threads)
    return DefaultChoice(Config(impl, channels, threads, DEFAULT_BUFFSIZE), source)


__all__ = ["DefaultChoice", "default_channels", "nccl_default_config", "shrink_resources", "static_time_us"]
