"""Rail ReduceScatter both ways round (formats/msccl/rail_ring_both.BothWaysScatter, `lower(...,
both=True)` on a ReduceScatter): every file is run by the executor model and its data movement
proven, out of place and in place; each way holds ~S/2 steps a piece, so a 64-server rail fits
64 steps and 16 threadblocks; on 16 x 8 GPUs it beats the one-way ring's file; the engine offers
it instead of the one-way p1r1; msccl-executor-nccl's own parser loads it (conformance kit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan, write_in_place_file
from test_synth_rail_ring_both import _rail

from ccltune.api.common import Collective
from ccltune.model.formats.msccl import rail_ring_reduce as lowering
from ccltune.model.formats.msccl.limits import MAX_STEPS
from ccltune.model.formats.msccl.rail_ring_both import BACKWARD, FORWARD, BothWaysScatter
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.schedule.check import check_schedule
from ccltune.model.sim.routing import Router
from ccltune.synth import rail_ring_reduce as rings
from ccltune.synth.grid import file_time
from ccltune.topology.presets import load_preset

RS = Collective.REDUCESCATTER


def _steps(low: object) -> list[int]:
    return [len(items) for rank in low.items_of for items in rank.values()]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("servers", "gpus", "pieces", "rings_", "paired"), [
    (3, 2, 1, 1, False),  # the smallest: one hop back, one forward
    (4, 2, 1, 1, False),  # even: 2 hops forward, 1 back
    (5, 3, 2, 1, False),  # two pieces one after the other on each way
    (6, 2, 2, 2, False),
    (7, 3, 2, 2, True),  # paired NVSwitch threadblocks
])  # fmt: skip
def test_every_shape_runs_and_computes_reducescatter(servers: int, gpus: int, pieces: int,
                                                     rings_: int, paired: bool) -> None:  # fmt: skip
    arr, low = lowering.lower(RS, servers, gpus, pieces, rings_, "t", paired, both=True)
    check_schedule(arr.to_schedule())
    for inplace in (False, True):
        back = read_msccl(render_lowering(low, name="t", proto="Simple", nchannels=arr.channels,
                                          inplace=inplace))  # fmt: skip
        assert back.schedule.collective == RS
        assert len(back.schedule.transfers) == len(arr)
    assert low.threadblocks == 2 * rings_ + (gpus - 1) * (1 if paired else 2)
    # NVSwitch: G-1 reduces of each of S chunks a piece; the NIC S - 1 hops, as one way round
    assert int(arr.reduce.sum()) == servers * gpus * pieces * (servers * (gpus - 1) + servers - 1)
    assert sorted(set(arr.channel.tolist())) == list(range(2 * rings_))


def test_both_ways_cover_every_other_server_once() -> None:
    for servers in (3, 4, 5, 16, 64):
        ways = BothWaysScatter(servers)
        hf, hb = ways.reduce_hops
        assert hf + hb == servers - 1 and hf - hb in (0, 1) and hb >= 1
        for s in range(servers):
            fwd = [ways.chunk(s, FORWARD, k) for k in range(hf + 1)]
            bwd = [ways.chunk(s, BACKWARD, k) for k in range(hb + 1)]
            assert fwd[-1] == bwd[-1] == s  # both ways end in the own chunk
            assert sorted(fwd[:-1] + bwd) == list(range(servers))
            assert ways.need(s, s) == hb
    with pytest.raises(ValueError, match="3 servers"):
        BothWaysScatter(2)


def test_a_64_server_rail_fits_64_steps_and_16_threadblocks() -> None:
    """h800-rail-512's rail: 33 steps on the forward way, 32 back (2 GPUs a server here: the
    steps of a ring threadblock do not depend on the GPUs; two pieces overflow the NVSwitch
    ones). Half the one-way ring's 63 chained hops."""
    arr, low = lowering.lower(RS, 64, 2, 1, 1, "t", both=True)
    check_schedule(arr.to_schedule())
    low.require(max_steps=MAX_STEPS)
    assert sorted(set(_steps(low))) == [32, 33, 64]
    with pytest.raises(MscclFormatError, match="steps"):
        lowering.lower(RS, 64, 2, 2, 1, "t", both=True)
    assert rings.file_steps(RS, 64, 8, 1, both=True) == 64 * 8 * (2 * 7 * 64 + 65)


def test_rail_512_offers_both_ways_instead_of_the_one_way_ring(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """h800-rail-512 ReduceScatter: p1r1 both ways (492,032 steps, under the 500,000 gate) is
    built, and then the one-way p1r1 is not (it lost at every size measured); where both ways
    cannot be built, the one-way ring is. Not built here (~20 s, ~400 MB)."""
    dims = load_preset("h800-rail-512").dimensions
    assert dims is not None
    built: list[tuple[int, int, bool]] = []

    def lower(coll: Collective, servers: int, gpus: int, pieces: int, rings_: int,
              *args: object, both: bool = False, **kw: object) -> tuple[None, None]:  # fmt: skip
        built.append((pieces, rings_, both))
        if both and can_build:
            return None, None
        raise MscclFormatError("not built in this test")

    monkeypatch.setattr(lowering, "lower", lower)
    can_build = True
    assert [v.label for v in rings.variants(dims, RS, 16, "t")] == ["rail-ring/p1r1/both"]
    assert built == [(1, 1, True)]
    built.clear()
    can_build = False
    assert not rings.variants(dims, RS, 16, "t")
    assert built == [(1, 1, True), (1, 1, False)]


def test_16_servers_both_ways_beat_the_one_way_ring() -> None:
    """16 x 8 GPUs (simulated, files read back, Simple). Measured: 16 MiB p1r1 both 178.2 us,
    one-way 268.8; 64 MiB 520.0 against 612.1. The offered p4r2 and p2r2 keep their places."""
    topo = _rail(16)
    dims = topo.dimensions
    assert dims is not None
    assert [v.label for v in rings.variants(dims, RS, 16, "t")] == \
        ["rail-ring/p4r2", "rail-ring/p2r2"]  # fmt: skip
    router = Router(topo)

    def us(size: int, both: bool) -> float:
        arr, low = lowering.lower(RS, 16, 8, 1, 1, "t", both=both)
        text = render_lowering(low, name="t", proto="Simple", nchannels=arr.channels)
        got = file_time(RS, size, topo, router, text)
        assert not isinstance(got, str), got
        return got

    assert us(16 << 20, True) < 0.8 * us(16 << 20, False)
    assert us(64 << 20, True) < 0.9 * us(64 << 20, False)


def test_32_servers_offer_both_ways_beside_p2r2() -> None:
    """32 x 8 GPUs: p4r2 overflows 64 steps, so p2r2 and then p1r1 both ways (16 / 64 MiB:
    230.9 / 468.6 us against p2r2's 363.2 / 507.6 and the one-way p1r1's 407.9 / 686.5)."""
    dims = _rail(32).dimensions
    assert dims is not None
    assert [v.label for v in rings.variants(dims, RS, 16, "t")] == \
        ["rail-ring/p2r2", "rail-ring/p1r1/both"]  # fmt: skip


def test_both_ways_file_passes_the_executors_own_code(tmp_path: Path) -> None:
    """A 16 x 8 ReduceScatter file both ways round, in place, as the engine writes it:
    msccl-executor-nccl's own parser loads it and selects it (conformance kit)."""
    arr, low = lowering.lower(RS, 16, 8, 1, 1, "t", both=True)
    name = "reducescatter-128r-rail-ring-p1r1-both-Simple"
    write_in_place_file(tmp_path, name, RS, arr, low)
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert f"PASS msccl/{name}.xml load" in out and "0 failed" in out
