"""Adapter to the topology engineer's `ccltune.topology.from_nodes` (reports + labels -> cluster)."""

from __future__ import annotations

from typing import Any

from ..api.cluster import ClusterTopology
from ..api.nodetopology import NodeTopology


class Unavailable(Exception):
    """This build cannot turn node reports into a ClusterTopology yet."""


def build_cluster(reports: list[NodeTopology], nodes: dict[str, dict[str, Any]], *, name: str) -> ClusterTopology:
    """Reports in target order (sorted node names: global rank = node index * gpus + local)."""
    try:
        from ..topology.from_nodes import from_nodes
    except ImportError:
        raise Unavailable("ccltune.topology.from_nodes is not available in this build") from None
    labels = {r.spec.node_name: dict((nodes.get(r.spec.node_name) or {}).get("metadata", {}).get("labels") or {})
              for r in reports}
    cluster: ClusterTopology = from_nodes(reports, labels, name=name)
    return cluster


def caveats(reports: list[NodeTopology], cluster: ClusterTopology) -> list[str]:
    """Shapes that plan but cost at run time (odd GPU counts, mixed GPU models), one line each."""
    from ..topology.shape_warnings import mixed_gpu_models, shape_warnings

    models = {r.spec.node_name: g.name for r in reports for g in r.spec.gpus[:1]}
    mixed = mixed_gpu_models(models)
    return shape_warnings(cluster) + ([mixed] if mixed else [])


def describe(cluster: ClusterTopology) -> str:
    try:
        from ..topology.export import describe as _describe

        return str(_describe(cluster))
    except ImportError:
        gpus = f"{cluster.node_count} node(s) x {cluster.gpus_per_node} {cluster.gpu_model or 'GPU'}"
        if cluster.dimensions:
            dims = " · ".join(f"{d.size}x {d.name} {d.bandwidth_gbps:g} GB/s" for d in cluster.dimensions)
            return f"{gpus}; {dims}"
        return f"{gpus}; asymmetric: {cluster.asymmetry_reason or 'unknown'}"
