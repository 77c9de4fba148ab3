"""Whether a plan publishes NCCL_TOPO_FILE, and which file (the rules: docs/topology.md).

A topology file replaces what NCCL detects on the node, so a wrong one does harm: NCCL rebuilds
GPUs from sysfs by bus id but takes NICs from the file by name (src/graph/xml.cc
ncclTopoFillNet), so a file whose bus ids are not the node's misplaces every NIC.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Literal

from ..api.cluster import ClusterTopology
from .export import node_spec
from .nccl_xml import NCCL_XML_VERSION, write_nccl_xml

Mode = Literal["auto", "always", "never"]
RuntimeName = Literal["nccl", "msccl", "rccl"]
X86_IDENTITY = ("vendor", "familyid", "modelid")


@dataclass(frozen=True)
class TopologyFile:
    xml: str | None  # None: publish no NCCL_TOPO_FILE
    notes: list[str] = field(default_factory=list)
    synthetic: bool = False  # bus ids invented from a cluster file or preset


def missing_for_loader(xml: str) -> str | None:
    """What NCCL's loader would miss in the file, or None when it loads as written.

    A bare <cpu> is safe only when it is the only one: every rank then fills it from CPUID
    alike; with several, NCCL init fails with "Attribute arch of node cpu not found".
    """
    root = ET.fromstring(xml)
    if root.get("version") == NCCL_XML_VERSION:
        for gpu in root.iter("gpu"):
            if gpu.get("sm") is None:
                return f"<gpu dev={gpu.get('dev')}> lacks sm (GPU model unknown)"
    cpus = root.findall("cpu")
    if len(cpus) <= 1:
        return None
    for cpu in cpus:
        need = ("arch",) + (X86_IDENTITY if cpu.get("arch") in (None, "x86_64") else ())
        absent = [a for a in need if cpu.get(a) is None]
        if absent:
            return f"<cpu numaid={cpu.get('numaid')}> lacks {', '.join(absent)} (CPU model unknown)"
    return None


def decide(topo: ClusterTopology, mode: Mode = "auto", runtime: RuntimeName = "nccl") -> TopologyFile:
    """The file to publish (or none) and plan notes saying why."""
    if mode == "never":
        return TopologyFile(None, ["publish.topologyFile is never: no NCCL_TOPO_FILE, NCCL detects each node"])
    from_reports = bool(topo.nccl_topology)
    if from_reports:
        variants = {v.xml for v in topo.nccl_topology}
        hidden = all(v.pcie_hidden for v in topo.nccl_topology)
        groups = [", ".join(v.nodes[:4]) + (" ..." if len(v.nodes) > 4 else "") for v in topo.nccl_topology]
    else:
        xmls = [write_nccl_xml(node_spec(topo, n.name)) for n in topo.nodes]
        variants = set(xmls)
        hidden = False
        groups = []
    if len(variants) > 1:
        where = "; ".join(f"[{g}]" for g in groups) if groups else f"{len(variants)} layouts"
        return TopologyFile(None, [f"no NCCL_TOPO_FILE: nodes differ in layout ({where}) and a pod cannot "
                                   "know its node; NCCL detects each node"])
    xml = next(iter(variants))
    rccl_form = ET.fromstring(xml).find(".//gpu[@gcn]") is not None
    if rccl_form and runtime != "rccl":
        return TopologyFile(None, [f"no NCCL_TOPO_FILE: AMD GPUs need RCCL; runtime {runtime} is NVIDIA NCCL, "
                                   "which cannot drive them and rejects RCCL's topology file (version 2)"])
    if rccl_form:
        # Unchecked by RCCL's own loader (it needs HIP) and only ever from synthetic bus ids (the
        # agent probes NVIDIA GPUs): not something to put in front of RCCL's own detection.
        return TopologyFile(None, ["no NCCL_TOPO_FILE: RCCL's topology file (version 2) is not checked with "
                                   "RCCL's own loader here, and AMD nodes have no agent reports with real bus "
                                   "ids; `ccltune topology --cluster CLUSTER --nccl-xml DIR` writes it for inspection"])
    if not rccl_form and runtime == "rccl":
        return TopologyFile(None, ["no NCCL_TOPO_FILE: runtime rccl reads only RCCL's version-2 files, and "
                                   "these are NVIDIA GPUs"])
    missing = missing_for_loader(xml)
    if missing:
        how = ("the agent reads /proc/cpuinfo and NVML" if from_reports else "add gpuModel and cpu: to the cluster file")
        return TopologyFile(None, [f"no NCCL_TOPO_FILE: {missing}, so NCCL's loader would fail on it ({how})"])
    synthetic = not from_reports
    if mode == "always":
        notes = ["NCCL_TOPO_FILE published (publish.topologyFile: always)"]
        if synthetic:
            notes.append("its PCI bus ids are synthetic (cluster file or preset): on a node whose bus ids differ, "
                         "NCCL puts GPUs where sysfs says and NICs where the file says, so GPU-NIC paths read "
                         "PHB/SYS and GPUDirect RDMA is off")
        return TopologyFile(xml, notes, synthetic)
    # auto: publish only a file that shows NCCL more than the node does. Files from the agents'
    # reports show what NCCL detects itself; cluster files and presets have invented bus ids.
    if synthetic:
        return TopologyFile(None, ["no NCCL_TOPO_FILE (auto): the cluster came from a file or preset whose PCI "
                                   "bus ids are synthetic; NCCL detects each node itself"], True)
    if hidden:
        return TopologyFile(None, ["no NCCL_TOPO_FILE (auto): the agents report a VM that hides the PCIe "
                                   "switches; a file from their reports shows NCCL only what it detects itself "
                                   "(GPU-NIC PHB/SYS, no GPUDirect RDMA) and would replace the provider's file "
                                   "(e.g. Azure's, which puts GPUs and NICs under shared switches): keep the provider's "
                                   "NCCL_TOPO_FILE"])
    return TopologyFile(None, ["no NCCL_TOPO_FILE (auto): the agents see the whole PCIe tree, which NCCL "
                               "detects itself; set publish.topologyFile: always to pin it"])


__all__ = ["TopologyFile", "decide", "missing_for_loader"]
