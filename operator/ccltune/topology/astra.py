"""ASTRA-sim network YAML (analytical backend) import and export.

Format (astra-sim docs, "Network Configuration", and astra-network-analytical):
    topology: [ Ring, FullyConnected, Switch ]   # innermost dimension first
    npus_count: [ 4, 2, 8 ]                      # NPUs per dimension
    bandwidth: [ 50.0, 25.0, 12.5 ]              # GB/s of each unidirectional link
    latency: [ 500.0, 500.0, 500.0 ]             # ns of each unidirectional link
How the analytical backend wires a dimension of n NPUs with link bandwidth B
(astra-network-analytical congestion_aware Ring.cc / FullyConnected.cc / Switch.cc):
Ring joins neighbours in both directions (2 links out of every NPU, 1 when n == 2), FullyConnected
joins every ordered pair (n-1 links out), Switch gives every NPU one link to the switch. So the
per-GPU bandwidth ccltune keeps is 2B, (n-1)B and B, and the latency of a Switch dimension is the
two links through the switch. ASTRA-sim's docs define 1 GB as 2^30 B; ccltune's GB/s is 1e9 B/s.
The number is carried over unchanged (documented in docs/topology.md), as users enter vendor GB/s.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..api.cluster import ClusterTopology, Dimension
from .builder import build
from .errors import TopologyError
from .spec import ClusterSpec, IntraNode, Network, Nics, Pcie, Tier
from .symmetry import detect

_KINDS = {"switch": "Switch", "ring": "Ring", "fully_connected": "FullyConnected"}
_FROM = {v.lower(): k for k, v in _KINDS.items()}


def is_astra(data: Any) -> bool:
    return isinstance(data, dict) and "topology" in data and "npus_count" in data


def _links_out(kind: str, size: int) -> int:
    if kind == "ring":
        return 1 if size == 2 else 2
    if kind == "fully_connected":
        return size - 1
    return 1


def to_astra(dims: list[Dimension]) -> dict[str, list]:
    out: dict[str, list] = {"topology": [], "npus_count": [], "bandwidth": [], "latency": []}
    for dim in dims:
        out["topology"].append(_KINDS[dim.kind])
        out["npus_count"].append(dim.size)
        out["bandwidth"].append(round(dim.bandwidth_gbps / _links_out(dim.kind, dim.size), 9))
        hop = dim.latency_us / 2 if dim.kind == "switch" else dim.latency_us
        out["latency"].append(round(hop * 1000, 6))
    return out


def dump(dims: list[Dimension]) -> str:
    data = to_astra(dims)
    lines = [f"{key}: [ {', '.join(str(v) for v in values)} ]" for key, values in data.items()]
    return "\n".join(lines) + "\n"


def dimensions_from(data: dict, source: str) -> list[Dimension]:
    """Parse the four lists; one error line naming the key and the position."""
    for key in ("topology", "npus_count", "bandwidth", "latency"):
        if key not in data:
            raise TopologyError(f"{source}: {key}: required ASTRA-sim key is missing")
        if not isinstance(data[key], list) or not data[key]:
            raise TopologyError(f"{source}: {key}: must be a non-empty list, one entry per dimension")
    n = len(data["topology"])
    for key in ("npus_count", "bandwidth", "latency"):
        if len(data[key]) != n:
            raise TopologyError(f"{source}: {key}: has {len(data[key])} entries but topology has {n}")
    dims = []
    for i in range(n):
        name = data["topology"][i]
        kind = _FROM.get(str(name).lower())
        if kind is None:
            raise TopologyError(f"{source}: topology[{i}]: {name!r} is not Ring, FullyConnected or Switch")
        size, bw, lat = data["npus_count"][i], data["bandwidth"][i], data["latency"][i]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TopologyError(f"{source}: npus_count[{i}]: {size!r} is not a positive integer")
        if isinstance(bw, bool) or not isinstance(bw, int | float) or bw <= 0:
            raise TopologyError(f"{source}: bandwidth[{i}]: {bw!r} is not a positive number of GB/s")
        if isinstance(lat, bool) or not isinstance(lat, int | float) or lat < 0:
            raise TopologyError(f"{source}: latency[{i}]: {lat!r} is not a non-negative number of ns")
        hop_us = float(lat) / 1000
        dims.append(Dimension(
            name=f"dim{i}", kind=kind, size=size,
            bandwidth_gbps=float(bw) * _links_out(kind, size),
            latency_us=2 * hop_us if kind == "switch" else hop_us,
        ))
    return dims


def from_astra(data: dict, source: str, name: str = "astra-sim", gpus_per_node: int | None = None) -> ClusterTopology:
    """A ClusterTopology for an ASTRA-sim network. The innermost dimension is one server unless
    `gpus_per_node` says otherwise (it must be the product of the innermost dimensions)."""
    dims = dimensions_from(data, source)
    return from_dimensions(dims, name=name, gpus_per_node=gpus_per_node, source=source)


def from_dimensions(dims: list[Dimension], name: str, gpus_per_node: int | None = None,
                    source: str = "dimensions", node_names: list[str] | None = None) -> ClusterTopology:
    """Devices and links that realise `dims` (a server per innermost group, a switch tree above)."""
    inner = dims[0]
    gpn = gpus_per_node or inner.size
    if gpn != inner.size:
        raise TopologyError(f"{source}: the innermost dimension ({inner.size} GPUs) must be one server")
    world = 1
    for d in dims:
        world *= d.size
    servers = world // gpn
    if node_names is not None and len(node_names) != servers:
        raise TopologyError(f"{source}: nodes: {len(node_names)} listed but the dimensions need {servers}")
    outer = dims[1:]
    note = f"imported from ASTRA-sim network {source}"
    tree = all(d.kind == "switch" for d in outer) and all(
        outer[i].bandwidth_gbps <= outer[i - 1].bandwidth_gbps + 1e-12
        and outer[i].latency_us >= outer[i - 1].latency_us for i in range(1, len(outer))
    )
    if not tree:
        raise TopologyError(
            f"{source}: outer dimensions must be Switch with non-increasing bandwidth and non-decreasing "
            "latency to map onto a NIC/leaf/spine network (ccltune models the network as a switch tree)"
        )
    if inner.kind == "switch":
        intra = IntraNode(fabric="nvswitch", bandwidth_gbps=inner.bandwidth_gbps, latency_us=inner.latency_us)
    elif inner.kind == "ring" and inner.size > 2:
        intra = IntraNode(fabric="ring", link_bandwidth_gbps=inner.bandwidth_gbps / 2, latency_us=inner.latency_us)
    else:
        intra = IntraNode(fabric="fully_connected", link_bandwidth_gbps=inner.bandwidth_gbps / max(inner.size - 1, 1),
                          latency_us=inner.latency_us)
    tiers: list[Tier] = []
    nics = Nics()
    if outer:
        # One NIC per GPU at the first network dimension's rate; PCIe latency 0 so the NIC<->leaf
        # links carry the whole first-dimension latency and each tier adds its own.
        nics = Nics(per_server=gpn, rate_gbps=outer[0].bandwidth_gbps * 8, latency_us=outer[0].latency_us / 2)
        prev_bw, prev_lat = outer[0].bandwidth_gbps, outer[0].latency_us
        tiers.append(Tier(name="leaf", size=outer[0].size))
        for i, d in enumerate(outer[1:], start=1):
            tiers.append(Tier(name=("spine", "core")[i - 1] if i <= 2 else f"tier{i}", size=d.size,
                              oversubscription=prev_bw / d.bandwidth_gbps,
                              latency_us=(d.latency_us - prev_lat) / 2))
            prev_bw, prev_lat = d.bandwidth_gbps, d.latency_us
    spec = ClusterSpec(
        name=name, description=note, servers=node_names or servers, gpus_per_server=gpn, intra_node=intra,
        # PCIe is not in ASTRA-sim's format: size it to the first network dimension so it never
        # becomes the bottleneck the file does not describe. One switch per GPU and its NIC keeps
        # GPU-to-GPU routes off PCIe (4 hops through the CPU against the GPU fabric's 2), as
        # NCCL's P2P takes NVLink between GPUs that have it.
        pcie=Pcie(gpus_per_switch=1, cpus=1, latency_us=0.0,
                  bandwidth_gbps=max(outer[0].bandwidth_gbps, 31.5) if outer else None), nics=nics,
        network=Network(layout="tor", tiers=tiers),
        sources={"dimensions": note, "pcie": "not in ASTRA-sim's format: a switch per GPU and its NIC under one CPU, links sized to the first network dimension (at least Gen4 x16)"},
    )
    topo = detect(build(spec))
    return topo


def load_text(text: str, source: str) -> ClusterTopology:
    data = yaml.safe_load(text)
    return from_astra(data, source)
