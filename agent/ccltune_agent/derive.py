"""Derived facts: NCCL's GPU-NIC path classes, the GPU->NIC binding, flattened-PCIe detection.

NCCL models the PCI tree with one node per PCIe switch: walking up from a device it skips one
sysfs level ("rewind two '/'", NCCL src/graph/xml.c ncclTopoGetPciNode) so each switch appears
as its upstream port, and it stops at the root complex, which becomes the CPU (NUMA) node.
Path classes as NCCL and `nvidia-smi topo -m` define them:
  PIX  traversing at most a single PCIe bridge (switch)
  PXB  traversing multiple PCIe bridges, without the PCIe host bridge
  PHB  traversing PCIe and a PCIe host bridge (the CPU)
  SYS  traversing PCIe and the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)
NCCL has no NODE class: host bridges of one NUMA node are one CPU node there, so that is PHB.
"""

from __future__ import annotations

from collections import defaultdict

from ccltune.api.nodetopology import Distance
from ccltune.topology.nccl_xml import switch_chain as nccl_switch_chain

from .sysfs import NicInfo, PciInfo


def switch_chain(bus_id: str, pci: dict[str, PciInfo]) -> list[str]:
    """The PCIe switches above a device, nearest first, each named by its upstream port."""
    return nccl_switch_chain(bus_id, {b: i.parent for b, i in pci.items()})


def has_bridge_above(bus_id: str, pci: dict[str, PciInfo]) -> bool:
    info = pci.get(bus_id)
    return bool(info and info.parent)


def numa_of(bus_id: str, pci: dict[str, PciInfo]) -> int:
    info = pci.get(bus_id)
    return info.numa_node if info else -1


def distance(a: str, b: str, pci: dict[str, PciInfo]) -> Distance:
    """NCCL path class between two PCI endpoints (both must be in `pci` to get better than SYS)."""
    ca, cb = switch_chain(a, pci), switch_chain(b, pci)
    common = [s for s in ca if s in cb]
    if common:
        lca = common[0]
        switches = ca.index(lca) + cb.index(lca) + 1
        return Distance.PIX if switches <= 1 else Distance.PXB
    na, nb = numa_of(a, pci), numa_of(b, pci)
    # Unknown NUMA (-1) on both sides means a single-socket view: same CPU node.
    if na == nb or (na == -1 and nb == -1):
        return Distance.PHB
    return Distance.SYS


_RANK = {Distance.NVL: 0, Distance.PIX: 1, Distance.PXB: 2, Distance.PHB: 3, Distance.SYS: 4}


def is_flattened(endpoints: list[str], pci: dict[str, PciInfo]) -> bool:
    """True when a VM hides the PCIe tree: several GPUs/NICs, none with any bridge above it."""
    known = [e for e in endpoints if e in pci]
    return len(known) >= 2 and not any(has_bridge_above(e, pci) for e in known)


def _usable(nic: NicInfo) -> bool:
    return any(p.state.upper() in ("ACTIVE", "UP") for p in nic.ports)


def bind_gpus(gpu_buses: dict[int, str], nics: list[NicInfo], pci: dict[str, PciInfo]) -> dict[int, str]:
    """TuCCL stage 1: each GPU gets the nearest NIC; GPUs tied on the same NICs share them round-robin.

    Preference: RDMA NICs over plain netdevs, NICs with an active port over inactive ones, then
    the NCCL distance class. GPUs with the same candidate set are assigned in index order to the
    candidates in name order, so two GPUs behind one switch with two NICs get one NIC each.
    """
    pool = [n for n in nics if n.bus_id]
    if not pool:
        return {}
    for keep in (lambda n: n.rdma and _usable(n), lambda n: n.rdma, _usable, lambda n: True):
        chosen = [n for n in pool if keep(n)]
        if chosen:
            pool = chosen
            break
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for gpu, bus in sorted(gpu_buses.items()):
        ranked = sorted(pool, key=lambda n: (_RANK[distance(bus, str(n.bus_id), pci)], n.name))
        best = _RANK[distance(bus, str(ranked[0].bus_id), pci)]
        cands = tuple(sorted(n.name for n in ranked if _RANK[distance(bus, str(n.bus_id), pci)] == best))
        groups[cands].append(gpu)
    binding: dict[int, str] = {}
    for cands, gpus in groups.items():
        for i, gpu in enumerate(sorted(gpus)):
            binding[gpu] = cands[i % len(cands)]
    return binding
