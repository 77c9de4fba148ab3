"""Rail-ring ReduceScatter / AllReduce (formats/msccl/rail_ring_reduce.py, synth/rail_ring_reduce.py):
every file is run by the executor model (FIFO connections, dependency flags) and its data
movement proven, out of place and in place; it fits the executor's limits; the engine publishes
it where its file is the fastest; msccl-executor-nccl's own parser loads it (conformance kit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan

from ccltune.api.common import Collective
from ccltune.model.formats.msccl import rail_ring_reduce as lowering
from ccltune.model.formats.msccl.limits import MAX_STEPS, first_selected
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.schedule.check import check_schedule
from ccltune.model.sim.routing import Router
from ccltune.synth import engine
from ccltune.synth import rail_ring_reduce as rings
from ccltune.synth.grid import file_time
from ccltune.synth.rail_ring import max_file_steps
from ccltune.topology.presets import load_preset

REDUCING = (Collective.REDUCESCATTER, Collective.ALLREDUCE)


@pytest.mark.parametrize("coll", REDUCING)
@pytest.mark.parametrize(("servers", "gpus", "pieces", "rings_", "paired"), [
    (2, 2, 1, 1, False),
    (3, 3, 2, 2, False),
    (3, 4, 2, 1, False),  # two pieces one after the other on one ring
    (4, 3, 4, 2, True),
    (2, 8, 1, 1, True),
    (2, 8, 2, 2, False),  # fewer units (4) than chain positions (7): the Latin square's ties
])  # fmt: skip
def test_every_shape_runs_and_computes_its_collective(coll: Collective, servers: int, gpus: int,
                                                      pieces: int, rings_: int,
                                                      paired: bool) -> None:  # fmt: skip
    arr, low = lowering.lower(coll, servers, gpus, pieces, rings_, "t", paired)
    check_schedule(arr.to_schedule())  # the simulator's schedule: correct and race-free
    for inplace in (False, True):
        back = read_msccl(render_lowering(low, name="t", proto="Simple", nchannels=rings_,
                                          inplace=inplace))  # fmt: skip
        assert back.schedule.collective == coll
    n = servers * gpus
    # every contribution crosses NVLink once and the NIC S-1 times per chunk (AllReduce: twice)
    per = n * (gpus - 1) * servers * pieces + n * (servers - 1) * pieces
    assert len(back.schedule.transfers) == per * (2 if coll == Collective.ALLREDUCE else 1)
    assert len(arr) == len(back.schedule.transfers)
    assert low.threadblocks == rings_ + (gpus - 1) * (1 if paired else 2)


def test_rail_64_shapes_fit_the_budget_and_the_step_limit() -> None:
    dims = load_preset("h800-rail-64").dimensions
    assert dims is not None
    for coll in REDUCING:
        found = rings.variants(dims, coll, 16, "t")
        assert found, coll
        for v in found:
            v.lowering.require(max_threadblocks=16, max_steps=MAX_STEPS)
    labels = [v.label for v in rings.variants(dims, Collective.REDUCESCATTER, 16, "t")]
    assert labels == ["rail-ring/p4r4/paired/taper", "rail-ring/p4r4/paired"]
    # 64 servers: one piece on one ring, 64 steps (AllReduce would need 128); offered on 512
    # GPUs within rail_ring.max_file_steps (the row's memory, measured)
    big = load_preset("h800-rail-512").dimensions
    assert big is not None
    assert rings.applies(big, Collective.REDUCESCATTER)
    assert rings.file_steps(Collective.REDUCESCATTER, 64, 8, 1) <= \
        max_file_steps(Collective.REDUCESCATTER)  # not built here: ~300 MB  # fmt: skip
    with pytest.raises(MscclFormatError, match="steps"):
        lowering.lower(Collective.REDUCESCATTER, 64, 8, 2, 2, "t")
    with pytest.raises(MscclFormatError, match="steps"):
        lowering.lower(Collective.ALLREDUCE, 64, 8, 1, 1, "t")
    # within 8 threadblocks only the paired shapes could fit; none of SHAPES does on 8 x 8
    assert not rings.variants(dims, Collective.REDUCESCATTER, 8, "t")


def test_engine_publishes_the_ring_where_its_file_is_fastest(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:  # fmt: skip
    """h800-rail-64 ReduceScatter at 64 MiB (simulated): the ring's file (422.8 us when
    measured) beats the search's (~499) and NCCL's (528.0); without it the engine keeps the
    search's file. The published files pass msccl-executor-nccl's own parser."""
    topo = load_preset("h800-rail-64")
    size = [64 << 20]
    res = engine.synthesize(topo, Collective.REDUCESCATTER, size, workers=1,
                            out_dir=tmp_path / "msccl")  # fmt: skip
    (sr,) = res.sizes
    assert sr.chosen.startswith("rail-ring/"), sr.chosen
    monkeypatch.setattr(rings, "variants", lambda *a, **k: [])
    (before,) = engine.synthesize(topo, Collective.REDUCESCATTER, size, workers=1).sizes
    assert not before.chosen.startswith("rail-ring/")
    assert sr.estimate.time_us < 0.9 * before.estimate.time_us
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert "0 failed" in out and "load" in out


def test_allreduce_files_pass_the_executors_own_code(tmp_path: Path) -> None:
    """The rail-64 AllReduce variants as the engine writes them (in place): msccl-executor-nccl's
    own parser loads each (conformance kit)."""
    dims = load_preset("h800-rail-64").dimensions
    assert dims is not None
    found = rings.variants(dims, Collective.ALLREDUCE, 16, "t")
    assert found
    for v in found:  # a plan each: files covering the same sizes would shadow each other
        start = first_selected(Collective.ALLREDUCE, 64, engine._chunks_per_loop(v.arrays), 1)
        assert start is not None
        name = f"allreduce-64r-{v.label.replace('/', '-')}-Simple"
        xml = tmp_path / name / "msccl" / f"{name}.xml"
        xml.parent.mkdir(parents=True)
        xml.write_text(render_lowering(v.lowering, name=name, proto="Simple",
                                       nchannels=v.arrays.channels, min_bytes=start,
                                       inplace=True), encoding="utf-8")  # fmt: skip
        out = check_plan(tmp_path / name, "--dtype-bytes", "2")
        assert f"PASS msccl/{name}.xml load" in out and "0 failed" in out


def test_rail_64_allreduce_offers_two_pieces_and_the_engine_publishes_it_at_16_mib() -> None:
    """h800-rail-64 AllReduce (simulated): p4 pipelines best from 64 MiB, p2 below (its files at
    16 MiB: 270.9 us against p4's 380.6 and p1's 376.3 when measured), so the two offered are p4
    and p2 (p1, offered before, never won on rail-64); the engine publishes p2 at 16 MiB, where
    without it the search's file was chosen (295.0 us)."""
    topo = load_preset("h800-rail-64")
    dims = topo.dimensions
    assert dims is not None
    found = rings.variants(dims, Collective.ALLREDUCE, 16, "t")
    assert [v.label for v in found] == ["rail-ring/p4r2", "rail-ring/p2r2"]
    size = 16 << 20
    router = Router(topo)
    us = {}
    for pieces in (4, 2, 1):
        arr, low = lowering.lower(Collective.ALLREDUCE, 8, 8, pieces, min(pieces, 2), "t")
        text = render_lowering(low, name="t", proto="Simple", nchannels=arr.channels)
        got = file_time(Collective.ALLREDUCE, size, topo, router, text)
        assert not isinstance(got, str), got
        us[pieces] = got
    assert us[2] < 0.8 * min(us[4], us[1]), us
    (sr,) = engine.synthesize(topo, Collective.ALLREDUCE, [size], workers=1).sizes
    assert sr.chosen == "rail-ring/p2r2", sr.chosen
    assert sr.estimate.time_us == pytest.approx(us[2])
