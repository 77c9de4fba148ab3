"""What the agent reads from NVML, behind one small interface: live (pynvml) or replayed (JSON).

The snapshot is the whole NVML read of a probe. `record` writes it verbatim, so a recording is
exactly what the probe saw on the node (format: docs/agent.md, "NVML recording").
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

FORMAT = "ccltune.io/nvml-recording/v1"

# nvmlGpuTopologyLevel_t values (nvml.h) -> NodeTopology P2PEntry.common_ancestor.
TOPOLOGY_LEVELS = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
# nvmlGpuP2PStatus_t values (nvml.h) -> P2PEntry.p2p_read.
P2P_STATUS = {0: "ok", 1: "chipset_not_supported", 2: "not_supported", 3: "not_supported",
              4: "disabled", 5: "not_supported", 6: "unknown"}
# nvmlNvLinkDeviceType_t (nvml.h): GPU 0, IBMNPU 1, SWITCH 2, UNKNOWN 0xFF.
REMOTE_TYPES = {0: "gpu", 1: "unknown", 2: "nvswitch", 0xFF: "unknown"}

_BUS_ID = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (no driver, no GPU, or the library is missing)."""


class RecordingError(ValueError):
    """A recording file that cannot be read; the message names the file and the field."""


def normalize_bus_id(raw: str) -> str:
    """NVML's '00000000:07:00.0' -> sysfs' '0000:07:00.0' (NCCL keys devices the same way)."""
    match = _BUS_ID.match(raw.strip())
    if not match:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    domain, bus, dev, fn = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


@dataclass
class NvLinkRecord:
    link: int
    active: bool
    version: int | None = None  # raw nvmlDeviceGetNvLinkVersion value
    remote_bus_id: str | None = None
    remote_type: str = "unknown"  # gpu | nvswitch | unknown


@dataclass
class GpuRecord:
    index: int
    uuid: str
    name: str
    bus_id: str
    numa_node: int | None = None
    memory_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    mig_mode: int | None = None  # current MIG mode: 1 enabled, 0 disabled, None unsupported
    nvlinks: list[NvLinkRecord] = field(default_factory=list)


@dataclass
class PairRecord:
    a: int
    b: int
    p2p_read: str = "unknown"
    common_ancestor: str | None = None


@dataclass
class NvmlSnapshot:
    driver_version: str = ""
    gpus: list[GpuRecord] = field(default_factory=list)
    pairs: list[PairRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # per-call failures that were skipped

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for gpu in doc["gpus"]:
            cc = gpu.pop("compute_capability")
            gpu["compute_capability"] = f"{cc[0]}.{cc[1]}" if cc else None
        return {"format": FORMAT, **doc}


class NvmlSource(Protocol):
    def snapshot(self) -> NvmlSnapshot:
        """Read everything the probe needs; raise NvmlUnavailable when NVML cannot be used."""
        ...


def unavailable_json(reason: str) -> dict[str, Any]:
    """A recording of a node where NVML could not be used (replays as NvmlUnavailable)."""
    return {"format": FORMAT, "unavailable": reason}


class ReplayNvml:
    """Replays a recording written by `ccltune-agent record` (or a hand-written fixture)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def snapshot(self) -> NvmlSnapshot:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError as exc:
            raise NvmlUnavailable(f"NVML recording {self.path} does not exist") from exc
        except (OSError, ValueError) as exc:
            raise RecordingError(f"{self.path}: not a readable JSON file ({exc})") from exc
        return parse_recording(doc, str(self.path))


def parse_recording(doc: Any, where: str) -> NvmlSnapshot:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RecordingError(f"{where}: field 'format' must be {FORMAT!r}")
    if "unavailable" in doc:
        raise NvmlUnavailable(str(doc["unavailable"]))
    try:
        gpus = [_gpu(g) for g in doc.get("gpus", [])]
        pairs = [PairRecord(a=int(p["a"]), b=int(p["b"]), p2p_read=str(p.get("p2p_read", "unknown")),
                            common_ancestor=p.get("common_ancestor")) for p in doc.get("pairs", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"{where}: bad GPU or pair entry: {exc!r}") from exc
    return NvmlSnapshot(driver_version=str(doc.get("driver_version", "")), gpus=gpus, pairs=pairs,
                        errors=[str(e) for e in doc.get("errors", [])])


def _gpu(g: dict[str, Any]) -> GpuRecord:
    cc = g.get("compute_capability")
    cc_t = None
    if cc:
        major, minor = str(cc).split(".")
        cc_t = (int(major), int(minor))
    links = [NvLinkRecord(link=int(n["link"]), active=bool(n["active"]), version=n.get("version"),
                          remote_bus_id=n.get("remote_bus_id"), remote_type=str(n.get("remote_type", "unknown")))
             for n in g.get("nvlinks", [])]
    return GpuRecord(index=int(g["index"]), uuid=str(g["uuid"]), name=str(g["name"]),
                     bus_id=normalize_bus_id(str(g["bus_id"])), numa_node=g.get("numa_node"),
                     memory_bytes=g.get("memory_bytes"), compute_capability=cc_t,
                     mig_mode=g.get("mig_mode"), nvlinks=links)


class RealNvml:
    """Live NVML through nvidia-ml-py. Each optional query that fails is skipped and noted."""

    def snapshot(self) -> NvmlSnapshot:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc} (is the NVIDIA driver installed and "
                                  "the device library mounted into the pod?)") from exc
        try:
            return _read_all(pynvml)
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML query failed: {exc}") from exc
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_all(nv: Any) -> NvmlSnapshot:
    snap = NvmlSnapshot(driver_version=_text(nv.nvmlSystemGetDriverVersion()))
    count = nv.nvmlDeviceGetCount()
    if count == 0:
        raise NvmlUnavailable("NVML reports no GPU on this node")
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def opt(what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                snap.errors.append(f"{what}: {exc}")
            return None

    for i, h in enumerate(handles):
        pci = nv.nvmlDeviceGetPciInfo(h)
        mem = opt(f"gpu {i} memory", nv.nvmlDeviceGetMemoryInfo, h)
        mig = opt(f"gpu {i} MIG mode", nv.nvmlDeviceGetMigMode, h)
        cc = opt(f"gpu {i} compute capability", nv.nvmlDeviceGetCudaComputeCapability, h)
        numa = opt(f"gpu {i} NUMA node", nv.nvmlDeviceGetNumaNodeId, h) if hasattr(
            nv, "nvmlDeviceGetNumaNodeId") else None
        gpu = GpuRecord(index=i, uuid=_text(nv.nvmlDeviceGetUUID(h)), name=_text(nv.nvmlDeviceGetName(h)),
                        bus_id=normalize_bus_id(_text(pci.busId)), numa_node=numa,
                        memory_bytes=int(mem.total) if mem is not None else None,
                        compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
                        mig_mode=int(mig[0]) if mig else None)
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                state = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError:
                break  # links are numbered densely; the first unsupported one ends the list
            record = NvLinkRecord(link=link, active=bool(state))
            if record.active:
                record.version = opt(f"gpu {i} link {link} version", nv.nvmlDeviceGetNvLinkVersion, h, link)
                remote = opt(f"gpu {i} link {link} remote", nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                if remote is not None:
                    record.remote_bus_id = normalize_bus_id(_text(remote.busId))
                rtype = opt(f"gpu {i} link {link} remote type", nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
                record.remote_type = REMOTE_TYPES.get(rtype, "unknown") if rtype is not None else "unknown"
            gpu.nvlinks.append(record)
        snap.gpus.append(gpu)

    for a in range(count):
        for b in range(a + 1, count):
            status = opt(f"p2p {a}-{b}", nv.nvmlDeviceGetP2PStatus, handles[a], handles[b],
                         nv.NVML_P2P_CAPS_INDEX_READ)
            level = opt(f"topology {a}-{b}", nv.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            snap.pairs.append(PairRecord(a=a, b=b, p2p_read=P2P_STATUS.get(status, "unknown") if status is not None
                                         else "unknown", common_ancestor=TOPOLOGY_LEVELS.get(level)))
    return snap
