"""The combination LP balances the ports at the rates the simulator runs them (issue 18): NVLink
at the SM-copy efficiency (0.8 of line rate), NICs at line rate."""

from __future__ import annotations

import pytest
from synth_helpers import allgather_combination_inputs

from ccltune.model.cost.gpu import NVLINK_SM_EFFICIENCY
from ccltune.synth.combine import candidates, port_payload_gbps
from ccltune.topology.presets import load_preset

GiB = 1 << 30


@pytest.mark.parametrize(("preset", "want"), [
    ("h800-rail-64", [200.0 * NVLINK_SM_EFFICIENCY, 50.0]),  # NVSwitch, then the rails
    ("syccl-a800-16", [200.0 * NVLINK_SM_EFFICIENCY, 12.5]),
    ("mi300x-8", None),  # xGMI: no NVLink, line rate
])  # fmt: skip
def test_port_rates(preset: str, want: list[float] | None) -> None:
    topo = load_preset(preset)
    dims = topo.dimensions
    assert dims is not None
    got = port_payload_gbps(topo, dims)
    assert got == pytest.approx(want or [d.bandwidth_gbps for d in dims])
    unknown = topo.model_copy(update={"gpu_model": "unknown-gpu"})  # no SM-copy model
    assert port_payload_gbps(unknown, dims) == [d.bandwidth_gbps for d in dims]


def test_rail_mix_balances_nvlink_at_copy_rate() -> None:
    """h800-rail-64 AllGather, per root's 64 chunks of 1/64 of the buffer: rail-first puts 56 on
    every GPU's NVLink port and 7 on its NIC; NVSwitch-first 7 and 56. At 160 GB/s of NVLink
    payload rail-first alone takes 56/64 GiB / 160 GB/s; the LP's 7:1 mix (rail-first :
    NVSwitch-first) loads NVLink with 7 + 49 x 7/8 chunks (NIC 56 - 49 x 7/8 = 13.1, i.e.
    0.26 of 50 GB/s against 0.31 of 160: NVLink still binds)."""
    topo = load_preset("h800-rail-64")
    fab, coll, sketches, pats, dims = allgather_combination_inputs(topo)
    ports = port_payload_gbps(topo, dims)
    got = {c.label: c for c in candidates(fab, coll, sketches, pats, [GiB], top_k=2,
                                          port_gbps=ports)}  # fmt: skip
    rail_first = got["spread:rail > spread:nvswitch"]
    assert rail_first.bw_us_per_byte * GiB == pytest.approx(56 / 64 * GiB / 160e3)
    mix = next(c for label, c in got.items() if label.startswith("mix"))
    blocks = sorted((c.sketch.label(dims), c.blocks) for c in mix.columns)
    assert blocks == [("spread:nvswitch > spread:rail", 1), ("spread:rail > spread:nvswitch", 7)]
    assert mix.bw_us_per_byte * GiB == pytest.approx((7 + 49 * 7 / 8) / 64 * GiB / 160e3)
    # At line rate the same LP believes NVLink carries 200 GB/s: every estimate 0.8x as long.
    line = {c.label: c for c in candidates(fab, coll, sketches, pats, [GiB], top_k=2)}
    assert line[rail_first.label].bw_us_per_byte == pytest.approx(
        NVLINK_SM_EFFICIENCY * rail_first.bw_us_per_byte
    )
