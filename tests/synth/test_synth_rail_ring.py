"""Rail-ring AllGather (formats/msccl/rail_ring.py, synth/rail_ring.py): every file is run by the
executor model (FIFO connections, dependency flags) and its data movement proven, out of place
and in place, within the SM budget and 64 steps; each NIC carries the least data an AllGather
can; its schedule times it as its file runs; the engine keeps it where its file is faster;
msccl-executor-nccl's own parser loads it (conformance kit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth_helpers import check_plan

from ccltune.api.common import Collective
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.formats.msccl.limits import MAX_STEPS, first_selected
from ccltune.model.formats.msccl.rail_ring import rail_ring_allgather, ring_hops
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth import engine
from ccltune.synth import rail_ring as rings
from ccltune.synth.grid import file_time
from ccltune.topology.presets import load_preset


@pytest.mark.parametrize(("servers", "local"), [(2, 8), (3, 4), (4, 8), (5, 2), (8, 8)])
def test_every_shape_runs_and_gathers_in_and_out_of_place(servers: int, local: int) -> None:
    arr, low = rail_ring_allgather(servers, local, "t", 16)
    assert low.threadblocks == 2 * local - (1 if servers == 2 else 0) <= 16
    assert low.max_steps == max(servers, servers // 2 + 2) <= MAX_STEPS  # spread; ring + cpy
    text = render_lowering(low, name="t", proto="Simple", nchannels=1, inplace=True)
    back = read_msccl(text)  # proves out of place and in place; raises on a deadlock
    n = servers * local
    src = np.array([t.src for t in back.schedule.transfers])
    dst = np.array([t.dst for t in back.schedule.transfers])
    # each NIC carries S-1 chunks (the least), each GPU sends its server S chunks per peer
    over_nic = src // local != dst // local
    assert np.bincount(src[over_nic], minlength=n).tolist() == [servers - 1] * n
    assert len(src) == n * (servers - 1) + n * (local - 1) * servers
    assert len(arr) == len(src)
    assert rings.file_steps(servers, local) == sum(len(x) for i in low.items_of for x in i.values())
    # a chunk crosses at most half the servers on its ring
    assert max(ring_hops(servers)) == servers // 2


def test_its_schedule_times_it_as_its_file_runs() -> None:
    """The engine ranks files by their schedules: on h800-rail-64 at 64 MiB they agree."""
    topo = load_preset("h800-rail-64")
    router = Router(topo)
    arr, low = rail_ring_allgather(8, 8, "t", 16)
    text = render_lowering(low, name="t", proto="Simple", nchannels=1)
    f = file_time(Collective.ALLGATHER, 64 << 20, topo, router, text)
    assert isinstance(f, float)
    cost = protocol_cost("Simple", link_kind=nccl_graph(topo).intra_kind,
                         gpu=gpu_physics(topo.gpu_model))  # fmt: skip
    sched = simulate(arr, topo, 64 << 20, cost, router, engine="symmetric").time_us
    assert f == pytest.approx(sched, rel=0.01)


def test_applies_to_two_switch_dimensions_only() -> None:
    assert rings.shape(load_preset("h800-rail-512").dimensions or []) == (64, 8)
    assert rings.shape(load_preset("dgx-h100-1").dimensions or []) is None
    assert rings.shape(load_preset("mi300x-8").dimensions or []) is None
    dims = load_preset("h800-rail-64").dimensions or []
    assert rings.files(dims, 15, str) == []  # 16 threadblocks needed
    assert [lb for lb, _, _ in rings.files(dims, 16, str)] == [rings.LABEL]
    # h800-rail-512's file (0.5M steps, ~300 MB to build) is offered within its gate:
    # test_synth_rail_ring_memory.py checks the gate without building it


def test_engine_keeps_the_ring_file_where_it_is_faster() -> None:
    """h800-rail-64: at 256 MiB the ring file beats every file of the search (whose deeper
    pipelines break the step limit there) and NCCL's; at 1 KiB it does not (S/2 hops of
    latency in sequence) and is not chosen. (On 4 servers x 8 GPUs the search's files win.)"""
    topo = load_preset("h800-rail-64")
    res = engine.synthesize(topo, Collective.ALLGATHER, [1 << 10, 256 << 20], workers=1)
    chosen = {sr.size_bytes: sr.chosen for sr in res.sizes}
    assert chosen[256 << 20] == rings.LABEL
    assert chosen[1 << 10] != rings.LABEL


def test_ring_files_pass_the_executors_own_code(tmp_path: Path) -> None:
    """h800-rail-64's file as the engine writes it (in place too): msccl-executor-nccl's own
    parser loads and selects it (conformance kit)."""
    arr, low = rail_ring_allgather(8, 8, "t", 16)
    start = first_selected(Collective.ALLGATHER, 64, engine._chunks_per_loop(arr), 1 << 20)
    assert start is not None
    name = "allgather-64r-rail-rings-Simple"
    xml = tmp_path / "msccl" / f"{name}.xml"
    xml.parent.mkdir()
    xml.write_text(render_lowering(low, name=name, proto="Simple", nchannels=1, min_bytes=start,
                                   inplace=True), encoding="utf-8")  # fmt: skip
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert f"PASS msccl/{name}.xml load" in out
