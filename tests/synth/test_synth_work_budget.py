"""Issue 14: synthesis is cut by counted work, never by the clock (the same request gives the
same result on a loaded machine); a wall-clock deadline only ever stops it with an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.synth.engine import DEFAULT_WORK_BUDGET, SynthesisDeadline, synthesize

SIZES = [1024, 1 << 16, 1 << 20, 1 << 24, 1 << 26]


def _picks(res: object) -> list[tuple[int, str, str, float]]:
    return [(s.size_bytes, s.chosen, s.protocol, s.estimate.time_us)
            for s in res.sizes]  # type: ignore[attr-defined]  # fmt: skip


def test_a_tiny_work_budget_cuts_the_same_way_on_every_run(tmp_path: Path) -> None:
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    runs = [synthesize(topo, Collective.ALLGATHER, SIZES, work_budget=5_000,
                       out_dir=tmp_path / str(k)) for k in range(2)]  # fmt: skip
    a, b = runs
    assert a.budget_exhausted and b.budget_exhausted
    assert any("work budget of 5,000" in n for n in a.notes)
    assert a.work == b.work >= 5_000
    assert _picks(a) == _picks(b)
    assert a.notes == b.notes
    dirs = [tmp_path / str(k) for k in range(2)]
    files = [sorted(p.name for p in d.iterdir()) if d.exists() else [] for d in dirs]
    assert files[0] == files[1]
    for name in files[0]:
        assert (tmp_path / "0" / name).read_text() == (tmp_path / "1" / name).read_text()


def test_the_default_budget_is_not_reached_and_more_work_evaluates_more(tmp_path: Path) -> None:
    topo = make_cluster(4, 2, "nvswitch")
    full = synthesize(topo, Collective.ALLGATHER, SIZES)
    assert not full.budget_exhausted and 0 < full.work < DEFAULT_WORK_BUDGET
    cut = synthesize(topo, Collective.ALLGATHER, SIZES, work_budget=full.work // 4)
    assert cut.budget_exhausted and cut.work < full.work
    # every size the cut run did evaluate is still timed by the same simulator
    assert {s.size_bytes for s in cut.sizes} <= set(SIZES)


def test_a_deadline_stops_synthesis_instead_of_changing_its_result(tmp_path: Path) -> None:
    topo = make_cluster(4, 2, "nvswitch")
    with pytest.raises(SynthesisDeadline, match="time budget"):
        synthesize(topo, Collective.ALLGATHER, SIZES, time_budget_s=1e-12, out_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_bad_work_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="work_budget"):
        synthesize(make_cluster(4, 2, "nvswitch"), Collective.ALLGATHER, SIZES, work_budget=0)



def test_cli_budgets(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ccltune.cli import _register, app

    _register()
    base = ["synthesize", "--cluster", "dgx-h100-1", "--collective", "allgather", "--sizes",
            "1K,1M", "--out", str(tmp_path / "out")]  # fmt: skip
    r = CliRunner().invoke(app, [*base, "--work-budget", "0"])
    assert r.exit_code == 2 and "--work-budget" in r.output
    # any synthesis takes longer than a picosecond: the deadline stops it, nothing is written
    r = CliRunner().invoke(app, [*base, "--time-budget", "1e-12"])
    assert r.exit_code == 2 and "--time-budget" in r.output
    assert not (tmp_path / "out").exists()
    summary = tmp_path / "s.json"
    r = CliRunner().invoke(app, [*base, "--work-budget", "1", "--json", str(summary)])
    assert r.exit_code == 0, r.output
    assert '"budgetExhausted": true' in summary.read_text() and "work budget" in r.output
