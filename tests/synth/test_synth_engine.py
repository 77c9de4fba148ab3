"""synthesize(): fallback on asymmetric fabrics, budget exhaustion, choice per size range."""

from __future__ import annotations

from pathlib import Path

from synth_helpers import make_cluster
from typer.testing import CliRunner

from ccltune.api.common import Collective, Source
from ccltune.cli import _register, app
from ccltune.synth.engine import synthesize
from ccltune.topology.load import load_text

PRESETS = Path(__file__).resolve().parents[2] / "operator/ccltune/topology/presets"


def test_asymmetric_topology_falls_back_to_nccl(tmp_path: Path) -> None:
    # Two cube-mesh servers: no symmetric dimension, and more than the one server
    # synth/mesh.py synthesizes on (tests/synth/test_synth_mesh.py covers one server).
    spec = PRESETS.joinpath("v100-cubemesh-4.yaml").read_text().replace("servers: 1", "servers: 2")
    topo = load_text(spec, "two-cubemesh.yaml")
    assert topo.dimensions is None and topo.world_size == 8
    res = synthesize(topo, Collective.ALLREDUCE, [1024, 1 << 20], out_dir=tmp_path)
    assert not res.symmetric
    assert all(r.kind == "nccl" for r in res.ranges)
    assert "asymmetric" in res.ranges[0].reason and "cube-mesh" in res.ranges[0].reason
    assert not list(tmp_path.iterdir())


def test_budget_exhaustion_returns_best_so_far(tmp_path: Path) -> None:
    topo = make_cluster(4, 2, "nvswitch")
    res = synthesize(topo, Collective.ALLGATHER, [1024, 1 << 20, 1 << 26], work_budget=1,
                     out_dir=tmp_path)  # fmt: skip
    assert res.budget_exhausted
    assert any("budget" in n for n in res.notes)
    # The ends of the sweep are always evaluated; the size between them is reported as skipped.
    assert [s.size_bytes for s in res.sizes] == [1024, 1 << 26]
    assert any("1M" in n for n in res.notes)
    assert all(s.estimate.time_us <= s.default.time_us for s in res.sizes)
    assert res.ranges[0].min_bytes == 0 and res.ranges[-1].max_bytes == 0


def test_ranges_tile_the_sizes_and_numbers_say_simulated(tmp_path: Path) -> None:
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    sizes = [1 << 10, 1 << 16, 1 << 22, 1 << 28]
    # NCCL runs on 2 channels here; a schedule needs one threadblock per peer (3 + 1 rail).
    res = synthesize(topo, Collective.ALLGATHER, sizes, out_dir=tmp_path, max_threadblocks=4)
    assert res.ranges[0].min_bytes == 0 and res.ranges[-1].max_bytes == 0
    for a, b in zip(res.ranges, res.ranges[1:], strict=False):
        assert a.max_bytes + 1 == b.min_bytes
    for s in res.sizes:
        assert s.estimate.source == Source.SIMULATED
        assert s.bound_us <= s.estimate.time_us * (1 + 1e-9)
    # On a 2:1 NVLink/NIC fabric the hierarchical schedule beats NCCL's ring at large sizes.
    assert res.sizes[-1].chosen.startswith("spread")
    xml = [r.xml_file for r in res.ranges if r.kind == "msccl"]
    assert xml and all(Path(x).read_text().startswith("<algo") for x in xml if x)


def test_cli_synthesize(tmp_path: Path) -> None:
    _register()
    runner = CliRunner()
    r = runner.invoke(app, ["synthesize", "--cluster", "dgx-h100-2", "--collective", "allgather",
                            "--sizes", "1K,1M", "--out", str(tmp_path)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "simulated" in r.output and list(tmp_path.glob("*.xml"))
    bad = runner.invoke(app, ["synthesize", "--cluster", "dgx-h100-2", "--collective", "gather"])
    assert bad.exit_code == 2 and "--collective" in bad.output
    both = runner.invoke(app, ["synthesize", "--collective", "allgather"])
    assert both.exit_code == 2 and "exactly one" in both.output
    sizes = runner.invoke(app, ["synthesize", "--cluster", "dgx-h100-2", "--collective",
                                "allgather", "--sizes", "1G:1K"])  # fmt: skip
    assert sizes.exit_code == 2 and "larger" in sizes.output
