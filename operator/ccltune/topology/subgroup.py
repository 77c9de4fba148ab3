"""The sub-cluster a communicator sees: only its GPUs, with the fabric they share."""

from __future__ import annotations

from collections import Counter

from ..api.cluster import ClusterNode, ClusterTopology, DeviceKind
from ..api.errors import InputError
from .symmetry import detect


class SubgroupError(InputError):
    pass


def subcluster(topo: ClusterTopology, ranks: tuple[int, ...] | list[int]) -> ClusterTopology:
    """Restrict `topo` to `ranks` (renumbered in the given order), keeping switches, NICs, CPUs.

    Every node that holds some of the ranks must hold the same number of them: NCCL
    communicators planned here are the regular groups of data/tensor/pipeline parallelism.
    """
    ranks = list(ranks)
    if sorted(ranks) == list(range(topo.world_size)):
        return topo
    if len(set(ranks)) != len(ranks):
        raise SubgroupError("a communicator lists the same rank twice")
    for r in ranks:
        if not 0 <= r < topo.world_size:
            raise SubgroupError(f"rank {r} is outside the cluster's {topo.world_size} GPUs")
    per_node = Counter(r // topo.gpus_per_node for r in ranks)
    counts = set(per_node.values())
    if len(counts) != 1:
        raise SubgroupError(
            "the communicator holds different numbers of GPUs per node: "
            + ", ".join(f"{topo.nodes[n].name}={c}" for n, c in sorted(per_node.items()))
        )
    local_count = counts.pop()
    kept_nodes = [topo.nodes[n] for n in sorted(per_node)]
    kept_names = {n.name for n in kept_nodes}
    # Renumber GPUs node by node, keeping their order inside the node.
    rename: dict[str, str] = {}
    by_node: dict[int, list[int]] = {}
    for r in sorted(ranks):
        by_node.setdefault(r // topo.gpus_per_node, []).append(r)
    for node_index, node_ranks in by_node.items():
        for new_local, r in enumerate(node_ranks):
            rename[topo.gpu_id(r)] = f"{topo.nodes[node_index].name}/gpu{new_local}"
    devices = []
    for dev in topo.devices:
        if dev.kind == DeviceKind.GPU:
            if dev.id in rename:
                local = int(rename[dev.id].rsplit("gpu", 1)[1])
                devices.append(dev.model_copy(update={"id": rename[dev.id], "local_index": local}))
        elif dev.node is None or dev.node in kept_names:
            devices.append(dev)
    gpu_ids = {d.id for d in topo.devices if d.kind == DeviceKind.GPU}
    kept_other = {d.id for d in devices if d.kind != DeviceKind.GPU}

    def kept(end: str) -> bool:
        return end in rename if end in gpu_ids else end in kept_other

    links = [
        link.model_copy(update={"a": rename.get(link.a, link.a), "b": rename.get(link.b, link.b)})
        for link in topo.links
        if kept(link.a) and kept(link.b)
    ]
    sub = ClusterTopology(
        name=f"{topo.name}[{len(ranks)} of {topo.world_size}]",
        description=f"communicator of {len(ranks)} GPUs inside {topo.name}",
        gpu_model=topo.gpu_model,
        gpus_per_node=local_count,
        nodes=[ClusterNode(name=n.name, gpus=local_count, fabric=n.fabric) for n in kept_nodes],
        devices=devices,
        links=links,
        sources=topo.sources,
    )
    return detect(sub)
