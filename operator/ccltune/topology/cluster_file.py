"""ccltune cluster YAML: the compact `ClusterSpec` form, or the full `ClusterTopology` wire form.

Compact (see examples/clusters/ and docs/topology.md):
    kind: ClusterSpec
    name: my-cluster
    servers: 4                      # or a list of node names
    gpusPerServer: 8
    intraNode: {fabric: nvswitch, bandwidthGbps: 300}
    nics: {perServer: 8, rateGbps: 200}
    network: {layout: rail, tiers: [{name: rail, size: 4}]}
Wire form: `kind: ClusterTopology` with the fields of api/cluster.py (camelCase).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from ..api.cluster import ClusterTopology
from .builder import build
from .errors import TopologyError
from .spec import ClusterSpec
from .symmetry import detect
from .yamlio import located, parse


def from_spec(spec: ClusterSpec) -> ClusterTopology:
    """Build the graph and detect its dimensions."""
    return detect(build(spec))


def is_wire_form(data: dict) -> bool:
    return data.get("kind") == "ClusterTopology" or "gpusPerNode" in data or "gpus_per_node" in data


def from_data(data: Any, lines: dict, source: str) -> ClusterTopology:
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping at the top level (a cluster description)")
    if is_wire_form(data):
        return _wire(data, lines, source)
    kind = data.get("kind", "ClusterSpec")
    if kind != "ClusterSpec":
        raise TopologyError(f"{source}:{lines.get(('kind',), 1)}: kind: {kind!r} is not ClusterSpec or ClusterTopology")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise located(exc, data, lines, source) from None
    try:
        return from_spec(spec)
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None


def _wire(data: dict, lines: dict, source: str) -> ClusterTopology:
    body = {k: v for k, v in data.items() if k not in ("kind", "apiVersion")}
    try:
        topo = ClusterTopology.model_validate(body)
    except ValidationError as exc:
        raise located(exc, body, lines, source) from None
    if not topo.devices:
        if topo.dimensions is None:
            raise TopologyError(f"{source}: devices: a ClusterTopology needs devices and links, or dimensions")
        from .astra import from_dimensions

        built = from_dimensions(topo.dimensions, name=topo.name, gpus_per_node=topo.gpus_per_node, source=source,
                                node_names=[n.name for n in topo.nodes])
        built.nodes = [n.model_copy(update={"fabric": {**b.fabric, **n.fabric}}) for n, b in zip(topo.nodes, built.nodes, strict=True)]
        return built.model_copy(update={"description": topo.description, "gpu_model": topo.gpu_model,
                                        "host_cpu": topo.host_cpu, "nccl_topology": topo.nccl_topology,
                                        "sources": {**built.sources, **topo.sources}})
    detected = detect(topo)
    if topo.dimensions is not None:
        if detected.dimensions is None:
            raise TopologyError(f"{source}: dimensions: given, but the links are not symmetric: {detected.asymmetry_reason}")
        if not same_dimensions(topo.dimensions, detected.dimensions):
            raise TopologyError(
                f"{source}:{lines.get(('dimensions',), 1)}: dimensions: given as {_short(topo.dimensions)} "
                f"but the devices and links give {_short(detected.dimensions)}"
            )
        return topo
    return detected


def same_dimensions(a: list, b: list, rel: float = 1e-6) -> bool:
    return len(a) == len(b) and all(
        x.kind == y.kind and x.size == y.size
        and math.isclose(x.bandwidth_gbps, y.bandwidth_gbps, rel_tol=rel)
        and math.isclose(x.latency_us, y.latency_us, rel_tol=rel, abs_tol=1e-9)
        for x, y in zip(a, b, strict=True)
    )


def _short(dims: list) -> str:
    return "[" + ", ".join(f"{d.kind} {d.size} @ {d.bandwidth_gbps:g} GB/s" for d in dims) + "]"


def load_text(text: str, source: str = "<string>") -> ClusterTopology:
    data, lines = parse(text, source)
    return from_data(data, lines, source)
