"""ClusterTopology: the fabric model every planner works on.

Units: bandwidth in GB/s (1e9 bytes/s) per direction, latency in microseconds, sizes in bytes.
Global rank of a GPU = node index * gpus_per_node + local index (node order as listed).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .common import Message, Name, ShortText, WireModel
from .nodetopology import HostCpu


class DeviceKind(StrEnum):
    GPU = "gpu"
    NVSWITCH = "nvswitch"
    PCIE_SWITCH = "pcie_switch"
    CPU = "cpu"
    NIC = "nic"
    LEAF = "leaf"  # ToR / rail switch
    SPINE = "spine"


class LinkKind(StrEnum):
    NVLINK = "nvlink"
    XGMI = "xgmi"  # AMD Infinity Fabric
    PCIE = "pcie"
    SMP = "smp"  # between CPU sockets (QPI/UPI/xGMI-to-host)
    NET = "net"  # NIC <-> switch, switch <-> switch


class Device(WireModel):
    id: Annotated[str, Field(min_length=1, max_length=128)]  # e.g. "node0/gpu3", "leaf1"
    kind: DeviceKind
    node: Annotated[str, Field(max_length=253)] | None = None
    local_index: Annotated[int, Field(ge=0)] | None = None  # GPU index inside its node


class Link(WireModel):
    """A full-duplex link: each direction carries bandwidth_gbps independently."""

    a: Annotated[str, Field(max_length=128)]
    b: Annotated[str, Field(max_length=128)]
    kind: LinkKind
    bandwidth_gbps: Annotated[float, Field(gt=0)]
    latency_us: Annotated[float, Field(ge=0)] = 0.0


class Dimension(WireModel):
    """One dimension of a symmetric fabric, innermost first (ASTRA-sim's convention)."""

    name: ShortText
    kind: Literal["switch", "ring", "fully_connected"]
    size: Annotated[int, Field(ge=1)]  # GPUs per group in this dimension
    bandwidth_gbps: Annotated[float, Field(gt=0)]  # per GPU, per direction, into this dimension
    latency_us: Annotated[float, Field(ge=0)] = 0.0


class ClusterNode(WireModel):
    name: Name
    gpus: Annotated[int, Field(ge=1, le=64)]
    # Fabric placement read from labels or files: e.g. {"rail": "...", "tor": "t3", "spine": "s0"}.
    fabric: dict[str, Annotated[str, Field(max_length=63)]] = {}


class NodeNcclTopology(WireModel):
    """The NCCL topology file of some nodes, written from their agents' reports (real bus ids)."""

    nodes: Annotated[list[Name], Field(min_length=1)]
    xml: Annotated[str, Field(max_length=262144)]
    # The report says the VM hides the PCIe switches (NCCL's own reason for NCCL_TOPO_FILE).
    pcie_hidden: bool = False


# Per-message cost (us) of a transport between nodes, where a public source gives one. The
# simulator charges it for every protocol step a transfer between nodes takes (NCCL's net proxy
# posts one network message per step), on top of the links' latency.
# - rdma: InfiniBand/RoCE with GPUDirect RDMA, the NIC moves the bytes; the links' latency covers it.
# - efa: aws-ofi-nccl include/nccl_ofi_param.h (commit 03f3783f), TUNER_NET_COMP_OVERHEAD = 3:
#   "~2 usec cost in the device and ~1 usec cost to write that completion up to the host stack".
# socket (NCCL's TCP transport), tcpx and tcpxo (GCP GPUDirect-TCPX/-TCPXO plugins) have no
# published per-message figure we could cite: a cluster file must give perMessageUs for them.
PER_MESSAGE_US: dict[str, float] = {"rdma": 0.0, "efa": 3.0}


class NetTransport(WireModel):
    """How NCCL moves bytes between nodes: RDMA NICs, or host-offloaded transports that pay a
    cost per network message (docs/topology.md)."""

    kind: Literal["rdma", "efa", "socket", "tcpx", "tcpxo"] = "rdma"
    per_message_us: Annotated[float, Field(ge=0, le=1e4)] | None = None  # None: PER_MESSAGE_US

    @model_validator(mode="after")
    def _has_cost(self) -> NetTransport:
        if self.per_message_us is None and self.kind not in PER_MESSAGE_US:
            raise ValueError(
                f"perMessageUs is required for transport kind {self.kind!r} (no published default)"
            )
        return self

    @property
    def message_us(self) -> float:
        return self.per_message_us if self.per_message_us is not None else PER_MESSAGE_US[self.kind]


class ClusterTopology(WireModel):
    name: Name
    description: Message = ""
    gpu_model: ShortText = ""
    gpus_per_node: Annotated[int, Field(ge=1, le=64)]
    nodes: Annotated[list[ClusterNode], Field(min_length=1)]
    devices: list[Device] = []
    links: list[Link] = []
    # Set when the fabric is symmetric (SyCCL observation 1); None otherwise.
    dimensions: list[Dimension] | None = None
    asymmetry_reason: Message | None = None
    # Where each number came from: key -> citation (vendor spec, paper, probe).
    sources: dict[str, Message] = {}
    # The host CPU of every node (NCCL's topology file needs it); None: unknown.
    host_cpu: HostCpu | None = None
    # One entry per distinct file, only when built from NodeTopology reports; empty for cluster
    # files and presets, whose PCI bus ids are synthetic.
    nccl_topology: list[NodeNcclTopology] = []
    # The transport between nodes (per-message costs of host-offloaded ones).
    transport: NetTransport = NetTransport()

    @model_validator(mode="after")
    def _consistent(self) -> ClusterTopology:
        for node in self.nodes:
            if node.gpus != self.gpus_per_node:
                raise ValueError(
                    f"node {node.name!r} has {node.gpus} GPUs but gpusPerNode is {self.gpus_per_node}"
                )
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"node {dup!r} is listed twice")
        ids = {d.id for d in self.devices}
        if len(ids) != len(self.devices):
            raise ValueError("device ids must be unique")
        for link in self.links:
            for end in (link.a, link.b):
                if ids and end not in ids:
                    raise ValueError(f"link {link.a}<->{link.b} names unknown device {end!r}")
        if self.dimensions is not None:
            total = 1
            for dim in self.dimensions:
                total *= dim.size
            if total != self.world_size:
                raise ValueError(
                    f"dimensions multiply to {total} GPUs but the cluster has {self.world_size}"
                )
        return self

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    def gpu_id(self, rank: int) -> str:
        node, local = divmod(rank, self.gpus_per_node)
        return f"{self.nodes[node].name}/gpu{local}"

    def coords(self, rank: int) -> tuple[int, ...]:
        """Rank -> coordinates along the dimensions, innermost first."""
        if self.dimensions is None:
            raise ValueError(f"cluster {self.name!r} is not symmetric: {self.asymmetry_reason}")
        out = []
        for dim in self.dimensions:
            rank, c = divmod(rank, dim.size)
            out.append(c)
        return tuple(out)

    def rank_of(self, coords: tuple[int, ...]) -> int:
        assert self.dimensions is not None
        rank, scale = 0, 1
        for c, dim in zip(coords, self.dimensions, strict=True):
            rank += c * scale
            scale *= dim.size
        return rank
