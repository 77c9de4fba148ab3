"""`load_cluster(ref)`: a preset name or a file path (ccltune cluster YAML or ASTRA-sim YAML)."""

from __future__ import annotations

from pathlib import Path

from ..api.cluster import ClusterTopology
from . import astra, cluster_file, presets
from .errors import TopologyError
from .yamlio import parse


def load_cluster(ref: str) -> ClusterTopology:
    """Preset name, or path to a ccltune ClusterSpec / ClusterTopology / ASTRA-sim network YAML.

    Raises TopologyError with one line naming the preset, file line, field or node.
    """
    ref = ref.strip()
    if not ref:
        raise TopologyError("cluster: empty reference (give a preset name or a file path)")
    path = Path(ref)
    looks_like_path = path.suffix.lower() in (".yaml", ".yml", ".json") or "/" in ref or path.exists()
    if not looks_like_path:
        return presets.load_preset(ref)
    if not path.is_file():
        raise TopologyError(f"cluster file {ref}: not found (presets: {', '.join(presets.list_presets())})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cluster file {ref}: cannot read: {exc}") from None
    return load_text(text, source=ref)


def load_text(text: str, source: str = "<string>") -> ClusterTopology:
    data, lines = parse(text, source)
    if data is None:
        raise TopologyError(f"{source}: empty file")
    if astra.is_astra(data):
        name = Path(source).stem if source != "<string>" else "astra-sim"
        return astra.from_astra(data, source, name=name)
    return cluster_file.from_data(data, lines, source)


def require_symmetric(topo: ClusterTopology) -> ClusterTopology:
    """`topo` itself, or TopologyError naming why it has no symmetric dimensions."""
    if topo.dimensions is None:
        raise TopologyError(f"cluster {topo.name}: not symmetric: {topo.asymmetry_reason}")
    return topo
