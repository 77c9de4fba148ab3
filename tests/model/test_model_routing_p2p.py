"""Two GPUs of one server joined by NVLink (directly or through an NVSwitch) talk over it, as
NCCL's P2P transport does: the simulator's routes must not detour through PCIe and the CPU.
(ASTRA-sim imports once hung every GPU off the CPU with PCIe latency 0, so GPU -> CPU -> GPU
out-ranked the NVSwitch and intra-node traffic ran at PCIe's rate.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ccltune.api.cluster import ClusterTopology
from ccltune.model.sim.routing import Router
from ccltune.topology.load import load_cluster
from ccltune.topology.presets import list_presets, load_preset

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "clusters").glob("*.yaml"))


def _nvlink_peers(topo: ClusterTopology, gpu: str) -> set[str]:
    """GPUs reachable from `gpu` over NVLink links only (through NVSwitches, not other GPUs)."""
    gpus = {topo.gpu_id(r) for r in range(topo.world_size)}
    adj: dict[str, set[str]] = {}
    for link in topo.links:
        if link.kind == "nvlink":
            adj.setdefault(link.a, set()).add(link.b)
            adj.setdefault(link.b, set()).add(link.a)
    seen, todo = {gpu}, [gpu]
    while todo:
        for nxt in adj.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                if nxt not in gpus:
                    todo.append(nxt)
    return (seen & gpus) - {gpu}


@pytest.mark.parametrize("name", list_presets() + [str(p) for p in EXAMPLES])
def test_nvlink_peers_are_routed_over_nvlink(name: str) -> None:
    topo = load_cluster(name) if name.endswith(".yaml") else load_preset(name)
    router = Router(topo)
    kinds = {}
    for i, link in enumerate(topo.links):
        kinds[2 * i] = kinds[2 * i + 1] = link.kind
    rank_of = {topo.gpu_id(r): r for r in range(topo.world_size)}
    for src in range(min(topo.gpus_per_node, topo.world_size)):
        for peer in sorted(_nvlink_peers(topo, topo.gpu_id(src))):
            path = router.path(src, rank_of[peer])
            assert {kinds[c] for c in path} == {"nvlink"}, (name, src, peer, [kinds[c] for c in path])
