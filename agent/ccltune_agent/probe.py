"""One probe of the node: NVML snapshot + sysfs -> NodeTopologySpec (with its content hash)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ccltune.api.common import now
from ccltune.api.nodetopology import (
    GPU,
    NIC,
    GpuNicAffinity,
    HostCpu,
    NICPort,
    NodeTopologySpec,
    NumaNode,
    NVLink,
    P2PEntry,
    PciDevice,
)

from . import __version__
from .derive import bind_gpus, distance, is_flattened, switch_chain
from .nvml import GpuRecord, NvmlSnapshot, NvmlSource, NvmlUnavailable
from .sysfs import (
    CpuInfo,
    NicInfo,
    PciInfo,
    SysRoot,
    read_cpuinfo,
    read_nics,
    read_numa,
    read_pci,
    read_pci_links,
)

log = logging.getLogger(__name__)

# NVLink per link, per direction, GB/s, and generation, by compute capability. From NVIDIA's
# datasheets: P100 160 GB/s over 4 links, V100 300/6, A100 600/12, H100 900/18, B200 1800/18
# (all bidirectional totals); A40/A10-class (8.6) bridges 112.5 GB/s over 4 links.
_NVLINK_BY_CC: dict[tuple[int, int], tuple[int, float]] = {
    (6, 0): (1, 20.0), (7, 0): (2, 25.0), (8, 0): (3, 25.0), (8, 6): (3, 14.0625),
    (9, 0): (4, 25.0), (10, 0): (5, 50.0),
}
_DIST_TO_ANCESTOR = {"PIX": "single", "PXB": "multiple", "PHB": "hostbridge", "SYS": "system"}
# Bounds of the NodeTopology schema (api/nodetopology.py): a report over them would be rejected.
MAX_NOTES, MAX_NICS, MAX_PCI, MAX_GPUS = 32, 64, 1024, 64


@dataclass
class ProbeResult:
    spec: NodeTopologySpec
    warnings: list[str] = field(default_factory=list)
    nvml_error: str | None = None
    touched: set[str] = field(default_factory=set)


def content_hash(spec: NodeTopologySpec) -> str:
    """sha256 over the spec's wire form without probedAt/contentHash: same hardware, same hash."""
    doc = spec.wire()
    doc.pop("probedAt", None)
    doc.pop("contentHash", None)
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def probe(node_name: str, sysfs_root: Path | str = "/", nvml: NvmlSource | None = None,
          cpuinfo: Path | None = None) -> ProbeResult:
    """`cpuinfo`: read the CPU from this file instead of `<sysfs_root>/proc/cpuinfo`."""
    sys = SysRoot(sysfs_root)
    nvml_error: str | None = None
    snap: NvmlSnapshot | None = None
    if nvml is None:
        nvml_error = "NVML disabled (--no-nvml)"
    else:
        try:
            snap = nvml.snapshot()
        except NvmlUnavailable as exc:
            nvml_error = str(exc)
            log.warning("NVML unavailable, publishing sysfs facts only: %s", exc)

    pci = read_pci(sys)
    nics = read_nics(sys)
    numa = read_numa(sys)
    cpu = read_cpuinfo(sys, cpuinfo)
    notes: list[str] = []
    vfs = [n.name for n in nics if n.virtual_function]
    if vfs:
        # Host-side SR-IOV VFs (handed to pods by an SR-IOV plugin) are not rails of this node.
        notes.append(f"{len(vfs)} SR-IOV virtual functions not listed as NICs: {', '.join(vfs[:8])}"[:1024])
        nics = [n for n in nics if not n.virtual_function]
    if len(nics) > MAX_NICS:
        notes.append(f"{len(nics)} NICs found; only the first {MAX_NICS} (by name) are reported")
        nics = sorted(nics, key=lambda n: n.name)[:MAX_NICS]

    gpus = (_gpus_from_nvml(snap, pci) if snap else _gpus_from_sysfs(pci))[:MAX_GPUS]
    if snap:
        notes.extend(f"NVML: {e}" for e in snap.errors[:8])
        for g in gpus:
            if g.pci_bus_id not in pci:
                sys.warn(f"sys/bus/pci/devices/{g.pci_bus_id}", f"GPU {g.index} from NVML has no sysfs entry")

    gpu_buses = {g.index: g.pci_bus_id for g in gpus}
    keep: set[str] = set(gpu_buses.values()) | {n.bus_id for n in nics if n.bus_id}
    keep |= {b for b, info in pci.items() if info.is_nvswitch}
    for bus in list(keep):
        cur = pci[bus].parent if bus in pci else None
        while cur is not None and cur in pci and cur not in keep:
            keep.add(cur)
            cur = pci[cur].parent
    kept = [pci[b] for b in sorted(keep) if b in pci][:MAX_PCI]
    for info in kept:
        read_pci_links(sys, info)

    endpoints = list(gpu_buses.values()) + [str(n.bus_id) for n in nics if n.bus_id]
    flattened = is_flattened(endpoints, pci)
    if flattened:
        notes.append("PCIe switches are hidden (VM passthrough): GPUs and NICs sit directly on root "
                     "buses, so they are grouped by NUMA node; GPU-NIC classes are PHB (same NUMA) or "
                     "SYS. The physical switch layout is unknown; a vendor NCCL_TOPO_FILE may know it.")

    affinity = [GpuNicAffinity(gpu=g.index, nic=n.name, distance=distance(g.pci_bus_id, n.bus_id, pci))
                for g in gpus for n in nics if n.bus_id is not None]
    binding = bind_gpus(gpu_buses, nics, pci)
    p2p = _p2p(snap, gpus, pci)

    numa_ids = set(numa) | {i.numa_node for i in kept if i.numa_node >= 0}
    numa_nodes = [NumaNode(id=i, cpus=numa.get(i, "")) for i in sorted(numa_ids)]
    if any(link.state == "up" for g in gpus for link in g.nvlinks):
        notes.append("Sources: NIC rates and PCIe link speeds are what sysfs reports; NVLink bandwidthGbps "
                     "is the nominal per-direction rate of the GPU architecture from NVIDIA datasheets "
                     "(a bound, not measured).")
    if sys.warnings:
        notes.append(f"{len(sys.warnings)} sysfs entries skipped; first: {sys.warnings[0]}"[:1024])
    if nvml_error:
        notes.insert(0, f"NVML unavailable: {nvml_error}"[:1024])

    spec = NodeTopologySpec(
        node_name=node_name,
        agent_version=__version__,
        gpus=gpus,
        p2p=p2p,
        pci_devices=[_pci_device(i) for i in kept],
        nics=[_nic(n, pci) for n in nics],
        affinity=affinity,
        nic_binding={str(k): v for k, v in sorted(binding.items())},
        numa_nodes=numa_nodes,
        cpu=_host_cpu(cpu),
        pcie_flattened=flattened,
        notes=[n[:1024] for n in notes[:MAX_NOTES]],
    )
    spec.content_hash = content_hash(spec)
    spec.probed_at = now()
    return ProbeResult(spec=spec, warnings=list(sys.warnings), nvml_error=nvml_error, touched=sys.touched)


def _gpus_from_nvml(snap: NvmlSnapshot, pci: dict[str, PciInfo]) -> list[GPU]:
    return [_gpu(g, pci) for g in sorted(snap.gpus, key=lambda g: g.index)]


def _gpu(g: GpuRecord, pci: dict[str, PciInfo]) -> GPU:
    gen, bw = _NVLINK_BY_CC.get(g.compute_capability or (0, 0), (None, None))
    links = []
    for link in g.nvlinks:
        version = gen if gen is not None else link.version
        links.append(NVLink(
            link=link.link, state="up" if link.active else "down",
            version=version if link.active and version is not None and 0 <= version <= 16 else None,
            remote_pci_bus_id=link.remote_bus_id if link.active else None,
            remote_type=link.remote_type if link.active and link.remote_type in ("gpu", "nvswitch") else "unknown",
            bandwidth_gbps=bw if link.active else None,
        ))
    sys_numa = pci[g.bus_id].numa_node if g.bus_id in pci else -1
    numa = sys_numa if sys_numa >= 0 else (g.numa_node if g.numa_node is not None else -1)
    cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else None
    return GPU(index=g.index, uuid=g.uuid, name=g.name, pci_bus_id=g.bus_id, numa_node=numa,
               memory_mib=g.memory_bytes // (1 << 20) if g.memory_bytes is not None else None,
               compute_capability=cc, mig_enabled=g.mig_mode == 1, nvlinks=links)


def _gpus_from_sysfs(pci: dict[str, PciInfo]) -> list[GPU]:
    """Without NVML the GPUs are still on the PCI bus; index them in bus order as NVML would."""
    out = []
    for i, info in enumerate(sorted((p for p in pci.values() if p.is_gpu), key=lambda p: p.bus_id)):
        out.append(GPU(index=i, uuid="", name=f"NVIDIA PCI device {info.device or 'unknown'}",
                       pci_bus_id=info.bus_id, numa_node=info.numa_node))
    return out


def _p2p(snap: NvmlSnapshot | None, gpus: list[GPU], pci: dict[str, PciInfo]) -> list[P2PEntry]:
    by_index = {g.index: g for g in gpus}
    out = []
    pairs = snap.pairs if snap else []
    for pair in pairs:
        if pair.a not in by_index or pair.b not in by_index:
            continue
        ancestor = pair.common_ancestor or _DIST_TO_ANCESTOR[
            distance(by_index[pair.a].pci_bus_id, by_index[pair.b].pci_bus_id, pci).value]
        read = pair.p2p_read if pair.p2p_read in ("ok", "not_supported", "chipset_not_supported",
                                                  "disabled", "unknown") else "unknown"
        out.append(P2PEntry(gpu_a=pair.a, gpu_b=pair.b, p2p_read=read, common_ancestor=ancestor))
    return out


def _host_cpu(c: CpuInfo | None) -> HostCpu | None:
    if c is None or c.arch not in ("x86_64", "arm64", "ppc64"):
        return None
    return HostCpu.model_validate({"arch": c.arch, "vendor": c.vendor, "family_id": c.family_id,
                                   "model_id": c.model_id, "model_name": c.model_name})


def _pci_device(i: PciInfo) -> PciDevice:
    return PciDevice(bus_id=i.bus_id, class_code=i.class_code, vendor=i.vendor, device=i.device,
                     subsystem_vendor=i.subsystem_vendor, subsystem_device=i.subsystem_device,
                     parent=i.parent, numa_node=i.numa_node, link_speed=i.link_speed,
                     max_link_speed=i.max_link_speed, link_width=i.link_width,
                     max_link_width=i.max_link_width)


def _nic(n: NicInfo, pci: dict[str, PciInfo]) -> NIC:
    ports = [NICPort(port=p.port, rate_gbps=p.rate_gbps, state=p.state,
                     link_layer=p.link_layer if p.link_layer in ("InfiniBand", "Ethernet") else "unknown",
                     guid=p.guid or n.node_guid) for p in n.ports]
    numa = pci[n.bus_id].numa_node if n.bus_id in pci else -1
    return NIC(name=n.name, netdev=n.netdev, pci_bus_id=n.bus_id, numa_node=numa, ports=ports)


__all__ = ["ProbeResult", "content_hash", "probe", "switch_chain"]
