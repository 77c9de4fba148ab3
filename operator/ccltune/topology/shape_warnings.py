"""Cluster shapes that plan fine but cost something at run time: one line each, saying what.

Sources (NCCL v2.30.7-1 and msccl-executor-nccl c6f6b36, as vendored by the conformance kit):
- msccl-executor-nccl src/misc/msccl/msccl_lifecycle.cc mscclInternalSchedulerSelectAlgo runs an
  algorithm file only when (count x sizeMultiplier) % nchunksperloop == 0 (sizeMultiplier 1 for
  allreduce and broadcast; model/msccl_limits.py).
- NCCL src/graph/tuning.cc ncclTopoTuneModel: LL128 stays off unless minCompCap == maxCompCap or
  minCompCap >= 90, and the bandwidth tables are indexed by minCompCap (the oldest GPU).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..api.cluster import ClusterTopology


def shape_warnings(topo: ClusterTopology) -> list[str]:
    """What this cluster's shape costs; empty when nothing is known to."""
    out = []
    gpn = topo.gpus_per_node
    if gpn > 1 and gpn & (gpn - 1):
        out.append(
            f"cluster {topo.name}: {gpn} GPUs per node is not a power of two: an MSCCL schedule "
            f"over a multiple of {gpn} chunks never divides a power-of-two allreduce or broadcast "
            "(msccl-executor's selection rule), so NCCL's own algorithms run at those sizes"
        )
    return out


def mixed_gpu_models(models: Mapping[str, str]) -> str | None:
    """One line when nodes report different GPU models (node name -> model), else None."""
    distinct = sorted(set(models.values()))
    if len(distinct) < 2:
        return None
    first = {m: min(n for n, v in models.items() if v == m) for m in distinct}
    shown = ", ".join(f"{m} (e.g. {first[m]})" for m in distinct)
    return (
        f"nodes mix GPU models: {shown}: NCCL tunes for the oldest compute capability and keeps "
        "LL128 off below Hopper (tuning.cc), and the plan models the first node's GPUs"
    )
