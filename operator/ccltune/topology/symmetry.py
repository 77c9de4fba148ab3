"""Dimension and isomorphic-group detection (SyCCL's observation 1).

A fabric is symmetric when every server has the same inner fabric (an NVSwitch, a full mesh or a
ring of equal links) and the network above the NICs is a tree of equal domains: servers that
share the same tier-0 switches form a leaf domain, leaf domains that share the same upper
switches form the next domain, and so on. Each level becomes one dimension, innermost first.

Per-GPU bandwidth of a dimension is what one GPU can push into it per direction when all GPUs
do so at once: the NVSwitch link; (n-1) mesh links; 2 ring links; the server's NIC bandwidth
divided by its GPUs; and higher tiers scaled down by their oversubscription. Latency is the
GPU-to-GPU path latency inside one group of that dimension.
"""

from __future__ import annotations

from collections import defaultdict, deque
from fractions import Fraction

from ..api.cluster import ClusterTopology, DeviceKind, Dimension, Link, LinkKind

_GPU_LINKS = (LinkKind.NVLINK, LinkKind.XGMI)
_TIER_NAMES = ("spine", "core")


class Asymmetric(Exception):
    """Why no symmetric dimensions exist; the message names the node or switch."""


def detect(topo: ClusterTopology) -> ClusterTopology:
    """`topo` with `dimensions` detected from its devices and links (or an asymmetry reason)."""
    try:
        dims = dimensions_of(topo)
    except Asymmetric as why:
        return topo.model_copy(update={"dimensions": None, "asymmetry_reason": str(why)[:1024]})
    return topo.model_copy(update={"dimensions": dims, "asymmetry_reason": None})


def groups(topo: ClusterTopology, dim_index: int) -> list[list[int]]:
    """Ranks of every group in dimension `dim_index`: all coordinates fixed except that one."""
    if topo.dimensions is None:
        raise ValueError(f"cluster {topo.name!r} is not symmetric: {topo.asymmetry_reason}")
    if not 0 <= dim_index < len(topo.dimensions):
        raise ValueError(f"dimension {dim_index} out of range: {topo.name!r} has {len(topo.dimensions)}")
    inner = 1
    for dim in topo.dimensions[:dim_index]:
        inner *= dim.size
    size = topo.dimensions[dim_index].size
    block = inner * size
    out = []
    for start in range(0, topo.world_size, block):
        for offset in range(inner):
            out.append([start + offset + k * inner for k in range(size)])
    return out


class _Graph:
    def __init__(self, topo: ClusterTopology) -> None:
        self.kind = {d.id: d.kind for d in topo.devices}
        self.node = {d.id: d.node for d in topo.devices}
        self.adj: dict[str, list[tuple[str, Link]]] = defaultdict(list)
        for link in topo.links:
            self.adj[link.a].append((link.b, link))
            self.adj[link.b].append((link.a, link))

    def neighbours(self, dev: str, *kinds: DeviceKind) -> list[tuple[str, Link]]:
        return [(o, lk) for o, lk in self.adj.get(dev, []) if self.kind.get(o) in kinds]


def dimensions_of(topo: ClusterTopology) -> list[Dimension]:
    """The dimensions, innermost first; raises Asymmetric with the reason."""
    if not topo.devices:
        raise Asymmetric("no devices or links given, so nothing to detect symmetry from")
    g = _Graph(topo)
    for rank in range(topo.world_size):
        gid = topo.gpu_id(rank)
        if g.kind.get(gid) != DeviceKind.GPU:
            raise Asymmetric(f"node {topo.nodes[rank // topo.gpus_per_node].name}: no GPU device {gid!r}")
    dims: list[Dimension] = []
    inner = _intra(topo, g)
    if inner is not None:
        dims.append(inner)
    if topo.node_count > 1:
        dims += _network(topo, g)
    return dims


# ---- inside one server ---------------------------------------------------------------------


def _intra(topo: ClusterTopology, g: _Graph) -> Dimension | None:
    n = topo.gpus_per_node
    if n == 1:
        return None
    sigs = [(_node_signature(topo, g, node.name), node.name) for node in topo.nodes]
    first, first_name = sigs[0]
    for sig, name in sigs[1:]:
        if sig != first:
            diff = sorted(set(sig) ^ set(first))[0]
            raise Asymmetric(f"node {name}: inner fabric differs from node {first_name} at {_fmt(diff)}")
    return _classify(first, n, first_name)


def _fmt(entry: tuple) -> str:
    kind, a, b, bw, _lat = entry
    return f"{kind} gpu{a}-gpu{b} {bw:g} GB/s" if kind != "nvswitch" else f"gpu{a}->nvswitch {bw:g} GB/s"


def _node_signature(topo: ClusterTopology, g: _Graph, node: str) -> tuple:
    """Inner GPU fabric keyed by local indices: direct GPU links and GPU->NVSwitch links."""
    entries = []
    local = {}
    for i in range(topo.gpus_per_node):
        local[f"{node}/gpu{i}"] = i
    for gid, i in local.items():
        for other, link in g.adj.get(gid, []):
            okind = g.kind.get(other)
            if okind == DeviceKind.GPU and link.kind in _GPU_LINKS:
                if other not in local:
                    raise Asymmetric(f"node {node}: gpu{i} has an NVLink to {other} in another node")
                j = local[other]
                if i < j:
                    entries.append((str(link.kind), i, j, link.bandwidth_gbps, link.latency_us))
            elif okind == DeviceKind.NVSWITCH:
                entries.append(("nvswitch", i, -1, link.bandwidth_gbps, link.latency_us))
    return tuple(sorted(entries))


def _classify(sig: tuple, n: int, node: str) -> Dimension:
    switch = [e for e in sig if e[0] == "nvswitch"]
    direct = [e for e in sig if e[0] != "nvswitch"]
    if switch and direct:
        raise Asymmetric(f"node {node}: GPUs use both an NVSwitch and direct NVLinks")
    if switch:
        sw_bws = {e[3] for e in switch}
        if len(switch) != n or len({e[1] for e in switch}) != n:
            missing = sorted(set(range(n)) - {e[1] for e in switch})
            raise Asymmetric(f"node {node}: gpu{missing[0] if missing else '?'} is not on the NVSwitch")
        if len(sw_bws) != 1:
            listed = ", ".join(f"{b:g}" for b in sorted(sw_bws))
            raise Asymmetric(f"node {node}: NVSwitch link bandwidths differ ({listed} GB/s)")
        lat = 2 * max(e[4] for e in switch)
        return Dimension(name="nvswitch", kind="switch", size=n, bandwidth_gbps=sw_bws.pop(), latency_us=lat)
    if not direct:
        raise Asymmetric(
            f"node {node}: GPUs reach each other only through PCIe/CPU; NCCL's paths differ by pair "
            "(PIX/PXB/SYS), so there is no symmetric inner dimension"
        )
    bws = sorted({e[3] for e in direct})
    pairs = {(e[1], e[2]) for e in direct}
    full = n * (n - 1) // 2
    lat = max(e[4] for e in direct)
    name = "xgmi" if direct[0][0] == LinkKind.XGMI else "nvlink"
    if len(bws) > 1:
        lo = next(e for e in direct if e[3] == bws[0])
        hi = next(e for e in direct if e[3] == bws[-1])
        raise Asymmetric(
            f"node {node}: NVLink per-pair bandwidth differs (gpu{lo[1]}-gpu{lo[2]} {bws[0]:g} GB/s vs "
            f"gpu{hi[1]}-gpu{hi[2]} {bws[-1]:g} GB/s), as in a hybrid cube-mesh"
        )
    bw = bws[0]
    if len(pairs) == full:
        return Dimension(name=name, kind="fully_connected", size=n, bandwidth_gbps=bw * (n - 1), latency_us=lat)
    degree: dict[int, int] = defaultdict(int)
    for a, b in pairs:
        degree[a] += 1
        degree[b] += 1
    if n >= 3 and len(pairs) == n and all(degree[i] == 2 for i in range(n)) and _one_cycle(pairs, n):
        return Dimension(name=name, kind="ring", size=n, bandwidth_gbps=2 * bw, latency_us=lat)
    gap = min((x, y) for x in range(n) for y in range(x + 1, n) if (x, y) not in pairs)
    raise Asymmetric(
        f"node {node}: NVLink joins only {len(pairs)} of {full} GPU pairs (gpu{gap[0]}-gpu{gap[1]} has none; "
        "it goes over PCIe), so GPUs are not interchangeable"
    )


def _one_cycle(pairs: set[tuple[int, int]], n: int) -> bool:
    adj: dict[int, list[int]] = defaultdict(list)
    for a, b in pairs:
        adj[a].append(b)
        adj[b].append(a)
    seen, prev, cur = {0}, -1, 0
    while True:
        nxt = next((x for x in adj[cur] if x != prev), None)
        if nxt is None or nxt == 0:
            break
        if nxt in seen:
            return False
        seen.add(nxt)
        prev, cur = cur, nxt
    return len(seen) == n


# ---- the network above the NICs ------------------------------------------------------------


def _network(topo: ClusterTopology, g: _Graph) -> list[Dimension]:
    names = [n.name for n in topo.nodes]
    gpn = topo.gpus_per_node
    nics_of: dict[str, list[str]] = defaultdict(list)
    for dev, kind in g.kind.items():
        if kind == DeviceKind.NIC:
            owner = g.node.get(dev) or (dev.split("/", 1)[0] if "/" in dev else "")
            nics_of[owner].append(dev)
    # Tier 0: which switches each server's NICs reach, and with how much bandwidth.
    leaves_of: list[frozenset[str]] = []
    nic_bw: list[float] = []
    nic_lat = 0.0
    for name in names:
        ups: set[str] = set()
        total = 0.0
        for nic in nics_of.get(name, []):
            for sw, link in g.neighbours(nic, DeviceKind.LEAF, DeviceKind.SPINE):
                ups.add(sw)
                total += link.bandwidth_gbps
                nic_lat = max(nic_lat, link.latency_us)
        if not ups:
            raise Asymmetric(f"node {name}: no NIC linked to a leaf switch, so it cannot reach other nodes")
        leaves_of.append(frozenset(ups))
        nic_bw.append(total)
    for i, bw in enumerate(nic_bw):
        if abs(bw - nic_bw[0]) > 1e-9 * max(bw, 1):
            raise Asymmetric(f"node {names[i]}: NIC bandwidth {bw:g} GB/s differs from node {names[0]} ({nic_bw[0]:g} GB/s)")
    # What the GPUs of one node can push out together, through PCIe/CPU to their NICs (GPUs are
    # not transit hops): equals NIC bandwidth / GPUs unless PCIe is the bottleneck, e.g. when a
    # communicator keeps 1 GPU per node but all 8 NICs.
    per_gpu = min(nic_bw[0], _egress(g, names[0], nics_of[names[0]])) / gpn
    base_lat = 2 * (_gpu_nic_latency(topo, g, names[0], nics_of[names[0]]) + nic_lat)
    rail = len(leaves_of[0]) > 1 and all(
        len({sw for sw, _ in g.neighbours(nic, DeviceKind.LEAF, DeviceKind.SPINE)}) == 1
        for nic in nics_of[names[0]]
    ) and len(leaves_of[0]) == len(nics_of[names[0]])
    dims: list[Dimension] = []
    # Each domain: (member servers by index, its top switches).
    domains = _merge([([i], s) for i, s in enumerate(leaves_of)], names, "leaf")
    _check_contiguous(domains, names)
    size0 = len(domains[0][0])
    if size0 > 1:
        dims.append(Dimension(name="rail" if rail else "leaf", kind="switch", size=size0,
                              bandwidth_gbps=per_gpu, latency_us=base_lat))
    seen: set[str] = set().union(*(s for _, s in domains))
    level, span, lat = 0, size0, base_lat
    while len(domains) > 1:
        level += 1
        lifted = []
        up_lat = 0.0
        for members, switches in domains:
            above: set[str] = set()
            cap = 0.0
            for sw in switches:
                for other, link in g.neighbours(sw, DeviceKind.LEAF, DeviceKind.SPINE):
                    if other not in seen:
                        above.add(other)
                        cap += link.bandwidth_gbps
                        up_lat = max(up_lat, link.latency_us)
            if not above:
                raise Asymmetric(
                    f"node {names[members[0]]}: switches {', '.join(sorted(switches))} have no uplink, "
                    "so the cluster is split"
                )
            lifted.append((members, frozenset(above), cap))
        caps = {round(c, 9) for _, _, c in lifted}
        if len(caps) != 1:
            odd = next(m for m, _, c in lifted if round(c, 9) != round(lifted[0][2], 9))
            raise Asymmetric(f"node {names[odd[0]]}: its domain's uplink bandwidth differs from node {names[0]}'s")
        cap = lifted[0][2]
        gpus_below = span * gpn
        per_gpu = min(per_gpu, cap / gpus_below)
        merged = _merge([(m, s) for m, s, _ in lifted], names, _TIER_NAMES[min(level - 1, 1)])
        size = len(merged[0][0]) // span
        _check_contiguous(merged, names)
        lat += 2 * up_lat
        if size > 1:
            tier = _TIER_NAMES[level - 1] if level - 1 < len(_TIER_NAMES) else f"tier{level}"
            last = dims[-1] if dims else None
            if last is not None and abs(last.bandwidth_gbps - per_gpu) <= 1e-9 * max(per_gpu, 1.0):
                # A non-blocking tier adds no bandwidth step: for scheduling it is the same
                # switch dimension, only larger (SyCCL treats a non-blocking Clos as one switch).
                # The slower (outer) path latency is kept.
                dims[-1] = Dimension(name=f"{last.name}+{tier}"[:64], kind="switch", size=last.size * size,
                                     bandwidth_gbps=per_gpu, latency_us=lat)
            else:
                dims.append(Dimension(name=tier, kind="switch", size=size, bandwidth_gbps=per_gpu, latency_us=lat))
        seen |= set().union(*(s for _, s in merged))
        span *= size
        domains = merged
    return dims


def _merge(parts: list[tuple[list[int], frozenset[str]]], names: list[str], what: str) -> list[tuple[list[int], frozenset[str]]]:
    """Group parts sharing the same switch set; partial overlaps and unequal groups are asymmetric."""
    by_set: dict[frozenset[str], list[int]] = {}
    for members, switches in parts:
        by_set.setdefault(switches, []).extend(members)
    owner: dict[str, frozenset[str]] = {}
    for switches in by_set:
        for sw in switches:
            if sw in owner:
                a, b = by_set[owner[sw]][0], by_set[switches][0]
                raise Asymmetric(
                    f"node {names[b]}: shares {what} switch {sw} with node {names[a]} but not all of them"
                )
            owner[sw] = switches
    merged = sorted(((sorted(m), s) for s, m in by_set.items()), key=lambda x: x[0][0])
    sizes = {len(m) for m, _ in merged}
    if len(sizes) != 1:
        small = min(merged, key=lambda x: len(x[0]))
        big = max(merged, key=lambda x: len(x[0]))
        raise Asymmetric(
            f"node {names[small[0][0]]}: its {what} domain has {len(small[0])} nodes, "
            f"node {names[big[0][0]]}'s has {len(big[0])}"
        )
    return merged


def _check_contiguous(domains: list[tuple[list[int], frozenset[str]]], names: list[str]) -> None:
    for members, _ in domains:
        if members != list(range(members[0], members[0] + len(members))):
            gap = next(m for k, m in enumerate(members) if m != members[0] + k)
            raise Asymmetric(
                f"node {names[gap]}: nodes sharing a switch domain are not consecutive in node order "
                "(list nodes grouped by leaf/spine so ranks follow the fabric)"
            )


def _egress(g: _Graph, node: str, nics: list[str]) -> float:
    """Max flow from all GPUs of `node` to its NICs' network links, never entering a GPU."""
    prefix = f"{node}/"
    local = {d for d in g.kind if g.node.get(d) == node or d.startswith(prefix)}
    cap: dict[str, dict[str, Fraction]] = defaultdict(dict)
    gpus = []
    for dev in local:
        for other, link in g.adj.get(dev, []):
            if other not in local or g.kind.get(other) == DeviceKind.GPU:
                continue
            cap[dev][other] = cap[dev].get(other, Fraction(0)) + Fraction(link.bandwidth_gbps)
        if g.kind.get(dev) == DeviceKind.GPU:
            gpus.append(dev)
    for nic in nics:
        out = sum(lk.bandwidth_gbps for _, lk in g.neighbours(nic, DeviceKind.LEAF, DeviceKind.SPINE))
        cap[nic][_SINK] = Fraction(out)
    # A GPU's own send is unbounded: more than every link together never binds.
    unbounded = 1 + sum((c for outs in cap.values() for c in outs.values()), Fraction(0))
    for gpu in gpus:
        cap[_SOURCE][gpu] = unbounded
    return float(_max_flow(cap, _SOURCE, _SINK))


# Not device ids (those are "node/device"): the flow network's own ends.
_SOURCE, _SINK = "<source>", "<sink>"


def _max_flow(cap: dict[str, dict[str, Fraction]], source: str, sink: str) -> Fraction:
    """Edmonds-Karp (shortest augmenting paths), in exact arithmetic so the value does not
    depend on the order paths are found. A node has a few dozen devices: this is cheaper than
    importing a graph library (networkx took ~0.1 s of every CLI start)."""
    residual: dict[str, dict[str, Fraction]] = defaultdict(dict)
    for a, outs in cap.items():
        for b, c in outs.items():
            residual[a][b] = residual[a].get(b, Fraction(0)) + c
            residual[b].setdefault(a, Fraction(0))
    total = Fraction(0)
    while True:
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            a = queue.popleft()
            for b, c in residual[a].items():
                if c > 0 and b not in parent:
                    parent[b] = a
                    queue.append(b)
        if sink not in parent:
            return total
        path = [sink]
        while path[-1] != source:
            path.append(parent[path[-1]])
        push = min(residual[parent[b]][b] for b in path[:-1])
        for b in path[:-1]:
            a = parent[b]
            residual[a][b] -= push
            residual[b][a] += push
        total += push


def _gpu_nic_latency(topo: ClusterTopology, g: _Graph, node: str, nics: list[str]) -> float:
    """Latency from gpu0 of `node` to its nearest NIC through PCIe/CPU devices (fewest hops)."""
    start = f"{node}/gpu0"
    targets = set(nics)
    frontier = {start: 0.0}
    visited = {start}
    for _ in range(8):
        nxt: dict[str, float] = {}
        for dev, lat in frontier.items():
            for other, link in g.adj.get(dev, []):
                if other in visited or g.kind.get(other) == DeviceKind.GPU:
                    continue
                if g.kind.get(other) not in (DeviceKind.PCIE_SWITCH, DeviceKind.CPU, DeviceKind.NIC):
                    continue
                cand = lat + link.latency_us
                if other not in nxt or cand < nxt[other]:
                    nxt[other] = cand
        hits = [lat for dev, lat in nxt.items() if dev in targets]
        if hits:
            return min(hits)
        visited |= set(nxt)
        frontier = {d: lat for d, lat in nxt.items() if g.kind.get(d) != DeviceKind.NIC}
        if not frontier:
            break
    return 0.0
