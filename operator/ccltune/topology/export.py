"""Exports of a ClusterTopology: ASTRA-sim YAML, a per-node NodeTopologySpec (for NCCL XML),
and a one-line summary."""

from __future__ import annotations

import uuid
from collections import defaultdict

from ..api.cluster import ClusterTopology, DeviceKind, LinkKind
from ..api.nodetopology import (
    GPU,
    NIC,
    Distance,
    GpuNicAffinity,
    NICPort,
    NodeTopologySpec,
    NumaNode,
    NVLink,
    P2PEntry,
    PciDevice,
)
from . import astra
from .errors import TopologyError

# NVLink rate per link and direction by generation: 25 GB/s for NVLink 2, 3 and 4 (NVIDIA V100,
# A100 and H100 datasheets: 300/600/900 GB/s bidirectional over 6/12/18 links).
NVLINK_LINK_GBPS = 25.0
_CC = (("H100", "9.0"), ("H800", "9.0"), ("H200", "9.0"), ("A100", "8.0"), ("A800", "8.0"),
       ("A40", "8.6"), ("V100", "7.0"))
_NVLINK_VERSION = {"9.0": 4, "8.0": 3, "8.6": 3, "7.0": 2}
# AMD Instinct: ROCm target and compute units (AMD ROCm docs "GPU hardware specifications":
# MI300X gfx942 304 CUs, MI300A gfx942 228 CUs), for RCCL's topology file.
_AMD = (("MI300X", "gfx942", 304), ("MI300A", "gfx942", 228))
# PCI class codes (PCI-SIG class code table): 3D controller, InfiniBand / Ethernet controller,
# PCI-to-PCI bridge, processing accelerator.
CLASS_GPU, CLASS_IB, CLASS_ETH, CLASS_BRIDGE, CLASS_ACCEL = "0x030200", "0x020700", "0x020000", "0x060400", "0x120000"
CPUS_PER_SOCKET = 32  # synthetic cpulists; NCCL only uses them for affinity masks


def describe(topo: ClusterTopology) -> str:
    """One line, e.g. '4 nodes x 8 A800 · switch 8 @ 200 GB/s · switch 4 @ 12.5 GB/s'."""
    nodes = f"{topo.node_count} node{'s' if topo.node_count != 1 else ''} x {topo.gpus_per_node}"
    head = f"{nodes} {topo.gpu_model}".rstrip()
    if topo.dimensions is None:
        return f"{head} · asymmetric: {topo.asymmetry_reason}"
    parts = [head] + [f"{d.kind} {d.size} @ {d.bandwidth_gbps:g} GB/s" for d in topo.dimensions]
    return " · ".join(parts)


def to_astra_yaml(topo: ClusterTopology) -> str:
    if topo.dimensions is None:
        raise TopologyError(f"cluster {topo.name}: ASTRA-sim needs symmetric dimensions, but {topo.asymmetry_reason}")
    if not topo.dimensions:
        raise TopologyError(f"cluster {topo.name}: a single GPU has no network dimensions to export")
    header = (f"# ASTRA-sim analytical network for ccltune cluster {topo.name} ({topo.world_size} NPUs)\n"
              "# bandwidth: GB/s per unidirectional link; latency: ns per link; innermost dimension first\n")
    return header + astra.dump(topo.dimensions)


def _gts(bw: float) -> str:
    """PCIe per-lane rate string for an x16 link of `bw` GB/s (128b/130b line code)."""
    gts = bw * 8 * 130 / 128 / 16
    for std in (2.5, 5.0, 8.0, 16.0, 32.0, 64.0):
        if gts <= std * 1.05:
            return f"{std:.1f} GT/s PCIe"
    return "64.0 GT/s PCIe"


def node_spec(topo: ClusterTopology, node_name: str) -> NodeTopologySpec:
    """What an agent on `node_name` would report, with synthetic but well-formed PCI bus ids."""
    if node_name not in {n.name for n in topo.nodes}:
        raise TopologyError(f"cluster {topo.name}: no node {node_name!r}")
    node = next(n for n in topo.nodes if n.name == node_name)
    kind = {d.id: d.kind for d in topo.devices}
    local = {d.id for d in topo.devices if d.node == node_name or d.id.startswith(f"{node_name}/")}
    adj: dict[str, list] = defaultdict(list)
    for link in topo.links:
        adj[link.a].append((link.b, link))
        adj[link.b].append((link.a, link))
    cpus = sorted((d for d in local if kind.get(d) == DeviceKind.CPU), key=_index)
    switches = sorted((d for d in local if kind.get(d) == DeviceKind.PCIE_SWITCH), key=_index)
    gpus = [f"{node_name}/gpu{i}" for i in range(topo.gpus_per_node)]
    nics = sorted((d for d in local if kind.get(d) == DeviceKind.NIC), key=_index)
    if not cpus:
        cpus = [f"{node_name}/cpu0"]  # no PCIe tree given: everything on one root complex

    def pcie_parent(dev: str) -> str:
        for other, link in adj.get(dev, []):
            if link.kind == LinkKind.PCIE and kind.get(other) in (DeviceKind.PCIE_SWITCH, DeviceKind.CPU):
                return other
        return cpus[0]

    socket = {c: i for i, c in enumerate(cpus)}
    for sw in switches:
        socket[sw] = socket.get(pcie_parent(sw), 0)
    pci: list[PciDevice] = []
    bus_of: dict[str, str] = {}
    next_bus = 1
    root_slot = [1] * len(cpus)

    def root_port(cpu_index: int, bw: float) -> str:
        bus = f"{cpu_index * 0x80:04x}"[-2:]
        slot = root_slot[cpu_index]
        root_slot[cpu_index] += 1
        bid = f"0000:{bus}:{slot:02x}.0"
        pci.append(PciDevice(bus_id=bid, class_code=CLASS_BRIDGE, numa_node=cpu_index, max_link_speed=_gts(bw),
                             link_speed=_gts(bw), max_link_width=16, link_width=16))
        return bid

    def endpoint(dev: str, parent: str | None, cls: str, vendor: str, numa: int, bw: float) -> None:
        nonlocal next_bus
        bid = f"0000:{next_bus:02x}:00.0"
        next_bus += 1
        bus_of[dev] = bid
        pci.append(PciDevice(bus_id=bid, class_code=cls, vendor=vendor, parent=parent, numa_node=numa,
                             link_speed=_gts(bw), max_link_speed=_gts(bw), link_width=16, max_link_width=16))

    def pcie_bw(dev: str) -> float:
        return max((lk.bandwidth_gbps for _, lk in adj.get(dev, []) if lk.kind == LinkKind.PCIE), default=31.5)

    nvidia = not topo.gpu_model.upper().startswith("MI")
    gpu_cls, gpu_vendor = (CLASS_GPU, "0x10de") if nvidia else (CLASS_ACCEL, "0x1002")
    link_layer = node.fabric.get("linkLayer", "InfiniBand")
    nic_cls = CLASS_ETH if link_layer == "Ethernet" else CLASS_IB
    children: dict[str, list[str]] = defaultdict(list)
    for dev in gpus + nics:
        children[pcie_parent(dev)].append(dev)

    def cls_of(dev: str) -> tuple[str, str]:
        return (gpu_cls, gpu_vendor) if kind.get(dev) == DeviceKind.GPU else (nic_cls, "0x15b3")

    for cpu in cpus:
        ci = socket[cpu]
        for dev in children.get(cpu, []):
            cls, vendor = cls_of(dev)
            endpoint(dev, root_port(ci, pcie_bw(dev)), cls, vendor, ci, pcie_bw(dev))
    for sw in switches:
        ci = socket[sw]
        bw = pcie_bw(sw)
        up_bus = next_bus
        next_bus += 1
        upstream = f"0000:{up_bus:02x}:00.0"
        pci.append(PciDevice(bus_id=upstream, class_code=CLASS_BRIDGE, vendor="0x1000", parent=root_port(ci, bw),
                             numa_node=ci, link_speed=_gts(bw), max_link_speed=_gts(bw), link_width=16, max_link_width=16))
        down_bus = next_bus
        next_bus += 1
        for k, dev in enumerate(children.get(sw, [])):
            down = f"0000:{down_bus:02x}:{k:02x}.0"
            pci.append(PciDevice(bus_id=down, class_code=CLASS_BRIDGE, vendor="0x1000", parent=upstream, numa_node=ci,
                                 link_speed=_gts(bw), max_link_speed=_gts(bw), link_width=16, max_link_width=16))
            cls, vendor = cls_of(dev)
            endpoint(dev, down, cls, vendor, ci, pcie_bw(dev))
    if next_bus > 0xFF:
        raise TopologyError(f"node {node_name}: too many PCI devices for one synthetic PCI domain")
    numa_of = {dev: socket.get(pcie_parent(dev), 0) for dev in gpus + nics}
    cc = next((v for k, v in _CC if k in topo.gpu_model.upper()), None) if nvidia else None
    amd = next(((g, cu) for k, g, cu in _AMD if k in topo.gpu_model.upper()), None) if not nvidia else None
    gpu_models = [_gpu(topo, node_name, i, gid, bus_of, adj, kind, numa_of[gid], cc) for i, gid in enumerate(gpus)]
    if amd:
        gpu_models = [g.model_copy(update={"gcn_arch": amd[0], "compute_units": amd[1]}) for g in gpu_models]
    nic_models = []
    for j, nic in enumerate(nics):
        rate = sum(lk.bandwidth_gbps for other, lk in adj.get(nic, []) if lk.kind == LinkKind.NET) * 8
        ports = [NICPort(port=1, rate_gbps=round(rate, 3), state="ACTIVE", link_layer=link_layer)] if rate else []
        nic_models.append(NIC(name=f"mlx5_{j}", pci_bus_id=bus_of[nic], numa_node=numa_of[nic], ports=ports))
    parent_of = {dev: pcie_parent(dev) for dev in gpus + nics}
    affinity, binding = [], {}
    for i, gid in enumerate(gpus):
        best: tuple[int, str] | None = None
        for j, nic in enumerate(nics):
            dist = _distance(parent_of[gid], parent_of[nic], socket)
            affinity.append(GpuNicAffinity(gpu=i, nic=f"mlx5_{j}", distance=dist))
            rank = list(Distance).index(dist)
            if best is None or rank < best[0]:
                best = (rank, f"mlx5_{j}")
        if best is not None:
            binding[str(i)] = best[1]
    p2p = []
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            a, b = parent_of[gpus[i]], parent_of[gpus[j]]
            anc = "single" if a == b and kind.get(a) == DeviceKind.PCIE_SWITCH else (
                "hostbridge" if socket.get(a) == socket.get(b) else "system")
            p2p.append(P2PEntry(gpu_a=i, gpu_b=j, p2p_read="ok" if anc != "system" else "unknown", common_ancestor=anc))
    numa = [NumaNode(id=k, cpus=f"{k * CPUS_PER_SOCKET}-{(k + 1) * CPUS_PER_SOCKET - 1}") for k in range(len(cpus))]
    return NodeTopologySpec(
        node_name=node_name, agent_version="ccltune-model", gpus=gpu_models, p2p=p2p, pci_devices=pci,
        nics=nic_models, affinity=affinity, nic_binding=binding, numa_nodes=numa, cpu=topo.host_cpu,
        notes=[f"synthesized from cluster model {topo.name}; PCI bus ids and cpulists are synthetic"],
    )


def _index(dev_id: str) -> int:
    tail = dev_id.rsplit("/", 1)[-1]
    digits = "".join(ch for ch in tail if ch.isdigit())
    return int(digits) if digits else 0


def _distance(a: str, b: str, socket: dict[str, int]) -> Distance:
    if a == b and "pcie" in a.rsplit("/", 1)[-1]:
        return Distance.PIX
    if socket.get(a) == socket.get(b):
        return Distance.PHB
    return Distance.SYS


def _gpu(topo: ClusterTopology, node: str, i: int, gid: str, bus_of: dict[str, str], adj: dict, kind: dict,
         numa: int, cc: str | None) -> GPU:
    nvlinks: list[NVLink] = []
    version = _NVLINK_VERSION.get(cc or "")
    for other, link in sorted(adj.get(gid, []), key=lambda x: x[0]):
        okind = kind.get(other)
        if link.kind not in (LinkKind.NVLINK, LinkKind.XGMI):
            continue
        if okind not in (DeviceKind.NVSWITCH, DeviceKind.GPU):
            continue
        count = link.bandwidth_gbps / NVLINK_LINK_GBPS
        n = round(count) if link.kind == LinkKind.NVLINK and abs(count - round(count)) < 1e-6 and count >= 1 else 1
        per = link.bandwidth_gbps / n
        for _ in range(n):
            if len(nvlinks) >= 64:
                break
            nvlinks.append(NVLink(
                link=len(nvlinks), state="up", version=version,
                remote_pci_bus_id=bus_of.get(other) if okind == DeviceKind.GPU else None,
                remote_type="gpu" if okind == DeviceKind.GPU else "nvswitch", bandwidth_gbps=per,
            ))
    uid = uuid.uuid5(uuid.NAMESPACE_URL, f"ccltune:{topo.name}:{node}:{i}")
    return GPU(index=i, uuid=f"GPU-{uid}", name=topo.gpu_model or "GPU", pci_bus_id=bus_of[gid], numa_node=numa,
               compute_capability=cc, nvlinks=nvlinks)
