"""Cluster files (compact, wire, ASTRA-sim): loading, round trips, and one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccltune.topology.astra import dimensions_from
from ccltune.topology.cluster_file import from_spec, same_dimensions
from ccltune.topology.errors import TopologyError
from ccltune.topology.export import describe, to_astra_yaml
from ccltune.topology.load import load_cluster, load_text, require_symmetric
from ccltune.topology.presets import load_preset
from ccltune.topology.spec import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "clusters"


@st.composite
def symmetric_specs(draw: st.DrawFn) -> ClusterSpec:
    """Random symmetric clusters in the compact form: inner fabric, NICs and 1-3 network tiers."""
    gpn = draw(st.integers(2, 8))
    fabric = draw(st.sampled_from(["nvswitch", "fully_connected", "ring"] if gpn >= 3 else ["nvswitch", "fully_connected"]))
    bw = draw(st.sampled_from([25.0, 50.0, 64.0, 100.0, 150.0, 300.0]))
    intra = {"fabric": fabric, "latencyUs": draw(st.sampled_from([0.3, 0.6, 1.0]))}
    intra["bandwidthGbps" if fabric == "nvswitch" else "linkBandwidthGbps"] = bw
    tiers = []
    servers = 1
    for t in range(draw(st.integers(0, 3))):
        size = draw(st.integers(2, 4))
        servers *= size
        tier: dict[str, object] = {"name": ("leaf", "spine", "core")[t], "size": size}
        if t:
            tier["oversubscription"] = draw(st.sampled_from([1.0, 1.5, 2.0, 4.0]))
            tier["latencyUs"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
        tiers.append(tier)
    data: dict[str, object] = {
        "name": "random", "servers": servers, "gpusPerServer": gpn, "intraNode": intra,
        "pcie": {"generation": draw(st.sampled_from([3, 4, 5])), "gpusPerSwitch": draw(st.sampled_from([0, 1, 2])),
                 "cpus": draw(st.integers(1, 2)), "bandwidthGbps": draw(st.sampled_from([None, 1000.0]))},
    }
    if servers > 1:
        data["nics"] = {"perServer": draw(st.sampled_from([1, 2, gpn])), "rateGbps": draw(st.sampled_from([100, 200, 400]))}
        data["network"] = {"layout": draw(st.sampled_from(["rail", "tor"])), "tiers": tiers}
    return ClusterSpec.model_validate(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(symmetric_specs())
def test_random_symmetric_clusters_round_trip_through_astra_sim(spec: ClusterSpec) -> None:
    topo = from_spec(spec)
    assert topo.dimensions is not None, topo.asymmetry_reason
    tiers = spec.network.tiers
    if tiers:
        nic_share = spec.nics.per_server * spec.nics.rate_gbps / 8 / spec.gpus_per_server
        first = topo.dimensions[1].bandwidth_gbps
        # NIC share per GPU, unless the PCIe tree cannot carry it (then less, never more).
        assert first <= nic_share + 1e-9
        if spec.pcie.bandwidth_gbps == 1000.0:
            assert first == pytest.approx(nic_share)
        # Each tier: the lower tier's rate, or the NIC share over the oversubscription so far.
        share, expected = nic_share, [(tiers[0].size, first)]
        for t in tiers[1:]:
            share /= t.oversubscription
            bw = min(expected[-1][1], share)
            if bw == pytest.approx(expected[-1][1], rel=1e-9):
                expected[-1] = (expected[-1][0] * t.size, bw)  # non-blocking tier: same dimension
            else:
                expected.append((t.size, bw))
        got = [(d.size, d.bandwidth_gbps) for d in topo.dimensions[1:]]
        assert [g[0] for g in got] == [e[0] for e in expected]
        assert [g[1] for g in got] == pytest.approx([e[1] for e in expected])
    else:
        assert [d.size for d in topo.dimensions] == [spec.gpus_per_server]
    assert topo.dimensions[0].size == spec.gpus_per_server
    text = to_astra_yaml(topo)
    back = load_text(text, "random.yaml")
    assert back.dimensions is not None
    assert same_dimensions(topo.dimensions, back.dimensions), (topo.dimensions, back.dimensions)
    assert back.world_size == topo.world_size
    # And once more: the imported graph exports the same file.
    assert to_astra_yaml(back).splitlines()[2:] == text.splitlines()[2:]


def test_astra_yaml_values_follow_the_analytical_backend() -> None:
    text = to_astra_yaml(load_preset("mi300x-8"))
    data = yaml.safe_load(text)
    assert data == {"topology": ["FullyConnected"], "npus_count": [8], "bandwidth": [64.0], "latency": [600.0]}
    ring = dimensions_from({"topology": ["Ring"], "npus_count": [4], "bandwidth": [10], "latency": [100]}, "x")
    assert (ring[0].kind, ring[0].bandwidth_gbps, ring[0].latency_us) == ("ring", 20.0, 0.1)
    sw = dimensions_from({"topology": ["Switch"], "npus_count": [4], "bandwidth": [10], "latency": [100]}, "x")
    assert sw[0].latency_us == pytest.approx(0.2)


def test_wire_form_round_trips_and_checks_given_dimensions(tmp_path: Path) -> None:
    topo = load_preset("syccl-a800-16")
    path = tmp_path / "wire.yaml"
    path.write_text(yaml.safe_dump({"kind": "ClusterTopology", **topo.wire()}))
    back = load_cluster(str(path))
    assert back.dimensions == topo.dimensions and len(back.links) == len(topo.links)
    wire = topo.wire()
    wire["dimensions"][1]["bandwidthGbps"] = 99.0
    path.write_text(yaml.safe_dump({"kind": "ClusterTopology", **wire}))
    with pytest.raises(TopologyError, match=r"dimensions: given as .* but the devices and links give"):
        load_cluster(str(path))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_cluster_files_load(path: Path) -> None:
    topo = load_cluster(str(path))
    assert describe(topo)
    if "cubemesh" in path.name:
        assert topo.dimensions is None and "node0" in (topo.asymmetry_reason or "")
        with pytest.raises(TopologyError, match="not symmetric"):
            require_symmetric(topo)
    else:
        assert require_symmetric(topo).dimensions


def test_examples_cover_each_format() -> None:
    kinds = set()
    for path in EXAMPLES.glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        kinds.add("astra" if "npus_count" in data else data.get("kind"))
    assert {"astra", "ClusterSpec", "ClusterTopology"} <= kinds


def test_example_names_and_oversubscription() -> None:
    topo = load_cluster(str(EXAMPLES / "a100-rail-4node.yaml"))
    assert [n.name for n in topo.nodes] == ["gpu-a-01", "gpu-a-02", "gpu-b-01", "gpu-b-02"]
    assert describe(topo) == "4 nodes x 8 A100-SXM4-80GB · switch 8 @ 300 GB/s · switch 2 @ 25 GB/s · switch 2 @ 12.5 GB/s"


BAD = [
    ("malformed", "name: x\nservers: [1, 2\n", r"^bad\.yaml:3: malformed YAML"),
    ("not a mapping", "- 1\n- 2\n", r"expected a mapping"),
    ("missing field", "name: x\nservers: 2\nintraNode: {fabric: nvswitch, bandwidthGbps: 1}\n",
     r"^bad\.yaml:1: gpusPerServer: required field is missing"),
    ("unknown field", "name: x\nservers: 1\ngpusPerServer: 2\nintraNode: {fabric: nvswitch, bandwidthGbps: 1}\nnicz: 3\n",
     r"^bad\.yaml:5: nicz: unknown field"),
    ("bad fabric", "name: x\nservers: 1\ngpusPerServer: 2\nintraNode:\n  fabric: torus\n",
     r"^bad\.yaml:5: intraNode\.fabric: Input should be"),
    ("zero gpus", "name: x\nservers: 1\ngpusPerServer: 0\nintraNode: {fabric: nvswitch, bandwidthGbps: 1}\n",
     r"^bad\.yaml:3: gpusPerServer: "),
    ("negative bandwidth", "name: x\nservers: 1\ngpusPerServer: 2\nintraNode:\n  fabric: nvswitch\n  bandwidthGbps: -5\n",
     r"^bad\.yaml:6: intraNode\.bandwidthGbps: "),
    ("mesh link out of range", "name: x\nservers: 1\ngpusPerServer: 2\nintraNode:\n  fabric: mesh\n"
     "  linkBandwidthGbps: 25\n  links: [[0, 5, 1]]\n", r"intraNode\.links\[0\]: GPUs 0,5"),
    ("no nics", "name: x\nservers: 2\ngpusPerServer: 2\nintraNode: {fabric: nvswitch, bandwidthGbps: 1}\n",
     r"nics\.perServer: 2 servers need at least one NIC"),
    ("tier sizes", "name: x\nservers: 6\ngpusPerServer: 2\nintraNode: {fabric: nvswitch, bandwidthGbps: 1}\n"
     "nics: {perServer: 1}\nnetwork: {tiers: [{name: leaf, size: 4}]}\n", r"network\.tiers: sizes multiply to 4 servers but there are 6"),
    ("dup server", "name: x\nservers: [a, a]\ngpusPerServer: 2\nintraNode: {fabric: nvswitch, bandwidthGbps: 1}\n",
     r"servers: 'a' is listed twice"),
    ("wire node", "kind: ClusterTopology\nname: x\ngpusPerNode: 8\nnodes: [{name: a, gpus: 8}, {name: b, gpus: 4}]\n",
     r"node 'b' has 4 GPUs but gpusPerNode is 8"),
    ("wire unknown device", "kind: ClusterTopology\nname: x\ngpusPerNode: 1\nnodes: [{name: a, gpus: 1}]\n"
     "devices: [{id: a/gpu0, kind: gpu}]\nlinks: [{a: a/gpu0, b: ghost, kind: nvlink, bandwidthGbps: 1}]\n",
     r"names unknown device 'ghost'"),
    ("astra lengths", "topology: [Switch, Ring]\nnpus_count: [8]\nbandwidth: [1, 2]\nlatency: [1, 2]\n",
     r"npus_count: has 1 entries but topology has 2"),
    ("astra kind", "topology: [Torus]\nnpus_count: [8]\nbandwidth: [1]\nlatency: [1]\n",
     r"topology\[0\]: 'Torus' is not Ring, FullyConnected or Switch"),
    ("astra bw", "topology: [Switch]\nnpus_count: [8]\nbandwidth: [0]\nlatency: [1]\n", r"bandwidth\[0\]: 0 is not a positive"),
    ("astra outer ring", "topology: [Switch, Ring]\nnpus_count: [8, 4]\nbandwidth: [100, 10]\nlatency: [1, 1]\n",
     r"outer dimensions must be Switch"),
    ("kind", "kind: Deployment\nname: x\n", r"kind: 'Deployment' is not ClusterSpec or ClusterTopology"),
    ("empty", "", r"empty file"),
]


@pytest.mark.parametrize(("text", "pattern"), [(t, p) for _, t, p in BAD], ids=[b[0] for b in BAD])
def test_bad_input_gives_one_line_naming_the_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, pattern: str
) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TopologyError) as err:
        load_cluster("bad.yaml")
    msg = str(err.value)
    assert "\n" not in msg
    assert re.search(pattern, msg), msg


def test_missing_file_and_empty_reference() -> None:
    with pytest.raises(TopologyError, match=r"cluster file nope\.yaml: not found \(presets: a40-pcie-8"):
        load_cluster("nope.yaml")
    with pytest.raises(TopologyError, match="empty reference"):
        load_cluster("  ")


def test_astra_export_refuses_asymmetric_clusters() -> None:
    with pytest.raises(TopologyError, match=r"cluster v100-cubemesh-4: ASTRA-sim needs symmetric dimensions, but node node0"):
        to_astra_yaml(load_preset("v100-cubemesh-4"))


def test_dgx1_example_gives_every_v100_its_six_nvlinks() -> None:
    """V100 SXM2 has 6 NVLink2 links (25 GB/s each way); the cube-mesh example must use all 6."""
    topo = load_cluster(str(EXAMPLES / "dgx1-v100-cubemesh.yaml"))
    per_gpu: dict[str, float] = {}
    for lk in topo.links:
        if lk.kind == "nvlink":
            for end in (lk.a, lk.b):
                per_gpu[end] = per_gpu.get(end, 0.0) + lk.bandwidth_gbps
    assert per_gpu == {f"node0/gpu{i}": 150.0 for i in range(8)}


def test_json_wire_form_as_kubectl_prints_it(tmp_path: Path) -> None:
    import json

    topo = load_preset("mi300x-8")
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "ccltune.io/v1alpha1", "kind": "ClusterTopology", **topo.wire()}))
    back = load_cluster(str(path))
    assert back.dimensions == topo.dimensions and back.sources == topo.sources


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(-1, 500, allow_nan=False),
                     st.sampled_from(["", "x", "nvswitch", "rail", "Switch", "1e3", "-1"]))
_values = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
    st.sampled_from(["name", "servers", "gpusPerServer", "intraNode", "fabric", "nics", "network", "tiers",
                     "size", "topology", "npus_count", "bandwidth", "latency", "kind", "links"]), kids, max_size=4),
    max_leaves=12)
_BASES = [yaml.safe_load((EXAMPLES / "a100-rail-4node.yaml").read_text()),
          {"kind": "ClusterTopology", **load_preset("syccl-a800-16").wire()}]


@st.composite
def mutated_specs(draw: st.DrawFn) -> object:
    """A valid compact or wire-form file with one field (at any depth) replaced or removed."""
    data = yaml.safe_load(yaml.safe_dump(draw(st.sampled_from(_BASES))))
    paths: list[tuple[object, str | int]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((node, k))
                walk(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                paths.append((node, i))
                walk(v)

    walk(data)
    parent, key = draw(st.sampled_from(paths))
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[key]
    else:
        parent[key] = draw(_values)  # type: ignore[index]
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_values, mutated_specs()))
def test_any_yaml_gives_a_cluster_or_one_topology_error(data: object) -> None:
    try:
        topo = load_text(yaml.safe_dump(data), "fuzz.yaml")
    except TopologyError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.yaml")
    else:
        assert topo.world_size >= 1
