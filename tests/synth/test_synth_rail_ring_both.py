"""Rail AllReduce within 64 steps a threadblock (formats/msccl/rail_ring_both.py, the `block`,
`split` and `both` options of formats/msccl/rail_ring_reduce.py): every file is run by the
executor model and its data movement proven, out of place and in place; a 64-server rail fits
the executor's steps and 16 threadblocks; on 16 x 8 GPUs the ring both ways round beats the
one-way files; msccl-executor-nccl's own parser loads it (conformance kit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan, write_in_place_file

from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import Collective
from ccltune.model.formats.msccl import rail_ring_reduce as lowering
from ccltune.model.formats.msccl.limits import MAX_STEPS
from ccltune.model.formats.msccl.rail_ring_both import BothWays
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.schedule.check import check_schedule
from ccltune.model.sim.routing import Router
from ccltune.synth import rail_ring_reduce as rings
from ccltune.synth.grid import file_time
from ccltune.topology.cluster_file import from_data
from ccltune.topology.presets import load_preset, preset_text
from ccltune.topology.yamlio import parse

AR = Collective.ALLREDUCE


def _rail(servers: int) -> ClusterTopology:
    """h800-rail-512's preset with `servers` servers of 8 GPUs (one rail switch a lane)."""
    text = preset_text("h800-rail-512").replace("servers: 64", f"servers: {servers}") \
        .replace("{name: rail, size: 64}", f"{{name: rail, size: {servers}}}")  # fmt: skip
    assert text.count(f"{servers}") >= 2
    data, lines = parse(text, "test")
    return from_data(data, lines, "test")


def _proven(servers: int, gpus: int, pieces: int, rings_: int, block: int, split: bool,
            both: bool) -> int:  # fmt: skip
    """Read back in and out of place (the reader proves the data), the schedule checked; the
    largest threadblock's steps."""
    arr, low = lowering.lower(AR, servers, gpus, pieces, rings_, "t", block=block, split=split,
                              both=both)  # fmt: skip
    check_schedule(arr.to_schedule())
    for inplace in (False, True):
        back = read_msccl(render_lowering(low, name="t", proto="Simple", nchannels=arr.channels,
                                          inplace=inplace))  # fmt: skip
        assert back.schedule.collective == AR
        assert len(back.schedule.transfers) == len(arr)
    assert low.threadblocks == 2 * rings_ + 2 * (gpus - 1)
    low.require(max_steps=MAX_STEPS)
    return max(len(items) for rank in low.items_of for items in rank.values())


@pytest.mark.parametrize(("servers", "gpus", "pieces", "rings_", "block", "split", "both"), [
    (2, 2, 1, 1, 1, True, False),
    (4, 3, 1, 1, 2, True, False),  # a block of 2 servers a step, cnt 2
    (6, 4, 2, 2, 3, True, False),
    (4, 2, 1, 1, 1, False, True),  # the smallest ring both ways
    (5, 3, 1, 1, 1, False, True),  # odd: 2 hops forward, 1 back, to the exchange
    (7, 2, 2, 1, 1, False, True),  # two pieces one after the other on each way
    (4, 3, 2, 1, 2, False, True),
    (6, 4, 2, 2, 3, False, True),  # blocks whose chunks two ways complete: two runs
    (8, 8, 2, 1, 2, False, True),
])  # fmt: skip
def test_every_shape_runs_and_computes_allreduce(servers: int, gpus: int, pieces: int,
                                                 rings_: int, block: int, split: bool,
                                                 both: bool) -> None:  # fmt: skip
    _proven(servers, gpus, pieces, rings_, block, split, both)


def test_both_ways_hops_cover_the_ring_once() -> None:
    for servers in (4, 5, 8, 64):
        ways = BothWays(servers)
        hf, hb = ways.reduce_hops
        assert hf + hb == servers - 2 == sum(ways.gather_hops)
        for s in range(servers):
            for way in (0, 1):  # each way's S steps carry every chunk once
                assert sorted(ways.chunk(s, way, k) for k in range(servers)) == list(range(servers))
            assert all(ways.need(s, d) <= max(hf, hb) for d in range(servers))
            # a chunk is completed on each server once: at d, d+1 by the exchange, else gathered
            got = [ways.completes(s, d) for d in range(servers)]
            assert all(k > ways.reduce_hops[w] for w, k in got)


def test_a_64_server_rail_fits_64_steps_and_16_threadblocks() -> None:
    """h800-rail-512's rail (64 servers): the one-way ring needs 127 ring steps and 128 on the
    NVSwitch threadblocks; both ways round in blocks of 4 servers it fits (2 GPUs a server here:
    the steps a threadblock do not depend on the GPUs; 8 GPUs give 2 + 14 threadblocks)."""
    with pytest.raises(MscclFormatError, match="steps"):
        lowering.lower(AR, 64, 2, 1, 1, "t")
    with pytest.raises(MscclFormatError, match="steps"):  # 32 reduces + 34 spread runs
        lowering.lower(AR, 64, 2, 1, 1, "t", block=2, both=True)
    assert _proven(64, 2, 1, 1, 4, False, True) <= MAX_STEPS
    assert _proven(64, 2, 1, 1, 2, True, False) == MAX_STEPS
    dims = load_preset("h800-rail-512").dimensions
    assert dims is not None
    # offered where rail_ring.max_file_steps lets a file of this many steps through
    assert rings.file_steps(AR, 64, 8, 1, 4, True) == 64 * 8 * (2 * 7 * (16 + 18) + 128)


def test_rail_512_offers_blocks_of_4_where_the_gate_lets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """h800-rail-512 AllReduce: the smallest block whose threadblocks fit (4: blocks of 2 need
    66 steps) is built once rail_ring.max_file_steps lets its 309,248 steps through; under the
    gate nothing is (a larger block's ramp is longer). Not built here (~20 s, ~400 MB)."""
    dims = load_preset("h800-rail-512").dimensions
    assert dims is not None
    built: list[tuple[int, bool]] = []

    def lower(*args: object, block: int = 1, both: bool = False, **kw: object) -> None:
        built.append((block, both))
        raise MscclFormatError("not built in this test")

    monkeypatch.setattr(lowering, "lower", lower)
    monkeypatch.setattr(rings, "max_file_steps", lambda coll: 320_000)
    assert not rings.variants(dims, AR, 16, "t")
    assert built[0] == (4, True)
    built.clear()
    monkeypatch.setattr(rings, "max_file_steps", lambda coll: 250_000)
    rings.variants(dims, AR, 16, "t")
    assert built == []


def test_16_servers_offer_the_ring_both_ways_and_it_wins() -> None:
    """16 x 8 GPUs (simulated, files read back, Simple): the ring both ways round against the
    one-way files that fit. Measured: 16 MiB p1r1 both 294.7 us, p2r2 404.9, one-way p1r1
    494.9; 64 MiB p2r1 both 780.8, p2r2 805.3."""
    topo = _rail(16)
    dims = topo.dimensions
    assert dims is not None and dims[1].size == 16
    assert [v.label for v in rings.variants(dims, AR, 16, "t")] == \
        ["rail-ring/p2r2", "rail-ring/p2r1/both"]  # fmt: skip
    router = Router(topo)

    def us(size: int, pieces: int, rings_: int, both: bool) -> float:
        arr, low = lowering.lower(AR, 16, 8, pieces, rings_, "t", both=both)
        text = render_lowering(low, name="t", proto="Simple", nchannels=arr.channels)
        got = file_time(AR, size, topo, router, text)
        assert not isinstance(got, str), got
        return got

    assert us(16 << 20, 1, 1, True) < 0.8 * min(us(16 << 20, 2, 2, False), us(16 << 20, 1, 1, False))
    assert us(64 << 20, 2, 1, True) < us(64 << 20, 2, 2, False)


def test_both_ways_file_passes_the_executors_own_code(tmp_path: Path) -> None:
    """A 16 x 8 file both ways round, in place, as the engine writes it: msccl-executor-nccl's own
    parser loads it and selects it (conformance kit)."""
    arr, low = lowering.lower(AR, 16, 8, 2, 1, "t", both=True)
    name = "allreduce-128r-rail-ring-p2r1-both-Simple"
    write_in_place_file(tmp_path, name, AR, arr, low)
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert f"PASS msccl/{name}.xml load" in out and "0 failed" in out
