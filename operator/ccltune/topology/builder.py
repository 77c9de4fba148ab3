"""ClusterSpec (compact form) -> ClusterTopology device/link graph.

Graph convention (the router in model/routing.py depends on it):
- `<node>/gpu<i>`; one aggregated `<node>/nvswitch` when the server has NVSwitches (the real
  parallel NVSwitch chips carry equal shares of every GPU's links, so one device with the GPU's
  full per-direction NVLink bandwidth is equivalent for routing and contention);
- direct GPU<->GPU links for meshes, bridges and xGMI, one link per pair (parallel links summed);
- `<node>/cpu<k>` sockets joined by SMP links, `<node>/pcie<k>` switches below them, GPUs and
  `<node>/nic<j>` below the switches;
- tier-0 switches (`leaf`, kind leaf) above the NICs, higher tiers (kind spine) above those, one
  aggregated link per (lower switch, upper switch) pair.
GPUs are never transit hops, so every GPU pair is joined through switches, NICs or PCIe/CPU.
"""

from __future__ import annotations

import math

from ..api.cluster import ClusterNode, ClusterTopology, Device, DeviceKind, Link, LinkKind
from .errors import TopologyError
from .spec import ClusterSpec, Tier


def tier_sizes(spec: ClusterSpec) -> list[Tier]:
    """The network tiers with every size filled in (the last may be inferred)."""
    servers = len(spec.server_names)
    default_name = "rail" if spec.network.layout == "rail" else "leaf"
    if servers == 1:
        # A lone server keeps one leaf so its NICs carry their rate (NCCL XML, node_spec).
        return [Tier(name=default_name, size=1)] if spec.nics.per_server else []
    tiers = list(spec.network.tiers) or [Tier(name=default_name)]
    known = 1
    for i, tier in enumerate(tiers):
        if tier.size is None and i != len(tiers) - 1:
            raise TopologyError(f"network.tiers[{i}].size: only the last tier's size may be left out")
        if tier.size is not None:
            known *= tier.size
    last = tiers[-1]
    if last.size is None:
        if servers % known:
            raise TopologyError(
                f"network.tiers: sizes {known} do not divide the {servers} servers evenly"
            )
        tiers[-1] = last.model_copy(update={"size": servers // known})
    elif known != servers:
        raise TopologyError(f"network.tiers: sizes multiply to {known} servers but there are {servers}")
    if spec.network.layout == "rail" and tiers[0].switches != 1:
        raise TopologyError("network.tiers[0].switches: a rail layout has one leaf per NIC already")
    return tiers


def build(spec: ClusterSpec) -> ClusterTopology:
    """The full device/link graph, without dimensions (symmetry.detect fills those in)."""
    names = spec.server_names
    if len(names) > 1 and spec.nics.per_server == 0:
        raise TopologyError(f"nics.perServer: {len(names)} servers need at least one NIC each")
    devices: list[Device] = []
    links: list[Link] = []
    nic_ids: list[list[str]] = []
    for name in names:
        nic_ids.append(_server(spec, name, devices, links))
    nodes = [ClusterNode(name=n, gpus=spec.gpus_per_server) for n in names]
    if spec.nics.per_server:
        nodes = _network(spec, nic_ids, devices, links)
    try:
        return ClusterTopology(
            name=spec.name,
            description=spec.description,
            gpu_model=spec.gpu_model,
            gpus_per_node=spec.gpus_per_server,
            nodes=nodes,
            devices=devices,
            links=links,
            sources=spec.sources,
            host_cpu=spec.cpu,
            transport=spec.nics.transport,
        )
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        raise TopologyError(f"cluster {spec.name!r}: {exc}") from exc


def _server(spec: ClusterSpec, node: str, devices: list[Device], links: list[Link]) -> list[str]:
    g = spec.gpus_per_server
    intra = spec.intra_node
    gpus = [f"{node}/gpu{i}" for i in range(g)]
    devices += [Device(id=gid, kind=DeviceKind.GPU, node=node, local_index=i) for i, gid in enumerate(gpus)]
    kind = LinkKind.XGMI if intra.link_kind == "xgmi" else LinkKind.NVLINK
    if intra.fabric == "nvswitch" and g > 1:
        sw = f"{node}/nvswitch"
        devices.append(Device(id=sw, kind=DeviceKind.NVSWITCH, node=node))
        assert intra.bandwidth_gbps is not None
        for gid in gpus:
            links.append(Link(a=gid, b=sw, kind=LinkKind.NVLINK, bandwidth_gbps=intra.bandwidth_gbps,
                              latency_us=intra.latency_us / 2))
    elif intra.fabric in ("fully_connected", "ring") and g > 1:
        assert intra.link_bandwidth_gbps is not None
        if intra.fabric == "fully_connected":
            pairs = [(a, b) for a in range(g) for b in range(a + 1, g)]
        else:
            pairs = sorted({tuple(sorted((i, (i + 1) % g))) for i in range(g)})  # type: ignore[misc]
        for a, b in pairs:
            links.append(Link(a=gpus[a], b=gpus[b], kind=kind, bandwidth_gbps=intra.link_bandwidth_gbps,
                              latency_us=intra.latency_us))
    elif intra.fabric in ("mesh", "pcie") and intra.links:
        assert intra.link_bandwidth_gbps is not None
        counts: dict[tuple[int, int], int] = {}
        for link in intra.links:
            a, b = sorted(link[:2])
            counts[(a, b)] = counts.get((a, b), 0) + (link[2] if len(link) == 3 else 1)
        for (a, b), count in sorted(counts.items()):
            # Parallel NVLinks between one pair add up (DGX-1 "NV2" pairs carry twice the bandwidth).
            links.append(Link(a=gpus[a], b=gpus[b], kind=kind,
                              bandwidth_gbps=count * intra.link_bandwidth_gbps, latency_us=intra.latency_us))
    return _pcie_tree(spec, node, gpus, devices, links)


def _pcie_tree(spec: ClusterSpec, node: str, gpus: list[str], devices: list[Device], links: list[Link]) -> list[str]:
    p = spec.pcie
    cpus = [f"{node}/cpu{c}" for c in range(p.cpus)]
    devices += [Device(id=c, kind=DeviceKind.CPU, node=node) for c in cpus]
    for i in range(len(cpus)):
        for j in range(i + 1, len(cpus)):
            links.append(Link(a=cpus[i], b=cpus[j], kind=LinkKind.SMP, bandwidth_gbps=p.smp_bandwidth_gbps,
                              latency_us=p.smp_latency_us))
    bw = p.link_gbps
    parents: list[str]
    if p.gpus_per_switch > 0:
        nsw = math.ceil(len(gpus) / p.gpus_per_switch)
        parents = [f"{node}/pcie{k}" for k in range(nsw)]
        for k, sw in enumerate(parents):
            devices.append(Device(id=sw, kind=DeviceKind.PCIE_SWITCH, node=node))
            links.append(Link(a=sw, b=cpus[k * len(cpus) // nsw], kind=LinkKind.PCIE, bandwidth_gbps=bw,
                              latency_us=p.latency_us))
        gpu_parent = [parents[i // p.gpus_per_switch] for i in range(len(gpus))]
    else:
        parents = cpus
        gpu_parent = [cpus[i * len(cpus) // len(gpus)] for i in range(len(gpus))]
    for gid, parent in zip(gpus, gpu_parent, strict=True):
        links.append(Link(a=gid, b=parent, kind=LinkKind.PCIE, bandwidth_gbps=bw, latency_us=p.latency_us))
    nics = [f"{node}/nic{j}" for j in range(spec.nics.per_server)]
    for j, nic in enumerate(nics):
        devices.append(Device(id=nic, kind=DeviceKind.NIC, node=node))
        parent = parents[j * len(parents) // len(nics)]
        links.append(Link(a=nic, b=parent, kind=LinkKind.PCIE, bandwidth_gbps=bw, latency_us=p.latency_us))
    return nics


def _network(spec: ClusterSpec, nic_ids: list[list[str]], devices: list[Device], links: list[Link]) -> list[ClusterNode]:
    tiers = tier_sizes(spec)
    names = spec.server_names
    nic_gbs = spec.nics.rate_gbps / 8  # Gb/s -> GB/s
    rail = spec.network.layout == "rail"
    t0 = tiers[0]
    assert t0.size is not None
    fabric: list[dict[str, str]] = [{"linkLayer": spec.nics.link_layer} for _ in names]
    # Tier 0: leaves, and how much NIC bandwidth each one carries downwards.
    down_bw: dict[str, float] = {}
    lower_of_domain: dict[int, list[str]] = {}
    for n, nics in enumerate(nic_ids):
        dom = n // t0.size
        fabric[n][t0.name] = f"{t0.name}{dom}"
        for j, nic in enumerate(nics):
            if rail:
                leaf = f"{t0.name}{j}" if len(names) == t0.size else f"{t0.name}{dom}-{j}"
            elif t0.switches > 1:
                leaf = f"{t0.name}{dom}-{j % t0.switches}"
            else:
                leaf = f"{t0.name}{dom}"
            if leaf not in down_bw:
                down_bw[leaf] = 0.0
                devices.append(Device(id=leaf, kind=DeviceKind.LEAF))
                lower_of_domain.setdefault(dom, []).append(leaf)
            down_bw[leaf] += nic_gbs
            links.append(Link(a=nic, b=leaf, kind=LinkKind.NET, bandwidth_gbps=nic_gbs,
                              latency_us=spec.nics.latency_us))
    span = t0.size
    for tier in tiers[1:]:
        assert tier.size is not None
        upper_of_domain: dict[int, list[str]] = {}
        for dom, lowers in sorted(lower_of_domain.items()):
            parent = dom // tier.size
            if parent not in upper_of_domain:
                ups = [f"{tier.name}{parent}" if tier.switches == 1 else f"{tier.name}{parent}-{k}"
                       for k in range(tier.switches)]
                upper_of_domain[parent] = ups
                for up in ups:
                    devices.append(Device(id=up, kind=DeviceKind.SPINE))
                    down_bw[up] = 0.0
            for low in lowers:
                share = down_bw[low] / tier.oversubscription / tier.switches
                for up in upper_of_domain[parent]:
                    links.append(Link(a=low, b=up, kind=LinkKind.NET, bandwidth_gbps=share,
                                      latency_us=tier.latency_us))
                    down_bw[up] += share
        span *= tier.size
        for n in range(len(names)):
            fabric[n][tier.name] = f"{tier.name}{n // span}"
        lower_of_domain = upper_of_domain
    return [ClusterNode(name=nm, gpus=spec.gpus_per_server, fabric=fabric[i]) for i, nm in enumerate(names)]
