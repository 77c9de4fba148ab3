"""What the tuner needs to know about the hardware a communicator runs on.

Everything here is read off the ClusterTopology (links first, symmetric dimensions as a fallback);
nothing is guessed from names except the GPU generation, which comes from `gpuModel`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..api.cluster import ClusterTopology, DeviceKind, LinkKind
from ..api.errors import InputError

# GPU generation by model name. NVLink SHARP (NVLS) arrived with third-generation NVSwitch on
# Hopper (NVIDIA H100 / NCCL 2.17 release notes); Blackwell keeps it.
_ARCH = [
    (re.compile(r"\b(GB|B)[0-9]{3}", re.I), "blackwell"),
    (re.compile(r"\b(GH|H)[0-9]{2,3}", re.I), "hopper"),
    (re.compile(r"\bA[0-9]{2,3}\b|\bA[0-9]{2,3}[^0-9]", re.I), "ampere"),
    (re.compile(r"\bV100", re.I), "volta"),
    (re.compile(r"\bMI[0-9]{3}", re.I), "cdna"),
]
# Streaming multiprocessors (compute units) per GPU, vendor spec sheets; used by the interference
# model (communication CTAs compete with compute kernels for SMs).
_SMS = {"volta": 80, "ampere": 108, "hopper": 132, "blackwell": 148, "cdna": 304, "unknown": 108}


def gpu_arch(model: str) -> str:
    for pattern, arch in _ARCH:
        if pattern.search(model):
            return arch
    return "unknown"


@dataclass(frozen=True, slots=True)
class FabricFacts:
    """Per-GPU view of one communicator's fabric. Bandwidths GB/s per direction, latency us."""

    arch: str
    vendor: str  # "nvidia" or "amd"
    gpus_per_node: int  # ranks of the communicator on each node
    nodes: int
    intra_gbps: float  # per GPU into the node fabric (NVLink / xGMI / PCIe)
    intra_kind: str  # "nvlink", "xgmi" or "pcie"
    nvswitch: bool
    net_gbps_per_node: float  # sum of NIC bandwidth of one node (0 on a single node)
    nics_per_node: int
    intra_latency_us: float
    net_latency_us: float
    sharp: bool  # in-network reduction on the scale-out network (CollNet)
    sms: int

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def nvls(self) -> bool:
        return self.vendor == "nvidia" and self.nvswitch and self.arch in ("hopper", "blackwell")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "enabled")


def _fast_ring(topo: ClusterTopology, node: str, per_node: int, fast: set[LinkKind]) -> bool:
    """Whether the first `per_node` GPUs of `node` are joined by NVLink/xGMI alone, every GPU
    with two fast neighbours (so NCCL can close a ring without PCIe); a pair needs one link."""
    gpus = {f"{node}/gpu{i}" for i in range(per_node)}
    adj: dict[str, set[str]] = {g: set() for g in gpus}
    for link in topo.links:
        if link.kind in fast and link.a in gpus and link.b in gpus:
            adj[link.a].add(link.b)
            adj[link.b].add(link.a)
    need = min(2, per_node - 1)
    if any(len(n) < need for n in adj.values()):
        return False
    seen, todo = set(), [next(iter(gpus))]
    while todo:
        g = todo.pop()
        if g not in seen:
            seen.add(g)
            todo.extend(adj[g] - seen)
    return seen == gpus


def facts_for(topo: ClusterTopology, ranks: int, nodes: int, *, sharp: bool | None = None) -> FabricFacts:
    """Facts for a communicator of `ranks` GPUs spread evenly over `nodes` nodes of `topo`."""
    if nodes < 1 or ranks < nodes or ranks % nodes:
        raise InputError(f"a communicator of {ranks} ranks cannot spread evenly over {nodes} nodes")
    if nodes > topo.node_count:
        raise InputError(f"the task needs {nodes} nodes but cluster {topo.name!r} has {topo.node_count}")
    per_node = ranks // nodes
    if per_node > topo.gpus_per_node:
        raise InputError(
            f"the task puts {per_node} ranks on a node but cluster {topo.name!r} has "
            f"{topo.gpus_per_node} GPUs per node"
        )
    arch = gpu_arch(topo.gpu_model)
    vendor = "amd" if arch == "cdna" or "amd" in topo.gpu_model.lower() else "nvidia"
    node0 = topo.nodes[0].name
    first_gpu = topo.gpu_id(0)
    kinds = {d.id: d.kind for d in topo.devices}
    nvswitch = any(k == DeviceKind.NVSWITCH for k in kinds.values())
    fast = {LinkKind.NVLINK, LinkKind.XGMI}
    fast_bw = 0.0
    pcie_bw = 0.0
    intra_lat: list[float] = []
    intra_kind = "pcie"
    for link in topo.links:
        if first_gpu not in (link.a, link.b):
            continue
        if link.kind in fast:
            fast_bw += link.bandwidth_gbps
            intra_kind = str(LinkKind(link.kind).value)
            intra_lat.append(link.latency_us)
        elif link.kind == LinkKind.PCIE:
            pcie_bw = max(pcie_bw, link.bandwidth_gbps)
            intra_lat.append(link.latency_us)
    nic_ids = {d.id for d in topo.devices if d.kind == DeviceKind.NIC and d.node == node0}
    net_bw = 0.0
    net_lat: list[float] = []
    for link in topo.links:
        ends = {link.a, link.b}
        if link.kind == LinkKind.NET and ends & nic_ids:
            other = (ends - nic_ids) or ends
            if all(kinds.get(e) in (DeviceKind.LEAF, DeviceKind.SPINE) for e in other):
                net_bw += link.bandwidth_gbps
                net_lat.append(link.latency_us)
    dims = topo.dimensions or []
    if fast_bw == 0.0 and pcie_bw == 0.0 and dims:
        # No per-link data: use the symmetric description (innermost dimensions are in the node).
        inner, size = 0.0, 1
        for dim in dims:
            if size * dim.size > topo.gpus_per_node:
                break
            size *= dim.size
            inner += dim.bandwidth_gbps
            intra_lat.append(dim.latency_us)
        fast_bw = inner
        intra_kind = "nvlink" if vendor == "nvidia" else "xgmi"
        nvswitch = nvswitch or (dims[0].kind == "switch" and dims[0].size == topo.gpus_per_node)
    if net_bw == 0.0 and dims and topo.node_count > 1:
        size = 1
        for dim in dims:
            size *= dim.size
            if size > topo.gpus_per_node:
                net_bw = dim.bandwidth_gbps * topo.gpus_per_node
                net_lat.append(dim.latency_us)
                break
    if fast_bw > 0 and not nvswitch and not _fast_ring(topo, node0, per_node, fast):
        fast_bw = 0.0  # e.g. NVLink bridges on GPU pairs: a ring over all GPUs must use PCIe
    intra = fast_bw if fast_bw > 0 else pcie_bw
    if fast_bw == 0.0:
        intra_kind = "pcie"
    if intra <= 0 and per_node > 1:
        raise ValueError(f"cluster {topo.name!r}: no NVLink/xGMI/PCIe bandwidth found for {first_gpu}")
    if nodes > 1 and net_bw <= 0:
        raise ValueError(f"cluster {topo.name!r}: no network bandwidth found for node {node0}")
    if sharp is None:
        sharp = any(_truthy(n.fabric.get("sharp")) for n in topo.nodes) or _truthy(
            topo.sources.get("sharp")
        )
    # A communicator using part of a node uses the matching share of its NICs (rail-aligned).
    share = per_node / topo.gpus_per_node
    return FabricFacts(
        arch=arch,
        vendor=vendor,
        gpus_per_node=per_node,
        nodes=nodes,
        intra_gbps=max(intra, 1e-3),
        intra_kind=intra_kind,
        nvswitch=nvswitch,
        net_gbps_per_node=net_bw * share if nodes > 1 else 0.0,
        nics_per_node=max(1, round(len(nic_ids) * share)) if nic_ids else 1,
        intra_latency_us=max(intra_lat) if intra_lat else 0.5,
        net_latency_us=max(net_lat) if net_lat else 2.0,
        sharp=sharp and nodes > 1,
        sms=_SMS.get(arch, 108),
    )


__all__ = ["FabricFacts", "facts_for", "gpu_arch"]
