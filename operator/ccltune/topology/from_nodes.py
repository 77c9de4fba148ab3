"""NodeTopology reports (one per node, from the agent) + Kubernetes node labels -> ClusterTopology.

Label keys read by default (first one present wins), overridable with `label_keys`:
- leaf:  network.topology.nvidia.com/leaf, network.topology.nvidia.com/block (topograph <= 0.1),
         ccltune.io/tor, ccltune.io/leaf
- spine: network.topology.nvidia.com/spine, ccltune.io/spine
- core:  network.topology.nvidia.com/core, network.topology.nvidia.com/datacenter (topograph <= 0.1),
         ccltune.io/core
- rail:  ccltune.io/rail — the node's rail group: NIC j of every node in the group is cabled to
         rail switch j of that group (rail-optimized). Without it, a node's NICs go to its leaf.
The network.topology.nvidia.com/* keys are what NVIDIA topograph writes (docs.nvidia.com/topograph,
"Topograph in Kubernetes"); their names are configurable in topograph's Helm chart, hence the
override here. Switch-to-switch links are taken as non-blocking unless `oversubscription` says
otherwise (labels carry no bandwidth).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..api.cluster import (
    ClusterNode,
    ClusterTopology,
    Device,
    DeviceKind,
    Link,
    LinkKind,
    NodeNcclTopology,
)
from ..api.nodetopology import NodeTopology, NodeTopologySpec
from .errors import TopologyError
from .nccl_xml import write_nccl_xml
from .spec import pcie_bandwidth
from .symmetry import detect

DEFAULT_LABEL_KEYS: dict[str, tuple[str, ...]] = {
    "leaf": ("network.topology.nvidia.com/leaf", "network.topology.nvidia.com/block",
             "ccltune.io/tor", "ccltune.io/leaf"),
    "spine": ("network.topology.nvidia.com/spine", "ccltune.io/spine"),
    "core": ("network.topology.nvidia.com/core", "network.topology.nvidia.com/datacenter", "ccltune.io/core"),
    "rail": ("ccltune.io/rail",),
}
# NVLink 2/3/4 carry 25 GB/s per link per direction (NVIDIA V100/A100/H100 datasheets).
DEFAULT_NVLINK_GBPS = 25.0
# Latencies as in the presets (docs/topology.md): NCCL tuning.cc hwLat LL split over links.
NVLINK_LAT, PCIE_LAT, NET_LAT, SWITCH_LAT, SMP_LAT = 0.6, 0.5, 2.5, 0.5, 0.5


def from_nodes(
    nodes: Sequence[NodeTopology | NodeTopologySpec],
    labels: Mapping[str, Mapping[str, str]],
    *,
    name: str = "cluster",
    label_keys: Mapping[str, str | Sequence[str]] | None = None,
    oversubscription: float = 1.0,
    smp_bandwidth_gbps: float = 32.0,
    keep_order: bool = False,
) -> ClusterTopology:
    """Join node reports and their labels (node name -> labels) into a ClusterTopology.

    Nodes are ordered by (core, spine, rail/leaf, name) so each switch domain holds consecutive
    ranks (`keep_order=True` keeps the given order); the result's `nodes` order defines global
    ranks. When no node has any fabric label, all nodes are taken to share one non-blocking
    switch (recorded in `sources`). Raises TopologyError naming the node when reports disagree
    or some nodes lack labels the others have.
    """
    specs = [n.spec if isinstance(n, NodeTopology) else n for n in nodes]
    if not specs:
        raise TopologyError("nodes: no NodeTopology objects given")
    if oversubscription < 1:
        raise TopologyError(f"oversubscription: {oversubscription} must be >= 1")
    keys = {k: tuple(v) for k, v in DEFAULT_LABEL_KEYS.items()}
    for role, override in (label_keys or {}).items():
        if role not in keys:
            raise TopologyError(f"label_keys: unknown role {role!r} (use {', '.join(keys)})")
        keys[role] = (override,) if isinstance(override, str) else tuple(override)
    names = [s.node_name for s in specs]
    dup = next((x for x in names if names.count(x) > 1), None)
    if dup:
        raise TopologyError(f"node {dup}: reported twice")
    _check_same_shape(specs)
    place = {s.node_name: _placement(s.node_name, labels.get(s.node_name, {}), keys) for s in specs}
    flat = not any("leaf" in p or "rail" in p for p in place.values())
    if flat:
        # No node carries fabric labels at all: one non-blocking switch is the only honest guess.
        for p in place.values():
            p["leaf"] = "unlabelled"
    elif len(specs) > 1:
        _check_labels(specs, place, keys)
    if not keep_order:
        specs.sort(key=lambda s: (place[s.node_name].get("core", ""), place[s.node_name].get("spine", ""),
                                  place[s.node_name].get("rail", place[s.node_name].get("leaf", "")), s.node_name))
    devices: list[Device] = []
    links: list[Link] = []
    nic_bw: dict[str, list[tuple[str, float]]] = {}
    for spec in specs:
        nic_bw[spec.node_name] = _server(spec, devices, links, smp_bandwidth_gbps)
    cluster_nodes = []
    for spec in specs:
        fabric = {k: v[:63] for k, v in place[spec.node_name].items()}
        layers = {p.link_layer for n in spec.nics for p in n.ports if p.link_layer != "unknown"}
        if len(layers) == 1:
            fabric["linkLayer"] = layers.pop()
        cluster_nodes.append(ClusterNode(name=spec.node_name, gpus=len(spec.gpus), fabric=fabric))
    if any(nic_bw.values()):  # a lone node keeps its leaf too, so NIC rates survive (NCCL XML)
        _network(specs, place, nic_bw, devices, links, oversubscription)
    gpu_name = specs[0].gpus[0].name if specs[0].gpus else ""
    cpus = {s.cpu.model_dump_json() if s.cpu else "" for s in specs}
    try:
        topo = ClusterTopology(
            name=name, description=f"{len(specs)} nodes from NodeTopology reports and node labels",
            gpu_model=gpu_name[:256], gpus_per_node=len(specs[0].gpus), nodes=cluster_nodes,
            devices=devices, links=links,
            host_cpu=specs[0].cpu if len(cpus) == 1 else None,
            nccl_topology=_nccl_topology(specs),
            sources={
                "devices": "NodeTopology reports of the ccltune agent (NVML, sysfs PCI and InfiniBand)",
                "network": "node labels " + ", ".join(k for ks in keys.values() for k in ks),
                "latency": "NCCL src/graph/tuning.cc hwLat LL: NVLink 0.6, PCI 1.0, NET 5.0 us per hop",
                "smp": f"assumption: {smp_bandwidth_gbps:g} GB/s between CPU sockets (not probed)",
                **({"assumption": "no node has fabric labels: all nodes assumed on one non-blocking switch"}
                   if flat and len(specs) > 1 else {}),
            },
        )
    except ValueError as exc:
        raise TopologyError(f"nodes: {exc}") from None
    return detect(topo)


def _nccl_topology(specs: list[NodeTopologySpec]) -> list[NodeNcclTopology]:
    """Each node's NCCL topology file from its own report (real bus ids), grouped when equal."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for spec in specs:
        groups.setdefault((write_nccl_xml(spec), spec.pcie_flattened), []).append(spec.node_name)
    return [NodeNcclTopology(nodes=nodes, xml=xml, pcie_hidden=hidden) for (xml, hidden), nodes in groups.items()]


def _placement(node: str, node_labels: Mapping[str, str], keys: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    out = {}
    for role, candidates in keys.items():
        for key in candidates:
            if node_labels.get(key):
                out[role] = str(node_labels[key])
                break
    return out


def _check_labels(specs: list[NodeTopologySpec], place: dict[str, dict[str, str]], keys: Mapping) -> None:
    """Every node needs a leaf (or rail) label; a spine label when leaves differ; core when spines do."""
    for spec in specs:
        p = place[spec.node_name]
        if "leaf" not in p and "rail" not in p:
            raise TopologyError(
                f"node {spec.node_name}: no leaf label (looked for {', '.join(keys['leaf'] + keys['rail'])})"
            )
    for upper, lower in (("spine", "leaf"), ("core", "spine")):
        lowers = {place[s.node_name].get("rail", place[s.node_name].get("leaf")) if lower == "leaf"
                  else place[s.node_name].get(lower) for s in specs}
        if len(lowers) <= 1:
            return
        for spec in specs:
            if upper not in place[spec.node_name]:
                raise TopologyError(
                    f"node {spec.node_name}: no {upper} label (looked for {', '.join(keys[upper])}), "
                    f"but nodes sit under different {lower} switches"
                )


def _check_same_shape(specs: list[NodeTopologySpec]) -> None:
    first = specs[0]
    for spec in specs:
        idx = sorted(g.index for g in spec.gpus)
        if not idx:
            raise TopologyError(f"node {spec.node_name}: reports no GPUs")
        if idx != list(range(len(idx))):
            raise TopologyError(f"node {spec.node_name}: GPU indices {idx} are not 0..{len(idx) - 1}")
        if len(spec.gpus) != len(first.gpus):
            raise TopologyError(
                f"node {spec.node_name}: has {len(spec.gpus)} GPUs but node {first.node_name} has {len(first.gpus)}"
            )
        if sorted(_nic_rates(spec).values()) != sorted(_nic_rates(first).values()):
            raise TopologyError(
                f"node {spec.node_name}: NIC rates {_fmt_rates(spec)} differ from node {first.node_name} "
                f"({_fmt_rates(first)})"
            )


def _nic_rates(spec: NodeTopologySpec) -> dict[str, float]:
    """Active ports only, Gb/s per NIC."""
    out = {}
    for nic in spec.nics:
        rate = sum(p.rate_gbps for p in nic.ports if p.state.upper() in ("ACTIVE", "4: ACTIVE", "UP"))
        if rate > 0:
            out[nic.name] = rate
    return out


def _fmt_rates(spec: NodeTopologySpec) -> str:
    rates = sorted(_nic_rates(spec).values())
    return "[" + ", ".join(f"{r:g}" for r in rates) + "] Gb/s" if rates else "no active NICs"


def _pcie_gbps(speed: str | None, width: int | None) -> float:
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", speed or "")
    if not match or not width:
        return pcie_bandwidth(4, 16)  # unknown: assume Gen4 x16
    return round(float(match.group(1)) * width * 128 / 130 / 8, 3)


def _server(spec: NodeTopologySpec, devices: list[Device], links: list[Link], smp_gbps: float) -> list[tuple[str, float]]:
    node = spec.node_name
    pci = {d.bus_id: d for d in spec.pci_devices}
    gpu_of_bus = {g.pci_bus_id.lower(): g.index for g in spec.gpus}
    for g in sorted(spec.gpus, key=lambda g: g.index):
        devices.append(Device(id=f"{node}/gpu{g.index}", kind=DeviceKind.GPU, node=node, local_index=g.index))
    numa_ids = sorted({n.id for n in spec.numa_nodes} | {g.numa_node for g in spec.gpus if g.numa_node >= 0}
                      | {n.numa_node for n in spec.nics if n.numa_node >= 0}) or [0]
    cpus = {k: f"{node}/cpu{k}" for k in numa_ids}
    for cid in cpus.values():
        devices.append(Device(id=cid, kind=DeviceKind.CPU, node=node))
    ids = list(cpus.values())
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            links.append(Link(a=ids[i], b=ids[j], kind=LinkKind.SMP, bandwidth_gbps=smp_gbps, latency_us=SMP_LAT))
    # NVLinks: sum per remote; NVSwitch links go to one aggregated NVSwitch device.
    nvswitch = f"{node}/nvswitch"
    pair_bw: dict[tuple[int, int], float] = {}
    for g in spec.gpus:
        to_switch = 0.0
        per_peer: dict[int, float] = {}
        for lk in g.nvlinks:
            if lk.state != "up":
                continue
            bw = lk.bandwidth_gbps or DEFAULT_NVLINK_GBPS
            if lk.remote_type == "nvswitch":
                to_switch += bw
            elif lk.remote_pci_bus_id and lk.remote_pci_bus_id.lower() in gpu_of_bus:
                peer = gpu_of_bus[lk.remote_pci_bus_id.lower()]
                per_peer[peer] = per_peer.get(peer, 0.0) + bw
        if to_switch:
            if not any(d.id == nvswitch for d in devices):
                devices.append(Device(id=nvswitch, kind=DeviceKind.NVSWITCH, node=node))
            links.append(Link(a=f"{node}/gpu{g.index}", b=nvswitch, kind=LinkKind.NVLINK,
                              bandwidth_gbps=to_switch, latency_us=NVLINK_LAT / 2))
        for peer, bw in per_peer.items():
            key = (min(g.index, peer), max(g.index, peer))
            pair_bw[key] = min(pair_bw.get(key, bw), bw)  # both ends report the same links
    # AMD GPUs report their Infinity Fabric (xGMI) peers through the same NVLink-shaped fields.
    amd = any(g.name.upper().startswith(("MI", "AMD")) for g in spec.gpus)
    for (a, b), bw in sorted(pair_bw.items()):
        links.append(Link(a=f"{node}/gpu{a}", b=f"{node}/gpu{b}", kind=LinkKind.XGMI if amd else LinkKind.NVLINK,
                          bandwidth_gbps=bw, latency_us=NVLINK_LAT))
    # PCIe switches as NCCL sees them: the upstream port two levels above an endpoint.
    switch_ids: dict[str, str] = {}

    def parent_of(bus: str | None, numa: int) -> str:
        if spec.pcie_flattened or bus is None or bus not in pci:
            return cpus.get(numa, ids[0])
        p1 = pci[bus].parent
        p2 = pci[p1].parent if p1 in pci else None
        if p2 is None or p2 not in pci:
            return cpus.get(pci[bus].numa_node if pci[bus].numa_node >= 0 else numa, ids[0])
        if p2 not in switch_ids:
            sid = f"{node}/pcie{len(switch_ids)}"
            switch_ids[p2] = sid
            devices.append(Device(id=sid, kind=DeviceKind.PCIE_SWITCH, node=node))
            up = parent_of(p2, pci[p2].numa_node if pci[p2].numa_node >= 0 else numa)
            links.append(Link(a=sid, b=up, kind=LinkKind.PCIE, latency_us=PCIE_LAT,
                              bandwidth_gbps=_pcie_gbps(pci[p2].max_link_speed or pci[p2].link_speed,
                                                        pci[p2].max_link_width or pci[p2].link_width)))
        return switch_ids[p2]

    def attach(dev: str, bus: str | None, numa: int) -> None:
        d = pci.get(bus or "")
        bw = _pcie_gbps(d.max_link_speed or d.link_speed, d.max_link_width or d.link_width) if d else pcie_bandwidth(4, 16)
        links.append(Link(a=dev, b=parent_of(bus, numa), kind=LinkKind.PCIE, bandwidth_gbps=bw, latency_us=PCIE_LAT))

    for g in sorted(spec.gpus, key=lambda g: g.index):
        attach(f"{node}/gpu{g.index}", g.pci_bus_id, g.numa_node)
    rates = _nic_rates(spec)
    out = []
    for j, nic in enumerate(n for n in spec.nics if n.name in rates):
        nid = f"{node}/nic{j}"
        devices.append(Device(id=nid, kind=DeviceKind.NIC, node=node))
        attach(nid, nic.pci_bus_id, nic.numa_node)
        out.append((nid, rates[nic.name] / 8))
    return out


def _network(specs: list[NodeTopologySpec], place: dict[str, dict[str, str]], nic_bw: dict[str, list[tuple[str, float]]],
             devices: list[Device], links: list[Link], oversub: float) -> None:
    down: dict[str, float] = {}
    up_of: dict[str, str] = {}

    def switch(sid: str, kind: DeviceKind) -> str:
        if sid not in down:
            down[sid] = 0.0
            devices.append(Device(id=sid[:128], kind=kind))
        return sid[:128]

    for spec in specs:
        p = place[spec.node_name]
        leaves = []
        for j, (nic, bw) in enumerate(nic_bw[spec.node_name]):
            leaf = switch(f"rail-{p['rail']}-{j}" if "rail" in p else f"leaf-{p['leaf']}", DeviceKind.LEAF)
            down[leaf] += bw
            links.append(Link(a=nic, b=leaf, kind=LinkKind.NET, bandwidth_gbps=bw, latency_us=NET_LAT))
            leaves.append(leaf)
        pairs = [(leaf, f"spine-{p['spine']}") for leaf in leaves] if "spine" in p else []
        if "spine" in p and "core" in p:
            pairs.append((f"spine-{p['spine']}", f"core-{p['core']}"))
        for low, up in pairs:
            if up_of.setdefault(low, up) != up:
                raise TopologyError(
                    f"node {spec.node_name}: labels put switch {low} under {up}, other nodes under {up_of[low]}"
                )
    # Uplinks after all NICs are placed, so each carries its switch's full downlink / oversubscription.
    for tier_kind in ("leaf", "spine"):
        for low, up in sorted(up_of.items()):
            if not low.startswith(("leaf-", "rail-") if tier_kind == "leaf" else ("spine-",)):
                continue
            upper = switch(up, DeviceKind.SPINE)
            bw = down[low] / oversub
            down[upper] += bw
            links.append(Link(a=low, b=upper, kind=LinkKind.NET, bandwidth_gbps=bw, latency_us=SWITCH_LAT))
