"""Every preset loads, its numbers are the documented ones, and its graph follows the convention."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
import yaml

from ccltune.api.cluster import ClusterTopology, DeviceKind, LinkKind
from ccltune.topology.errors import TopologyError
from ccltune.topology.presets import list_presets, load_preset, preset_text

ROOT = Path(__file__).resolve().parents[2]
NAMES = [
    "a40-pcie-8", "dgx-a100-1", "dgx-a100-2", "dgx-h100-1", "dgx-h100-2", "h800-rail-512", "h800-rail-64",
    "mi300x-8", "syccl-a800-16", "syccl-a800-32", "v100-cubemesh-4",
]
# (kind, size, GB/s per GPU per direction) innermost first; None = asymmetric.
EXPECTED_DIMS: dict[str, list[tuple[str, int, float]] | None] = {
    "syccl-a800-32": [("switch", 8, 200.0), ("switch", 4, 12.5)],  # leaf+spine merged: non-blocking
    "syccl-a800-16": [("switch", 8, 200.0), ("switch", 2, 12.5)],
    "h800-rail-64": [("switch", 8, 200.0), ("switch", 8, 50.0)],
    "h800-rail-512": [("switch", 8, 200.0), ("switch", 64, 50.0)],
    "dgx-a100-1": [("switch", 8, 300.0)],
    "dgx-a100-2": [("switch", 8, 300.0), ("switch", 2, 25.0)],
    "dgx-h100-1": [("switch", 8, 450.0)],
    "dgx-h100-2": [("switch", 8, 450.0), ("switch", 2, 50.0)],
    "mi300x-8": [("fully_connected", 8, 448.0)],
    "v100-cubemesh-4": None,
    "a40-pcie-8": None,
}
# (servers, GPUs per server, NICs per server, NIC Gb/s) as documented in docs/topology.md.
EXPECTED_SHAPE = {
    "syccl-a800-32": (4, 8, 4, 200), "syccl-a800-16": (2, 8, 4, 200),
    "h800-rail-64": (8, 8, 8, 400), "h800-rail-512": (64, 8, 8, 400),
    "dgx-a100-1": (1, 8, 8, 200), "dgx-a100-2": (2, 8, 8, 200),
    "dgx-h100-1": (1, 8, 8, 400), "dgx-h100-2": (2, 8, 8, 400),
    "v100-cubemesh-4": (1, 4, 2, 100), "a40-pcie-8": (1, 8, 0, 0), "mi300x-8": (1, 8, 0, 0),
}


def test_preset_names_are_exactly_the_documented_ones() -> None:
    assert list_presets() == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_preset_dimensions_are_detected_as_expected(name: str) -> None:
    topo = load_preset(name)
    expected = EXPECTED_DIMS[name]
    if expected is None:
        assert topo.dimensions is None
        assert topo.asymmetry_reason and "node0" in topo.asymmetry_reason
    else:
        assert topo.dimensions is not None, topo.asymmetry_reason
        got = [(d.kind, d.size, d.bandwidth_gbps) for d in topo.dimensions]
        assert got == expected


@pytest.mark.parametrize("name", NAMES)
def test_preset_shape_matches_docs(name: str) -> None:
    topo = load_preset(name)
    servers, gpn, nics, rate = EXPECTED_SHAPE[name]
    assert (topo.node_count, topo.gpus_per_node) == (servers, gpn)
    node = topo.nodes[0].name
    node_nics = [d.id for d in topo.devices if d.kind == DeviceKind.NIC and d.node == node]
    assert len(node_nics) == nics
    net = [lk for lk in topo.links if lk.kind == LinkKind.NET and lk.a in node_nics]
    assert len(net) == nics
    for lk in net:
        assert lk.bandwidth_gbps * 8 == pytest.approx(rate)


def _numeric_paths(data: object, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            if k in ("sources", "name", "description", "kind"):
                continue
            out += _numeric_paths(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(data, list):
        for v in data:
            out += _numeric_paths(v, prefix)
    elif isinstance(data, int | float) and not isinstance(data, bool):
        out.append(prefix)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_preset_number_has_a_source(name: str) -> None:
    data = yaml.safe_load(preset_text(name))
    sources: dict[str, str] = data["sources"]
    for path in _numeric_paths(data):
        covering = [k for k in sources if path == k or path.startswith(k + ".")]
        assert covering, f"{name}: {path} has no source"
        assert all(len(sources[k]) > 20 for k in covering)
    topo = load_preset(name)
    assert topo.sources == sources


def test_preset_facts_from_papers_and_datasheets() -> None:
    a800 = load_preset("syccl-a800-32")
    assert "SyCCL" in a800.sources["servers"] and "4 x 200 Gb/s" in a800.sources["nics.perServer"]
    h800 = load_preset("h800-rail-64")
    assert h800.dimensions is not None
    nvlink, nic = h800.dimensions[0].bandwidth_gbps, h800.dimensions[1].bandwidth_gbps
    assert nvlink / nic == 4.0  # SyCCL: NVLink:NIC = 4:1 on H800
    cube = load_preset("v100-cubemesh-4")
    pair = {(lk.a, lk.b): lk.bandwidth_gbps for lk in cube.links if lk.kind == LinkKind.NVLINK}
    assert pair[("node0/gpu0", "node0/gpu3")] == 50.0 and pair[("node0/gpu0", "node0/gpu1")] == 25.0
    mi = load_preset("mi300x-8")
    xgmi = [lk for lk in mi.links if lk.kind == LinkKind.XGMI]
    assert len(xgmi) == 28 and {lk.bandwidth_gbps for lk in xgmi} == {64.0}
    a40 = load_preset("a40-pcie-8")
    bridges = [lk for lk in a40.links if lk.kind == LinkKind.NVLINK]
    assert len(bridges) == 4 and {lk.bandwidth_gbps for lk in bridges} == {56.25}


def test_docs_list_every_preset() -> None:
    doc = (ROOT / "docs" / "topology.md").read_text()
    for name in NAMES:
        assert f"`{name}`" in doc


def _reachable_without_gpu_transit(topo: ClusterTopology, start: str) -> set[str]:
    kind = {d.id: d.kind for d in topo.devices}
    adj: dict[str, list[str]] = {}
    for lk in topo.links:
        adj.setdefault(lk.a, []).append(lk.b)
        adj.setdefault(lk.b, []).append(lk.a)
    seen, gpus = {start}, set()
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        for nxt in adj.get(cur, []):
            if nxt in seen:
                continue
            seen.add(nxt)
            if kind[nxt] == DeviceKind.GPU:
                gpus.add(nxt)  # an endpoint: never expanded
            else:
                queue.append(nxt)
    return gpus


@pytest.mark.parametrize("name", NAMES)
def test_graph_convention_and_every_gpu_pair_reachable(name: str) -> None:
    topo = load_preset(name)
    gpus = [d for d in topo.devices if d.kind == DeviceKind.GPU]
    assert len(gpus) == topo.world_size
    for d in gpus:
        assert d.id == f"{d.node}/gpu{d.local_index}"
    for d in topo.devices:
        if d.kind == DeviceKind.NVSWITCH:
            assert d.id == f"{d.node}/nvswitch"
    all_gpus = {d.id for d in gpus}
    # Every GPU reaches every other GPU through non-GPU devices or a direct link.
    for rank in sorted({0, topo.world_size - 1, topo.world_size // 2}):
        start = topo.gpu_id(rank)
        assert _reachable_without_gpu_transit(topo, start) | {start} == all_gpus


def test_512_gpu_graph_stays_small() -> None:
    topo = load_preset("h800-rail-512")
    assert len(topo.devices) < 3 * topo.world_size and len(topo.links) < 5 * topo.world_size


def test_load_preset_returns_independent_copies() -> None:
    a = load_preset("dgx-a100-2")
    a.links.clear()
    assert load_preset("dgx-a100-2").links


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(TopologyError) as err:
        load_preset("dgx-z900")
    msg = str(err.value)
    assert "dgx-z900" in msg and "syccl-a800-32" in msg and "\n" not in msg


def test_docs_preset_table_matches_the_loaded_dimensions() -> None:
    """The dims column of docs/topology.md's preset table is what the presets load as."""
    doc = (ROOT / "docs" / "topology.md").read_text()
    checked = 0
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 6 or not cells[0].startswith("`") or cells[0].count("`") != 2:
            continue
        name = cells[0].strip("`")
        topo = load_preset(name)
        if cells[-1].startswith("asymmetric"):
            assert topo.dimensions is None, name
        else:
            documented = []
            for part in cells[-1].split(","):
                kind, size, _, bw = part.split()
                documented.append((kind, int(size), float(bw)))
            assert topo.dimensions is not None
            assert [(d.kind, d.size, d.bandwidth_gbps) for d in topo.dimensions] == documented, name
        checked += 1
    assert checked == len(NAMES)
