"""What one GPU can do: threadblock throughput per protocol, SM-driven NVLink efficiency, SMs.

NCCL and MSCCL move data with threadblocks (NCCL: one per channel; MSCCL: the file's), not with
copy engines, so a transfer is limited by the threadblock that sends it and the one that receives
it, whatever the link could carry. Every constant here has its source in docs/cost-model.md; the
one fitted constant (`LL_OF_SIMPLE`) is named as such there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .protocols import PER_CH_MAX_RING_LL128_BW, Arch, arch_of


class Family(StrEnum):
    """GPU families with different per-threadblock physics."""

    VOLTA = "volta"
    AMPERE = "ampere"
    HOPPER = "hopper"
    CDNA3 = "cdna3"  # AMD MI300X / MI300A / MI325X


@dataclass(frozen=True, slots=True)
class GpuPhysics:
    family: Family
    sms: int  # streaming multiprocessors (AMD: compute units); one threadblock per channel each
    tb_gbps: dict[str, float]  # payload GB/s one threadblock moves, per protocol
    floor_us: dict[str, float]  # shortest call per protocol (0 = none measured)
    nvlink_efficiency: float  # payload fraction of NVLink line rate that SM stores reach

    def tb(self, protocol: str) -> float:
        return self.tb_gbps[protocol]


# SM stores reach ~80% of NVLink's line rate (128-byte payloads per packet; copy engines use 256):
# NCCL's topo.h books 20 GB/s per 25 GB/s NVLink3 lane (sjeaugey, NVIDIA/nccl#1054,
# NVIDIA/nccl-tests#149).
NVLINK_SM_EFFICIENCY = 0.8

# Fitted (docs/cost-model.md): one LL threadblock's payload rate as a fraction of Simple's, on
# every GPU, to the fidelity sets' LL sizes (NDv4 A100 and MI300X 1x8).
LL_OF_SIMPLE = 0.35

# One Simple threadblock's payload GB/s.
_SIMPLE_TB_GBPS = {
    # NCCL runs 24 channels to fill HGX A100's 300 GB/s of NVLink3 (nccl-tests#100 log: "Channel
    # 23/24"): 300 / 24.
    Family.AMPERE: 12.5,
    # "NCCL needs 16+ channels to fill H100 NVLink" (issue 14): 450 GB/s NVLink4 / 16.
    Family.HOPPER: 450.0 / 16,
    # No measurement: Ampere's value (guess).
    Family.VOLTA: 12.5,
    # One MSCCL threadblock moves ~10.5 GB/s on MI300X (issue 14, measured).
    Family.CDNA3: 10.5,
}
_SMS = {Family.VOLTA: 80, Family.AMPERE: 108, Family.HOPPER: 132, Family.CDNA3: 304}
# MI300X: LL128 per threadblock ~0.2 of Simple, and LL128 calls take at least ~200 us (issue 14,
# measured; no set here runs LL128 on MI300X to check). The LL figure (~0.15 of Simple) is
# not used: the rccl-tests 1x8 set runs LL at 64 KiB over 2 channels in 14.2 us, which needs
# more than 0.5 of Simple per threadblock.
_CDNA3_LL128, _CDNA3_LL128_FLOOR_US = 0.2, 200.0
# Graph channels NCCL's LL128 caps count run on this many kernel threadblocks each
# (connect.cc ncclTopoPostset duplicates every channel).
_TBS_PER_GRAPH_CHANNEL = 2


def family_of(gpu_model: str) -> Family | None:
    """The GPU's family, or None when nothing is known about its threadblocks."""
    m = gpu_model.upper().replace("AMD", "").replace("INSTINCT", "").strip()
    if m.startswith(("MI300", "MI325")):
        return Family.CDNA3
    arch = arch_of(gpu_model)
    if arch == Arch.HOPPER:
        return Family.HOPPER
    if arch == Arch.AMPERE:
        return Family.AMPERE
    if arch == Arch.VOLTA:
        return Family.VOLTA
    return None


def gpu_physics(gpu_model: str) -> GpuPhysics | None:
    """Per-threadblock physics of `gpu_model`; None for GPUs without sourced numbers."""
    fam = family_of(gpu_model)
    if fam is None:
        return None
    simple = _SIMPLE_TB_GBPS[fam]
    if fam == Family.CDNA3:
        ll128, floors = _CDNA3_LL128 * simple, {"LL128": _CDNA3_LL128_FLOOR_US}
        nvlink = 1.0  # xGMI: no NVLink
    else:
        # NCCL's perChMaxRingLL128Bw (tuning.cc), per graph channel, over its threadblocks.
        ll128 = PER_CH_MAX_RING_LL128_BW[Arch(fam.value)][0] / _TBS_PER_GRAPH_CHANNEL
        floors, nvlink = {}, NVLINK_SM_EFFICIENCY
    return GpuPhysics(
        family=fam,
        sms=_SMS[fam],
        tb_gbps={"Simple": simple, "LL128": ll128, "LL": LL_OF_SIMPLE * simple},
        floor_us={p: floors.get(p, 0.0) for p in ("LL", "LL128", "Simple")},
        nvlink_efficiency=nvlink,
    )
