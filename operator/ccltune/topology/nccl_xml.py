"""NCCL topology XML (the NCCL_TOPO_FILE format): write one from a NodeTopologySpec, parse any.

Format as NCCL's own dumps (NCCL_TOPO_DUMP_FILE) and the files cloud images ship (see
/work/shared/data/topologies): <system version="1"> -> <cpu numaid affinity arch vendor familyid
modelid> -> nested <pci busid class vendor device subsystem_* link_speed link_width> -> <gpu dev
sm> with <nvlink target count tclass>, or <nic> with <net name dev speed port>.

What is written, and why (NCCL 2.30.7 src/graph/topo.cc, xml.cc):
- <cpu> carries its full identity. NCCL fills arch/vendor/familyid/modelid from CPUID only for the
  CPU above the calling rank's own GPU; a CPU reached only through file NICs stays bare in that
  rank's XML, the ranks' XMLs then fuse into two <cpu> of the same numaid and ncclTopoAddCpu fails
  with "Attribute arch of node cpu not found".
- <gpu> has dev and sm only. NCCL sets `rank` itself (xmlSetAttrInt) and keeps a file's `gdr`
  over its own GPUDirect detection (xmlInitAttrInt), so writing gdr would force it on or off.
- <net> has no guid, latency, maxconn or gdr: NCCL takes them from the net plugin unless the
  file sets them (xmlInitAttr*), and a guid is unique per node, which would make every node's
  file different.
AMD GPUs get RCCL's form instead (ROCm/rccl src/graph/xml.h NCCL_TOPO_XML_VERSION 2, topo.cc
ncclTopoAddGpu): <system version="2">, <gpu dev sm=compute units gcn>, <xgmi target count tclass>.
NVIDIA NCCL rejects version 2 and RCCL rejects version 1, so no file serves both.

PCI nesting follows NCCL (src/graph/xml.cc, ncclTopoGetXmlFromSys): walking up sysfs it skips one
level each step, so a PCIe switch appears as its upstream port and root ports vanish into the CPU.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field

from ccltune.api.nodetopology import HostCpu, NodeTopologySpec

# PCI class of the remote end of an NVLink, as NCCL writes `tclass` (nvml device type -> class).
TCLASS_GPU = "0x030200"
TCLASS_NVSWITCH = "0x068000"
# Processing accelerator: the class of AMD Instinct GPUs and of their xGMI peers in RCCL's files.
TCLASS_ACCEL = "0x120000"
# NCCL ignores the target of NVSwitch links (all NVSwitches form one NVS node); used when NVML
# could not name the switch (common in VMs).
NVSWITCH_PLACEHOLDER = "ffff:ff:ff.0"
NCCL_XML_VERSION = "1"  # NVIDIA NCCL src/graph/xml.h NCCL_TOPO_XML_VERSION
RCCL_XML_VERSION = "2"  # ROCm/rccl src/graph/xml.h NCCL_TOPO_XML_VERSION (commit 0cbce2a)


def switch_chain(bus_id: str, parent_of: Mapping[str, str | None]) -> list[str]:
    """PCIe switches above a device, nearest first, each named by its upstream port (NCCL's view)."""
    chain: list[str] = []
    cur = bus_id
    for _ in range(64):  # bound against cyclic input
        p1 = parent_of.get(cur)
        p2 = parent_of.get(p1) if p1 is not None else None
        if p2 is None:
            break
        chain.append(p2)
        cur = p2
    return chain


def cpulist_to_mask(cpulist: str, groups: int) -> str:
    """'0-23,48' -> '00000000,00010000,00ffffff' (Linux cpumap: 32-bit words, high word first)."""
    bits = 0
    for part in filter(None, (p.strip() for p in cpulist.split(","))):
        lo, _, hi = part.partition("-")
        for cpu in range(int(lo), int(hi or lo) + 1):
            bits |= 1 << cpu
    words = [(bits >> (32 * i)) & 0xFFFFFFFF for i in reversed(range(groups))]
    return ",".join(f"{w:08x}" for w in words)


def _max_cpu(cpulist: str) -> int:
    nums = [int(n) for n in re.findall(r"\d+", cpulist)]
    return max(nums) if nums else -1


def _gts(speed: str | None) -> float:
    match = re.match(r"^\s*(\d+(?:\.\d+)?)", speed or "")
    return float(match.group(1)) if match else 0.0


def cpu_attrs(cpu: HostCpu | None) -> dict[str, str]:
    """The <cpu> identity attributes NCCL writes (xml.cc ncclTopoGetXmlFromCpu); what is known."""
    if cpu is None:
        return {}
    attrs: dict[str, str] = {"arch": cpu.arch}
    if cpu.arch == "x86_64":
        if cpu.vendor:
            attrs["vendor"] = cpu.vendor
        if cpu.family_id is not None and cpu.model_id is not None:
            attrs["familyid"] = str(cpu.family_id)
            attrs["modelid"] = str(cpu.model_id)
    return attrs


def is_rccl_form(spec: NodeTopologySpec) -> bool:
    return any(g.gcn_arch for g in spec.gpus)


def write_nccl_xml(spec: NodeTopologySpec) -> str:
    """The node's topology file (RCCL's form for AMD GPUs). Devices grouped by NUMA node."""
    rccl = is_rccl_form(spec)
    pci = {d.bus_id: d for d in spec.pci_devices}
    parent_of = {d.bus_id: d.parent for d in spec.pci_devices}
    numa_ids = sorted({n.id for n in spec.numa_nodes} | {g.numa_node for g in spec.gpus if g.numa_node >= 0}
                      | {n.numa_node for n in spec.nics if n.numa_node >= 0})
    fallback_numa = numa_ids[0] if numa_ids else 0
    numa_ids = numa_ids or [0]
    cpus_of = {n.id: n.cpus for n in spec.numa_nodes}
    groups = max(1, (max((_max_cpu(c) for c in cpus_of.values()), default=-1) + 32) // 32)

    system = ET.Element("system", version=RCCL_XML_VERSION if rccl else NCCL_XML_VERSION)
    cpu_el: dict[int, ET.Element] = {}
    identity = cpu_attrs(spec.cpu)
    for nid in numa_ids:
        attrs = {"numaid": str(nid)}
        if cpus_of.get(nid):
            attrs["affinity"] = cpulist_to_mask(cpus_of[nid], groups)
        cpu_el[nid] = ET.SubElement(system, "cpu", {**attrs, **identity})
    pci_el: dict[str, ET.Element] = {}

    def numa_for(bus: str, default: int) -> int:
        dev = pci.get(bus)
        nid = dev.numa_node if dev and dev.numa_node >= 0 else default
        return nid if nid in cpu_el else fallback_numa

    def pci_attrs(bus: str, cls: str) -> dict[str, str]:
        attrs = {"busid": bus, "class": cls}
        dev = pci.get(bus)
        if dev is None:
            # NCCL's loader needs both; "" / 0 are what it records when sysfs has no value.
            return {**attrs, "link_speed": "", "link_width": "0"}
        for name in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
            if getattr(dev, name):
                attrs[name] = getattr(dev, name)
        # NCCL records the slower of the device and its upstream port.
        speeds = [s for s in (dev.max_link_speed, pci[dev.parent].max_link_speed if dev.parent in pci else None) if s]
        widths = [w for w in (dev.max_link_width, pci[dev.parent].max_link_width if dev.parent in pci else None) if w]
        attrs["link_speed"] = min(speeds, key=_gts) if speeds else ""
        attrs["link_width"] = str(min(widths)) if widths else "0"
        return attrs

    def place(bus: str, cls: str, default_numa: int) -> ET.Element:
        """The <pci> element of an endpoint, creating its switch ancestors on the way."""
        if bus in pci_el:
            return pci_el[bus]
        parent: ET.Element = cpu_el[numa_for(bus, default_numa)]
        for sw in reversed(switch_chain(bus, parent_of)):
            if sw not in pci_el:
                pci_el[sw] = ET.SubElement(parent, "pci", pci_attrs(sw, pci[sw].class_code if sw in pci else "0x060400"))
            parent = pci_el[sw]
        pci_el[bus] = ET.SubElement(parent, "pci", pci_attrs(bus, cls))
        return pci_el[bus]

    gpu_buses = {g.pci_bus_id for g in spec.gpus}
    for gpu in sorted(spec.gpus, key=lambda g: g.pci_bus_id):
        dev = pci.get(gpu.pci_bus_id)
        pel = place(gpu.pci_bus_id, dev.class_code if dev else (TCLASS_ACCEL if rccl else TCLASS_GPU), gpu.numa_node)
        attrs = {"dev": str(gpu.index)}
        if rccl:
            # RCCL reads `sm` as the compute-unit count (topo.cc ncclTopoAddGpu).
            if gpu.compute_units:
                attrs["sm"] = str(gpu.compute_units)
            if gpu.gcn_arch:
                attrs["gcn"] = gpu.gcn_arch
        elif gpu.compute_capability:
            major, minor = gpu.compute_capability.split(".")
            attrs["sm"] = str(int(major) * 10 + int(minor))
        gel = ET.SubElement(pel, "gpu", attrs)
        counts: dict[tuple[str, str], int] = {}
        for link in gpu.nvlinks:
            if link.state != "up":
                continue
            if link.remote_type == "nvswitch" and not rccl:
                key = (link.remote_pci_bus_id or NVSWITCH_PLACEHOLDER, TCLASS_NVSWITCH)
            elif link.remote_pci_bus_id and (link.remote_type == "gpu" or link.remote_pci_bus_id in gpu_buses):
                key = (link.remote_pci_bus_id, TCLASS_ACCEL if rccl else TCLASS_GPU)
            else:
                continue  # remote end unknown: NCCL could not use it either
            counts[key] = counts.get(key, 0) + 1
        for (target, tclass), count in sorted(counts.items()):
            ET.SubElement(gel, "xgmi" if rccl else "nvlink", target=target, count=str(count), tclass=tclass)

    dev_index = 0
    for nic in sorted(spec.nics, key=lambda n: (n.pci_bus_id or "~", n.name)):
        if nic.pci_bus_id:
            dev = pci.get(nic.pci_bus_id)
            host = place(nic.pci_bus_id, dev.class_code if dev else "0x020700", nic.numa_node)
        else:
            host = cpu_el[nic.numa_node if nic.numa_node in cpu_el else fallback_numa]
        nic_el = host.find("nic")
        if nic_el is None:
            nic_el = ET.SubElement(host, "nic")
        for port in nic.ports or []:
            ET.SubElement(nic_el, "net", {"name": nic.name, "dev": str(dev_index),
                                          "speed": str(round(port.rate_gbps * 1000)), "port": str(port.port)})
            dev_index += 1

    ET.indent(system, space="  ")
    # NCCL's own dumps close empty elements as "<x .../>"; match them byte for byte.
    return ET.tostring(system, encoding="unicode").replace(" />", "/>") + "\n"


# ---- parsing -------------------------------------------------------------------------------


@dataclass
class NcclNvLink:
    target: str
    count: int
    tclass: str


@dataclass
class NcclGpu:
    busid: str
    dev: int
    numaid: int
    sm: int | None = None
    rank: int | None = None
    nvlinks: list[NcclNvLink] = field(default_factory=list)


@dataclass
class NcclNet:
    name: str
    numaid: int
    busid: str | None = None  # None: the <nic> hangs directly off the CPU
    dev: int | None = None
    speed_mbps: int | None = None
    port: int | None = None
    guid: str | None = None


@dataclass
class NcclPci:
    busid: str
    pci_class: str
    numaid: int
    parent: str | None  # enclosing <pci> busid, None when directly under <cpu>
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class NcclTopology:
    version: str
    cpus: dict[int, dict[str, str]] = field(default_factory=dict)
    pcis: list[NcclPci] = field(default_factory=list)
    gpus: list[NcclGpu] = field(default_factory=list)
    nets: list[NcclNet] = field(default_factory=list)

    def pci(self, busid: str) -> NcclPci | None:
        return next((p for p in self.pcis if p.busid == busid), None)


def _int_attr(el: ET.Element, name: str, where: str, required: bool = False) -> int | None:
    raw = el.get(name)
    if raw is None or raw == "":
        if required:
            raise ValueError(f"NCCL topology XML: <{el.tag}> {where} lacks attribute {name!r}")
        return None
    try:
        return int(raw, 0)
    except ValueError:
        raise ValueError(f"NCCL topology XML: <{el.tag}> {where}: {name}={raw!r} is not an integer") from None


def parse_nccl_xml(text: str) -> NcclTopology:
    """Parse an NCCL topology file; ValueError naming the element on anything malformed."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"NCCL topology XML is not well-formed: {exc}") from None
    if root.tag != "system":
        raise ValueError(f"NCCL topology XML: root element is <{root.tag}>, expected <system>")
    topo = NcclTopology(version=root.get("version", ""))
    for ci, cpu in enumerate(root.findall("cpu")):
        numaid = _int_attr(cpu, "numaid", f"#{ci} under <system>", required=True)
        assert numaid is not None
        topo.cpus[numaid] = dict(cpu.attrib)
        _walk(cpu, topo, numaid, None)
    return topo


def _walk(el: ET.Element, topo: NcclTopology, numaid: int, parent_bus: str | None) -> None:
    where_parent = f"under pci {parent_bus}" if parent_bus else f"under cpu numaid={numaid}"
    for child in el:
        if child.tag == "pci":
            bus = child.get("busid")
            if not bus:
                raise ValueError(f"NCCL topology XML: <pci> {where_parent} lacks attribute 'busid'")
            topo.pcis.append(NcclPci(busid=bus.lower(), pci_class=child.get("class", ""), numaid=numaid,
                                     parent=parent_bus, attrs=dict(child.attrib)))
            _walk(child, topo, numaid, bus.lower())
        elif child.tag == "gpu":
            if parent_bus is None:
                raise ValueError(f"NCCL topology XML: <gpu> {where_parent} is not inside a <pci>")
            where = f"in pci {parent_bus}"
            dev = _int_attr(child, "dev", where, required=True)
            assert dev is not None
            gpu = NcclGpu(busid=parent_bus, dev=dev, numaid=numaid, sm=_int_attr(child, "sm", where),
                          rank=_int_attr(child, "rank", where))
            for link in child.findall("nvlink"):
                target = link.get("target")
                if not target:
                    raise ValueError(f"NCCL topology XML: <nvlink> of gpu {where} lacks attribute 'target'")
                gpu.nvlinks.append(NcclNvLink(target=target.lower(),
                                              count=_int_attr(link, "count", f"of gpu {where}") or 1,
                                              tclass=link.get("tclass", "")))
            topo.gpus.append(gpu)
        elif child.tag == "nic":
            for net in child.findall("net"):
                name = net.get("name")
                if not name:
                    raise ValueError(f"NCCL topology XML: <net> {where_parent} lacks attribute 'name'")
                where = f"{name!r} {where_parent}"
                topo.nets.append(NcclNet(name=name, numaid=numaid, busid=parent_bus,
                                         dev=_int_attr(net, "dev", where), speed_mbps=_int_attr(net, "speed", where),
                                         port=_int_attr(net, "port", where), guid=net.get("guid")))
