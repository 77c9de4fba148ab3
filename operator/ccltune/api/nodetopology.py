"""NodeTopology: what a node agent reports about one server (one cluster-scoped object per node)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from .common import CONDITION_LIST, Condition, Message, ShortText, WireModel

PciBusId = Annotated[
    str, Field(max_length=32, pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
]


class Distance(StrEnum):
    """NCCL's path classes between a GPU and a NIC or GPU, nearest first."""

    NVL = "NVL"  # through NVLink (possibly via a peer GPU: PXN)
    PIX = "PIX"  # at most one PCIe switch between them
    PXB = "PXB"  # several PCIe switches, no host bridge
    PHB = "PHB"  # through the PCIe host bridge (same CPU / NUMA node)
    SYS = "SYS"  # across the SMP interconnect (QPI/UPI/xGMI) between NUMA nodes


class NVLink(WireModel):
    link: Annotated[int, Field(ge=0, le=63)]
    state: Literal["up", "down"]
    version: Annotated[int, Field(ge=0, le=16)] | None = None
    remote_pci_bus_id: PciBusId | None = None
    remote_type: Literal["gpu", "nvswitch", "unknown"] = "unknown"
    # Per direction, GB/s, from the NVLink version (e.g. 25 GB/s for NVLink 3 and 4 links).
    bandwidth_gbps: Annotated[float, Field(ge=0)] | None = None


class GPU(WireModel):
    index: Annotated[int, Field(ge=0, le=63)]
    uuid: ShortText
    name: ShortText
    pci_bus_id: PciBusId
    numa_node: Annotated[int, Field(ge=-1, le=1023)] = -1
    memory_mib: Annotated[int, Field(ge=0)] | None = None
    compute_capability: Annotated[str, Field(max_length=8, pattern=r"^[0-9]+\.[0-9]+$")] | None = (
        None
    )
    mig_enabled: bool = False
    # AMD GPUs: ROCm target name (e.g. "gfx942") and compute units, as RCCL's topology file has them.
    gcn_arch: Annotated[str, Field(max_length=16, pattern=r"^gfx[0-9a-f]+$")] | None = None
    compute_units: Annotated[int, Field(ge=1, le=4096)] | None = None
    # NVLink, or for AMD GPUs their xGMI (Infinity Fabric) links to peer GPUs.
    nvlinks: Annotated[list[NVLink], Field(max_length=64)] = []


class P2PEntry(WireModel):
    """One GPU pair: NVML's P2P read status and their topology common ancestor."""

    gpu_a: Annotated[int, Field(ge=0, le=63)]
    gpu_b: Annotated[int, Field(ge=0, le=63)]
    p2p_read: Literal["ok", "not_supported", "chipset_not_supported", "disabled", "unknown"]
    common_ancestor: Literal["internal", "single", "multiple", "hostbridge", "node", "system"]


class PciDevice(WireModel):
    bus_id: PciBusId
    class_code: Annotated[str, Field(max_length=10, pattern=r"^0x[0-9a-fA-F]{6}$")]
    vendor: Annotated[str, Field(max_length=8)] | None = None
    device: Annotated[str, Field(max_length=8)] | None = None
    subsystem_vendor: Annotated[str, Field(max_length=8)] | None = None
    subsystem_device: Annotated[str, Field(max_length=8)] | None = None
    parent: PciBusId | None = None  # None: directly below a root complex
    numa_node: Annotated[int, Field(ge=-1, le=1023)] = -1
    link_speed: Annotated[str, Field(max_length=32)] | None = None  # e.g. "16.0 GT/s PCIe"
    max_link_speed: Annotated[str, Field(max_length=32)] | None = None
    link_width: Annotated[int, Field(ge=0, le=32)] | None = None
    max_link_width: Annotated[int, Field(ge=0, le=32)] | None = None


class HostCpu(WireModel):
    """The host CPU as NCCL's topology file names it (src/graph/xml.cc ncclTopoGetXmlFromCpu)."""

    arch: Literal["x86_64", "arm64", "ppc64"]
    vendor: Annotated[str, Field(max_length=16)] | None = None  # CPUID vendor, e.g. "GenuineIntel"
    # CPUID family and model with their extended fields added, as NCCL computes them (x86 only).
    family_id: Annotated[int, Field(ge=0, le=0x10FF)] | None = None
    model_id: Annotated[int, Field(ge=0, le=0xFF)] | None = None
    model_name: ShortText | None = None  # /proc/cpuinfo "model name", for people

    def nccl_complete(self) -> bool:
        """Every attribute NCCL's loader reads for this arch is known (topo.cc ncclTopoAddCpu)."""
        if self.arch != "x86_64":
            return True
        return self.vendor is not None and self.family_id is not None and self.model_id is not None


class NICPort(WireModel):
    port: Annotated[int, Field(ge=1, le=16)] = 1
    rate_gbps: Annotated[float, Field(ge=0)]  # Gb/s as the port reports it (bits, not bytes)
    state: Annotated[str, Field(max_length=32)]  # e.g. "ACTIVE", "DOWN"
    link_layer: Literal["InfiniBand", "Ethernet", "unknown"]
    guid: Annotated[str, Field(max_length=64)] | None = None


class NIC(WireModel):
    name: Annotated[str, Field(max_length=64)]  # RDMA device (mlx5_0) or netdev when no RDMA
    netdev: Annotated[str, Field(max_length=64)] | None = None
    pci_bus_id: PciBusId | None = None
    numa_node: Annotated[int, Field(ge=-1, le=1023)] = -1
    ports: Annotated[list[NICPort], Field(max_length=16)] = []


class GpuNicAffinity(WireModel):
    gpu: Annotated[int, Field(ge=0, le=63)]
    nic: Annotated[str, Field(max_length=64)]
    distance: Distance


class NumaNode(WireModel):
    id: Annotated[int, Field(ge=0, le=1023)]
    cpus: Annotated[str, Field(max_length=256)] = ""  # cpulist, e.g. "0-47,96-143"


class NodeTopologySpec(WireModel):
    node_name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=253,
            json_schema_extra={
                "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "spec.nodeName is immutable"}
                ]
            },
        ),
    ]
    agent_version: ShortText = ""
    probed_at: datetime | None = None
    content_hash: Annotated[str, Field(max_length=80)] = ""
    gpus: Annotated[list[GPU], Field(max_length=64)] = []
    p2p: Annotated[list[P2PEntry], Field(max_length=4096)] = []
    pci_devices: Annotated[list[PciDevice], Field(max_length=1024)] = []
    nics: Annotated[list[NIC], Field(max_length=64)] = []
    affinity: Annotated[list[GpuNicAffinity], Field(max_length=4096)] = []
    # TuCCL stage 1: the NIC each GPU uses (shares its PCIe switch or root), keyed by GPU index.
    nic_binding: dict[str, Annotated[str, Field(max_length=64)]] = {}
    numa_nodes: Annotated[list[NumaNode], Field(max_length=64)] = []
    cpu: HostCpu | None = None  # from /proc/cpuinfo; None when it could not be read
    # True when a VM hides PCIe switches: devices are grouped by NUMA node, no switch is invented.
    pcie_flattened: bool = False
    notes: Annotated[list[Message], Field(max_length=32)] = []


class NodeTopologyStatus(WireModel):
    conditions: Annotated[
        list[Condition], Field(max_length=16, json_schema_extra=CONDITION_LIST)
    ] = []


class NodeTopology(WireModel):
    """The cluster-scoped custom resource. Only spec/status travel; metadata is the controller's."""

    spec: NodeTopologySpec
    status: NodeTopologyStatus = NodeTopologyStatus()

    KIND: ClassVar[str] = "NodeTopology"
    PLURAL: ClassVar[str] = "nodetopologies"
