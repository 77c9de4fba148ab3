"""Alpha-beta cost model per NCCL protocol.

INTERFACE STUB — the model helper replaces the numbers with NCCL's published tables and adds the
rest (per-algorithm latencies, NCCL default choice). Keep the names: the simulator uses them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProtocolCost:
    name: str  # "LL", "LL128", "Simple"
    efficiency: float  # payload fraction of link bandwidth the protocol achieves (0..1]
    step_latency_us: float  # fixed cost of one transfer step (launch/sync/flag handling)
    # Cap on one channel's throughput, GB/s; None = no cap beyond the links.
    channel_cap_gbps: float | None = None


SIMPLE = ProtocolCost("Simple", 1.0, 1.0)
PROTOCOL_COSTS: dict[str, ProtocolCost] = {"Simple": SIMPLE}
