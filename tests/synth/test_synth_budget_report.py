"""`ccltune synthesize` reports the bound at the SM budget beside the link bound (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synth_helpers import allgather_combination_inputs
from typer.testing import CliRunner

from ccltune.cli import _register, app
from ccltune.model.cost.sm_bound import sm_bound
from ccltune.topology.presets import load_preset


def test_json_and_table_carry_the_budget_bound(tmp_path: Path) -> None:
    _register()
    summary = tmp_path / "s.json"
    r = CliRunner().invoke(app, ["synthesize", "--cluster", "syccl-a800-16", "--collective",
                                 "allgather", "--sizes", "64K,64M", "--out", str(tmp_path / "x"),
                                 "--json", str(summary)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "% budget" in r.output or "% bud" in r.output
    data = json.loads(summary.read_text())
    topo = load_preset("syccl-a800-16")
    big = data["sizes"][-1]
    assert big["bytes"] == 64 << 20 and data["maxThreadblocks"] == 8
    # At NCCL's 8 channels the threadblocks bind: the budget bound is the threadblock bound.
    sm = sm_bound("allgather", 64 << 20, topo, 8).time_us
    assert big["budgetBoundUs"] == pytest.approx(sm) and sm > 1.5 * big["boundUs"]
    for s in data["sizes"]:
        assert s["budgetBoundUs"] >= s["boundUs"]
        assert s["pctOfBudgetBound"] == pytest.approx(100 * s["budgetBoundUs"] / s["timeUs"])
        assert s["pctOfBudgetBound"] <= 100.0


def test_combination_balances_threadblocks_at_the_budget() -> None:
    """syccl-a800-16, 8 threadblocks (one per peer offset): leaf-first alone loads each NVSwitch
    peer's threadblock with 2 chunks per root and the leaf peer's with 1; 7:1 with
    NVSwitch-first puts 1.875 on every one. Links alone never ask for that mix."""
    from ccltune.synth.combine import candidates

    fab, coll, sketches, pats, dims = allgather_combination_inputs(load_preset("syccl-a800-16"))
    links_only = candidates(fab, coll, sketches, pats, [64 << 20], top_k=2)
    assert not any(c.label.startswith("mix") for c in links_only)
    at_budget = candidates(fab, coll, sketches, pats, [64 << 20], top_k=2, threadblocks=8,
                           tb_gbps=12.5)  # fmt: skip
    mix = next(c for c in at_budget if c.label.startswith("mix"))
    got = sorted((c.sketch.label(dims), c.blocks) for c in mix.columns)
    assert got == [("spread:leaf > spread:nvswitch", 7), ("spread:nvswitch > spread:leaf", 1)]
    # Its estimate is the threadblock time: 1.875 chunks of 64 MiB / 16 at 12.5 GB/s.
    assert mix.bw_us_per_byte * (64 << 20) == pytest.approx(1.875 * (4 << 20) / 12.5e3)
