"""sysfs probes under a root directory: the PCI tree, RDMA devices, netdevs, NUMA nodes.

Every read goes through `SysRoot`, which remembers the paths it touched, so `record` can copy
exactly what the probes read. Entries that are missing or malformed are skipped with a warning
naming the path; they never abort the probe.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_CLASS = re.compile(r"^0x[0-9a-fA-F]{6}$")
_HEX_ID = re.compile(r"^0x[0-9a-fA-F]{4}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_PCI_ATTRS = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")


class SysRoot:
    """Reads below `root` as if it were `/`; records every path it touched (relative to root)."""

    def __init__(self, root: Path | str = "/") -> None:
        self.root = Path(root)
        self._root = str(self.root)  # plain strings: pathlib costs a third of a probe
        self._real_root = os.path.realpath(self._root)
        self.touched: set[str] = set()
        self.warnings: list[str] = []

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def _full(self, rel: str) -> str:
        return os.path.join(self._root, rel.lstrip("/"))

    def warn(self, rel: str, what: str) -> None:
        msg = f"skipped /{rel.lstrip('/')}: {what}"
        self.warnings.append(msg)
        log.warning("%s", msg)

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._full(rel))

    def listdir(self, rel: str) -> list[str]:
        try:
            names = sorted(os.listdir(self._full(rel)))
        except OSError:
            return []
        self.touched.add(rel.rstrip("/"))
        return names

    def read(self, rel: str) -> str | None:
        try:
            with open(self._full(rel), errors="replace") as fh:
                text = fh.read().strip()
        except OSError:
            return None
        self.touched.add(rel)
        return text

    def resolve(self, rel: str) -> str | None:
        """Where a sysfs symlink points, as a root-relative path ('devices/pci0000:00/...')."""
        full = self._full(rel)
        if not os.path.exists(full):  # missing, or a dangling symlink
            return None
        self.touched.add(rel)
        real = os.path.realpath(full)
        root = self._real_root
        if real != root and not real.startswith(root.rstrip("/") + "/"):
            return None
        return os.path.relpath(real, root)


@dataclass
class PciInfo:
    bus_id: str
    class_code: str
    vendor: str | None = None
    device: str | None = None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    parent: str | None = None  # the upstream bridge in sysfs (None: on a root bus)
    numa_node: int = -1
    link_speed: str | None = None
    max_link_speed: str | None = None
    link_width: int | None = None
    max_link_width: int | None = None
    sysfs_path: str = ""

    @property
    def is_bridge(self) -> bool:
        return self.class_code.lower().startswith("0x0604")

    @property
    def is_gpu(self) -> bool:  # display controllers of NVIDIA (0x0300 VGA, 0x0302 3D)
        return self.class_code.lower()[:6] in ("0x0300", "0x0302") and self.vendor == "0x10de"

    @property
    def is_nvswitch(self) -> bool:  # NVSwitch enumerates as "bridge, other" (0x0680) from NVIDIA
        return self.class_code.lower().startswith("0x0680") and self.vendor == "0x10de"

    @property
    def is_network(self) -> bool:  # 0x02xxxx network controllers: Ethernet 0x0200, IB 0x0207
        return self.class_code.lower().startswith("0x02")


@dataclass
class Port:
    port: int
    rate_gbps: float
    state: str
    link_layer: str
    guid: str | None = None


@dataclass
class NicInfo:
    name: str
    netdev: str | None
    bus_id: str | None
    rdma: bool
    ports: list[Port] = field(default_factory=list)
    node_guid: str | None = None
    virtual_function: bool = False  # an SR-IOV VF whose PF is visible in this OS (not a rail)


def _int(sys: SysRoot, rel: str, required: bool = False) -> int | None:
    text = sys.read(rel)
    if text is None:
        if required:
            sys.warn(rel, "missing")
        return None
    try:
        return int(text, 0)
    except ValueError:
        sys.warn(rel, f"not an integer: {text[:40]!r}")
        return None


def read_pci(sys: SysRoot) -> dict[str, PciInfo]:
    """Every device under /sys/bus/pci/devices with its class, ids, links and sysfs parent."""
    base = "sys/bus/pci/devices"
    out: dict[str, PciInfo] = {}
    for name in sys.listdir(base):
        rel = f"{base}/{name}"
        if not BDF.match(name):
            sys.warn(rel, "not a PCI bus id")
            continue
        real = sys.resolve(rel)
        if real is None:
            sys.warn(rel, "dangling or foreign symlink")
            continue
        cls = sys.read(f"{rel}/class")
        if cls is None or not _CLASS.match(cls):
            sys.warn(f"{rel}/class", "missing" if cls is None else f"malformed class {cls[:40]!r}")
            continue
        parts = real.split("/")
        parent = parts[-2] if len(parts) >= 2 and BDF.match(parts[-2]) else None
        info = PciInfo(bus_id=name, class_code=cls.lower(), parent=parent, sysfs_path=real)
        for attr in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
            value = sys.read(f"{rel}/{attr}")
            if value is not None and not _HEX_ID.match(value):
                sys.warn(f"{rel}/{attr}", f"malformed id {value[:40]!r}")
                value = None
            setattr(info, attr, value.lower() if value else None)
        numa = _int(sys, f"{rel}/numa_node")
        info.numa_node = numa if numa is not None and numa >= -1 else -1
        out[name] = info
    return out


def read_pci_links(sys: SysRoot, info: PciInfo) -> None:
    """Link speed/width, read only for the devices the report keeps (a node has hundreds)."""
    rel = f"sys/bus/pci/devices/{info.bus_id}"
    info.link_speed = sys.read(f"{rel}/current_link_speed") or None
    info.max_link_speed = sys.read(f"{rel}/max_link_speed") or None
    for attr, dest in (("current_link_width", "link_width"), ("max_link_width", "max_link_width")):
        value = _int(sys, f"{rel}/{attr}")
        if value is not None and not 0 <= value <= 32:
            sys.warn(f"{rel}/{attr}", f"width {value} out of range")
            value = None
        setattr(info, dest, value)
    if info.link_speed and "Unknown" in info.link_speed:
        info.link_speed = None


def _bus_of(sys: SysRoot, rel: str) -> str | None:
    real = sys.resolve(rel)
    if real is None:
        return None
    last = real.rsplit("/", 1)[-1]
    return last if BDF.match(last) else None


def read_nics(sys: SysRoot) -> list[NicInfo]:
    """RDMA devices from /sys/class/infiniband, plus physical netdevs that have no RDMA device."""
    nics: list[NicInfo] = []
    ib_base = "sys/class/infiniband"
    netdev_of_bus: dict[str, list[str]] = {}
    net_base = "sys/class/net"
    for ifname in sys.listdir(net_base):
        if not sys.path(f"{net_base}/{ifname}/device").is_symlink():
            continue  # virtual interface (lo, bridges, veth): not a NIC
        real = sys.resolve(f"{net_base}/{ifname}/device")
        if real is None:
            sys.warn(f"{net_base}/{ifname}/device", "dangling device link")
            continue
        bus = real.rsplit("/", 1)[-1]
        if not BDF.match(bus):
            continue  # synthetic NIC (e.g. Hyper-V netvsc on VMBus): no PCI position to report
        netdev_of_bus.setdefault(bus, []).append(ifname)
    rdma_buses: set[str] = set()
    for dev in sys.listdir(ib_base):
        rel = f"{ib_base}/{dev}"
        ib_bus = _bus_of(sys, f"{rel}/device")
        if ib_bus is None:
            sys.warn(f"{rel}/device", "missing or not a PCI device link")
            continue
        netdevs = netdev_of_bus.get(ib_bus) or []
        nic = NicInfo(name=dev, netdev=netdevs[0] if netdevs else None, bus_id=ib_bus, rdma=True,
                      node_guid=_guid(sys.read(f"{rel}/node_guid")))
        nic.virtual_function = sys.resolve(f"sys/bus/pci/devices/{ib_bus}/physfn") is not None
        for pname in sys.listdir(f"{rel}/ports"):
            port = _read_port(sys, f"{rel}/ports/{pname}", pname)
            if port is not None:
                nic.ports.append(port)
        if not nic.ports:
            sys.warn(f"{rel}/ports", "no readable port")
        rdma_buses.add(ib_bus)
        nics.append(nic)
    for bus, ifnames in sorted(netdev_of_bus.items()):
        if bus in rdma_buses:
            continue
        for ifname in ifnames:
            rel = f"{net_base}/{ifname}"
            speed = _int(sys, f"{rel}/speed")
            state = sys.read(f"{rel}/operstate") or "unknown"
            ports = [Port(port=1, rate_gbps=max(speed, 0) / 1000 if speed is not None else 0.0,
                          state=state.upper(), link_layer="Ethernet")]
            vf = sys.resolve(f"sys/bus/pci/devices/{bus}/physfn") is not None
            nics.append(NicInfo(name=ifname, netdev=ifname, bus_id=bus, rdma=False, ports=ports,
                                virtual_function=vf))
    return nics


def _guid(text: str | None) -> str | None:
    if not text:
        return None
    return "0x" + text.replace(":", "").lower()


def _read_port(sys: SysRoot, rel: str, pname: str) -> Port | None:
    if not pname.isdigit() or not 1 <= int(pname) <= 16:
        sys.warn(rel, "not a port number")
        return None
    rate_text = sys.read(f"{rel}/rate")
    match = _RATE.match(rate_text or "")
    if not match:
        sys.warn(f"{rel}/rate", "missing" if rate_text is None else f"malformed rate {rate_text[:40]!r}")
        return None
    state = sys.read(f"{rel}/state") or "unknown"
    # "4: ACTIVE" -> "ACTIVE"
    state = state.split(":", 1)[-1].strip() or "unknown"
    layer = sys.read(f"{rel}/link_layer") or "unknown"
    if layer not in ("InfiniBand", "Ethernet"):
        sys.warn(f"{rel}/link_layer", f"unknown link layer {layer[:40]!r}")
        layer = "unknown"
    guid = sys.read(f"{rel}/gids/0")
    port_guid = None
    if guid and guid.count(":") == 7:  # GID = 64-bit prefix + 64-bit port GUID
        port_guid = "0x" + "".join(guid.split(":")[4:]).lower()
    return Port(port=int(pname), rate_gbps=float(match.group(1)), state=state, link_layer=layer,
                guid=port_guid)


def read_numa(sys: SysRoot) -> dict[int, str]:
    """NUMA node id -> cpulist."""
    base = "sys/devices/system/node"
    out: dict[int, str] = {}
    for name in sys.listdir(base):
        match = re.match(r"^node(\d+)$", name)
        if not match:
            continue
        cpus = sys.read(f"{base}/{name}/cpulist")
        if cpus is None or not re.match(r"^[0-9,\-\s]*$", cpus):
            sys.warn(f"{base}/{name}/cpulist", "missing" if cpus is None else "malformed cpulist")
            cpus = ""
        out[int(match.group(1))] = cpus.strip()
    return out


@dataclass
class CpuInfo:
    arch: str  # NCCL's names: x86_64, arm64, ppc64
    vendor: str | None = None
    family_id: int | None = None
    model_id: int | None = None
    model_name: str | None = None


def read_cpuinfo(sys: SysRoot, path: Path | None = None) -> CpuInfo | None:
    """The first processor of /proc/cpuinfo, in the terms NCCL's topology file uses.

    Linux prints family = base + extended family; NCCL (src/graph/xml.cc ncclTopoGetXmlFromCpu)
    writes base + (extended << 4), so AMD family 0x19 becomes 175. Models agree (base + ext << 4).
    """
    rel = "proc/cpuinfo"
    if path is None:
        text = sys.read(rel)
    else:  # --cpuinfo: outside the root (a container's /proc/cpuinfo lists the host's CPUs)
        rel = str(path)
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            text = None
    if text is None:
        sys.warn(rel, "missing: CPU model unknown")
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # end of the first processor block
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    if "vendor_id" in fields:
        info = CpuInfo(arch="x86_64", vendor=fields["vendor_id"][:16] or None,
                       model_name=fields.get("model name", "")[:256] or None)
        family = _cpuinfo_int(sys, rel, fields.get("cpu family"))
        model = _cpuinfo_int(sys, rel, fields.get("model"))
        if family is not None and model is not None and family <= 0xFF + 0xF and model <= 0xFF:
            info.family_id = family if family < 0xF else 0xF + ((family - 0xF) << 4)
            info.model_id = model
        return info
    if "cpu implementer" in fields:
        return CpuInfo(arch="arm64", model_name=fields.get("model name", "")[:256] or None)
    if fields.get("cpu", "").upper().startswith("POWER"):
        return CpuInfo(arch="ppc64", model_name=fields["cpu"][:256])
    sys.warn(rel, "no vendor_id, CPU implementer or POWER cpu line: architecture unknown")
    return None


def _cpuinfo_int(sys: SysRoot, rel: str, text: str | None) -> int | None:
    try:
        return int(text or "", 10)
    except ValueError:
        sys.warn(rel, f"not an integer: {(text or '')[:40]!r}")
        return None
