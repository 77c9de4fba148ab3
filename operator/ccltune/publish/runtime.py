"""What each runtime (spec.publish.runtime) really runs: the NCCL under it, the GPUs it drives,
whether it reads MSCCL files, and which file its MSCCL scheduler picks for a call.

- nccl: stock NVIDIA NCCL. No MSCCL support at all.
- msccl: Azure msccl-executor-nccl (c6f6b36), an NCCL 2.23.4 fork (makefiles/version.mk) that runs
  the files in MSCCL_ALGO_DIR.
- rccl: AMD RCCL; MSCCL built in (src/misc/msccl/msccl_lifecycle.cc), but its internal scheduler
  selects a file only where RCCL's platform model enables MSCCL or RCCL_MSCCL_FORCE_ENABLE=1.

Selection restates mscclInternalSchedulerSelectAlgo (msccl_lifecycle.cc of both): files in sorted
path order, the first whose collective and rank count match, with `count * sizeMultiplier`
divisible by nchunksperloop, nBytes in [minBytes, maxBytes] (maxBytes 0: no limit) and the call's
placement (in-place or out-of-place) declared.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass

from ..api.ccltuning import PublishOptions
from ..api.errors import InputError

# The NCCL a runtime ships when the spec names none. msccl: its fork base is 2.23.4. nccl, rccl:
# 2.24 is the oldest release ccltune plans for by default (per-collective syntax, tuner ABI v3+).
DEFAULT_NCCL_VERSION = {"nccl": "2.24", "msccl": "2.23", "rccl": "2.24"}
MSCCL_EXECUTOR_NCCL = "2.23"

# Collectives whose MSCCL size is count x nRanks (msccl_parser.cc, sizeMultiplier = ngpus).
_MULTIPLIED = frozenset({"allgather", "reducescatter", "alltoall"})
# Element size the selection is checked for: bf16, the training default (and the kit's default).
DTYPE_BYTES = 2

# RCCL (msccl_lifecycle.cc, RCCL_PARAM MscclEnabled / MscclForceEnabled): MSCCL on by default, but
# the internal scheduler selects only where the platform model says so unless forced.
RCCL_MSCCL_ENV = {"RCCL_MSCCL_ENABLE": "1", "RCCL_MSCCL_FORCE_ENABLE": "1"}


class RuntimeMismatch(InputError):
    """The spec asks a runtime for something it cannot do; the message names the field."""


def runs_msccl(runtime: str) -> bool:
    return runtime in ("msccl", "rccl")


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def nccl_version(publish: PublishOptions) -> str:
    """The NCCL release the files are written for: the spec's, else the runtime's own."""
    runtime, asked = publish.runtime, publish.nccl_version
    if asked is None:
        return DEFAULT_NCCL_VERSION[runtime]
    if runtime == "msccl" and _minor(asked) != _minor(MSCCL_EXECUTOR_NCCL):
        raise RuntimeMismatch(
            f"spec.publish.ncclVersion: {asked} contradicts runtime msccl (msccl-executor-nccl is "
            f"NCCL 2.23.4); set {MSCCL_EXECUTOR_NCCL} or leave it out"
        )
    return asked


def gpu_vendor(gpu_model: str) -> str | None:
    """'amd', 'nvidia', or None when the model string does not say."""
    m = gpu_model.strip().upper()
    if not m:
        return None
    return "amd" if m.startswith(("MI", "AMD", "RADEON", "INSTINCT")) else "nvidia"


def check_gpus(runtime: str, gpu_model: str) -> None:
    """NCCL and msccl-executor-nccl drive NVIDIA GPUs only; RCCL AMD GPUs only."""
    vendor = gpu_vendor(gpu_model)
    if vendor is None:
        return
    if runtime == "rccl" and vendor != "amd":
        raise RuntimeMismatch(
            f"spec.publish.runtime: rccl runs on AMD GPUs; this cluster has {gpu_model} "
            "(use nccl or msccl)"
        )
    if runtime != "rccl" and vendor == "amd":
        raise RuntimeMismatch(
            f"spec.publish.runtime: {runtime} runs on NVIDIA GPUs; this cluster has {gpu_model} "
            "(use rccl)"
        )


def publishable_protocol(runtime: str, protocol: str) -> bool:
    """RCCL disables LL128 on most AMD GPUs (RCCL_LL128_FORCE_ENABLE); claim no LL128 file there."""
    return not (runtime == "rccl" and protocol.upper() == "LL128")


@dataclass(frozen=True)
class AlgoMeta:
    """The <algo> attributes the MSCCL scheduler selects by (msccl_parser.cc, the meta pass)."""

    path: str
    collective: str
    ranks: int
    chunks_per_loop: int
    min_bytes: int
    max_bytes: int  # 0: no upper limit
    inplace: bool
    outofplace: bool
    protocol: str

    @property
    def multiplier(self) -> int:
        return self.ranks if self.collective in _MULTIPLIED else 1

    def placements(self) -> list[bool]:
        """The placements (True: in-place) the file declares."""
        return [p for p, ok in ((True, self.inplace), (False, self.outofplace)) if ok]


def algo_meta(path: str, content: str) -> AlgoMeta:
    algo = ET.fromstring(content)
    if algo.tag != "algo":
        raise ValueError(f"{path}: root element is <{algo.tag}>, not <algo>")
    a = algo.attrib
    return AlgoMeta(
        path=path,
        collective=a["coll"],
        ranks=int(a["ngpus"]),
        chunks_per_loop=int(a["nchunksperloop"]),
        min_bytes=int(a["minBytes"]),
        max_bytes=int(a["maxBytes"]),
        inplace=bool(int(a["inplace"])),
        outofplace=bool(int(a["outofplace"])),
        protocol=a.get("proto", ""),
    )


def selected_file(metas: Iterable[AlgoMeta], collective: str, ranks: int, size_bytes: int,
                  inplace: bool, dtype_bytes: int = DTYPE_BYTES) -> str | None:  # fmt: skip
    """The file the scheduler runs for a call of `size_bytes` (nccl-tests' size), or None (NCCL)."""
    for m in sorted(metas, key=lambda m: m.path):
        if m.collective != collective or m.ranks != ranks or m.chunks_per_loop <= 0:
            continue
        count = size_bytes // (dtype_bytes * m.multiplier)
        n_bytes = count * dtype_bytes * m.multiplier
        fits = count > 0 and (count * m.multiplier) % m.chunks_per_loop == 0
        in_range = n_bytes >= m.min_bytes and (m.max_bytes == 0 or n_bytes <= m.max_bytes)
        if fits and in_range and (m.inplace if inplace else m.outofplace):
            return m.path
    return None


def selected_everywhere(metas: list[AlgoMeta], claim: AlgoMeta, size_bytes: int) -> bool:
    """True when every placement the claimed file declares runs that file at this size."""
    places = claim.placements()
    return bool(places) and all(
        selected_file(metas, claim.collective, claim.ranks, size_bytes, p) == claim.path
        for p in places
    )


__all__ = [
    "DEFAULT_NCCL_VERSION",
    "DTYPE_BYTES",
    "RCCL_MSCCL_ENV",
    "AlgoMeta",
    "RuntimeMismatch",
    "algo_meta",
    "check_gpus",
    "gpu_vendor",
    "nccl_version",
    "publishable_protocol",
    "runs_msccl",
    "selected_everywhere",
    "selected_file",
]
