"""The compact cluster description users write (and presets are written in).

One server shape repeated over N servers, plus the network tiers above them. `builder.py` turns
it into the device/link graph of a `ClusterTopology`. Units: bandwidth GB/s per direction,
latency microseconds; only NIC rates are Gb/s (bits), as vendors and `ibstat` state them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ..api.cluster import NetTransport
from ..api.common import Message, ShortText, WireModel
from ..api.nodetopology import HostCpu

PositiveFloat = Annotated[float, Field(gt=0)]
Latency = Annotated[float, Field(ge=0)]

# PCIe payload rate per lane per direction in GB/s, after line coding (PCI-SIG base specs:
# Gen3 8 GT/s and Gen4 16 GT/s and Gen5 32 GT/s with 128b/130b encoding).
PCIE_LANE_GBPS = {3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}


def pcie_bandwidth(generation: int, lanes: int) -> float:
    return round(PCIE_LANE_GBPS[generation] * lanes, 3)


class IntraNode(WireModel):
    """How the GPUs inside one server talk to each other besides PCIe."""

    fabric: Literal["nvswitch", "fully_connected", "ring", "mesh", "pcie"]
    # nvswitch: per GPU, per direction, into the switch fabric.
    bandwidth_gbps: PositiveFloat | None = None
    # fully_connected / ring / mesh / pcie bridges: one link, per direction.
    link_bandwidth_gbps: PositiveFloat | None = None
    link_kind: Literal["nvlink", "xgmi"] = "nvlink"
    # GPU-to-GPU latency over this fabric (through the NVSwitch: both hops together).
    latency_us: Latency = 0.6
    # mesh: [gpuA, gpuB, count] (count parallel links); pcie: NVLink bridges [gpuA, gpuB, 1].
    links: Annotated[list[Annotated[list[int], Field(min_length=2, max_length=3)]], Field(max_length=2048)] = []

    @model_validator(mode="after")
    def _need(self) -> IntraNode:
        if self.fabric == "nvswitch" and self.bandwidth_gbps is None:
            raise ValueError("fabric nvswitch needs bandwidthGbps (per GPU, per direction)")
        if self.fabric in ("fully_connected", "ring", "mesh") and self.link_bandwidth_gbps is None:
            raise ValueError(f"fabric {self.fabric} needs linkBandwidthGbps (per link, per direction)")
        if self.fabric == "mesh" and not self.links:
            raise ValueError("fabric mesh needs links: [[gpuA, gpuB, count], ...]")
        if self.fabric == "pcie" and self.links and self.link_bandwidth_gbps is None:
            raise ValueError("NVLink bridges (links) need linkBandwidthGbps")
        if self.fabric in ("nvswitch", "fully_connected", "ring") and self.links:
            raise ValueError(f"links are only for fabric mesh or pcie, not {self.fabric}")
        return self


class Pcie(WireModel):
    """The PCIe tree: GPUs and NICs below PCIe switches below CPU sockets."""

    generation: Literal[3, 4, 5] = 4
    lanes: Annotated[int, Field(ge=1, le=32)] = 16
    bandwidth_gbps: PositiveFloat | None = None  # overrides generation x lanes
    gpus_per_switch: Annotated[int, Field(ge=0, le=64)] = 2  # 0: GPUs hang off the CPU root
    cpus: Annotated[int, Field(ge=1, le=8)] = 2
    smp_bandwidth_gbps: PositiveFloat = 32.0
    latency_us: Latency = 0.5  # per PCIe link
    smp_latency_us: Latency = 0.5

    @property
    def link_gbps(self) -> float:
        return self.bandwidth_gbps or pcie_bandwidth(self.generation, self.lanes)


class Nics(WireModel):
    per_server: Annotated[int, Field(ge=0, le=64)] = 0
    rate_gbps: Annotated[float, Field(gt=0)] = 100.0  # Gb/s, bits
    latency_us: Latency = 2.5  # NIC <-> leaf
    link_layer: Literal["InfiniBand", "Ethernet"] = "InfiniBand"
    # rdma (default), efa, socket, tcpx, tcpxo; host-offloaded ones pay perMessageUs per message.
    transport: NetTransport = NetTransport()


class Tier(WireModel):
    """One level of switches. Tier 0 is the leaf (ToR or rail) level."""

    name: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9-]*$")]
    # Tier 0: servers per leaf domain. Tier t>0: lower-tier domains per domain of this tier.
    size: Annotated[int, Field(ge=1)] | None = None
    # Lower tier's downlink : uplink capacity into this tier (1 = non-blocking). Not for tier 0.
    oversubscription: Annotated[float, Field(ge=1)] = 1.0
    # Parallel equal switches of this tier per domain (aggregated when 1).
    switches: Annotated[int, Field(ge=1, le=64)] = 1
    latency_us: Latency = 0.5  # link from the tier below up to this tier


class Network(WireModel):
    # rail: NIC j of every server in a leaf domain goes to leaf j; tor: all NICs to one leaf.
    layout: Literal["rail", "tor"] = "tor"
    tiers: Annotated[list[Tier], Field(max_length=6)] = []


class ClusterSpec(WireModel):
    api_version: ShortText | None = None
    kind: Literal["ClusterSpec"] = "ClusterSpec"
    name: Annotated[str, Field(min_length=1, max_length=253)]
    description: Message = ""
    gpu_model: ShortText = ""
    servers: Annotated[int, Field(ge=1, le=4096)] | Annotated[list[str], Field(min_length=1)]
    gpus_per_server: Annotated[int, Field(ge=1, le=64)]
    intra_node: IntraNode
    pcie: Pcie = Pcie()
    nics: Nics = Nics()
    network: Network = Network()
    # The servers' CPU as NCCL's topology file names it (arch, vendor, familyId, modelId).
    cpu: HostCpu | None = None
    sources: dict[str, Message] = {}

    @property
    def server_names(self) -> list[str]:
        if isinstance(self.servers, int):
            return [f"node{i}" for i in range(self.servers)]
        return list(self.servers)

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        n = self.gpus_per_server
        for i, link in enumerate(self.intra_node.links):
            a, b = link[0], link[1]
            if not (0 <= a < n and 0 <= b < n) or a == b:
                raise ValueError(f"intraNode.links[{i}]: GPUs {a},{b} must be distinct and < {n}")
            if len(link) == 3 and link[2] < 1:
                raise ValueError(f"intraNode.links[{i}]: link count must be >= 1")
        names = self.server_names
        if len(set(names)) != len(names):
            dup = next(x for x in names if names.count(x) > 1)
            raise ValueError(f"servers: {dup!r} is listed twice")
        for nm in names:
            if not nm or "/" in nm:
                raise ValueError(f"servers: {nm!r} is not a valid node name")
        return self
