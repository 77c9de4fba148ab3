"""Direct ReduceScatter / AllReduce with reduces into scratch (formats/msccl/scratch.py): every
file is run by the executor model (FIFO connections, dependency flags) and its data movement
proven, out of place and in place; its time as a file matches its schedule's; msccl-executor's
own parser loads it (conformance kit); synth/mesh.py offers it on a full mesh only. Also: mesh
files timed with the writer's "early" step order beside the default."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_helpers import check_plan, write_in_place_file

from ccltune.api.common import Collective
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.formats.msccl import scratch, slicing
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.schedule.check import ScheduleError, check_schedule
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth import engine, mesh
from ccltune.synth.grid import file_time
from ccltune.topology.presets import load_preset

REDUCING = (Collective.REDUCESCATTER, Collective.ALLREDUCE)


def _uniform(n: int, k: int) -> dict[tuple[int, int], int]:
    return {(u, v): k for u in range(n) for v in range(n) if u != v}


@pytest.mark.parametrize("coll", REDUCING)
@pytest.mark.parametrize(("n", "k", "cpr", "group", "budget"), [
    (8, 4, 16, 1, 32),  # MI300X: 28 peer threadblocks + 4 reducing
    (8, 4, 32, 2, 32),
    (4, 2, 8, 2, 8),  # a 4-GPU quad
    (4, 2, 4, 1, 6),  # no spare threadblock: reduces on the peers' threadblocks
    (2, 1, 4, 1, 2),  # one peer: the rrc alone reduces
])  # fmt: skip
def test_every_shape_runs_and_computes_its_collective(coll: Collective, n: int, k: int, cpr: int,
                                                      group: int, budget: int) -> None:  # fmt: skip
    arr, low = scratch.direct(coll, n, cpr, _uniform(n, k), budget, group, "t")
    assert low.threadblocks <= budget
    # the schedule the simulator times: every contribution reduced once, reduces commuting
    check_schedule(arr.to_schedule(), reduces_commute=True)
    if n > 2:
        with pytest.raises(ScheduleError, match="race"):
            check_schedule(arr.to_schedule())
    for inplace in (False, True):
        text = render_lowering(low, name="t", proto="Simple", inplace=inplace)
        back = read_msccl(text)  # raises on a deadlock or a wrong result
        assert back.schedule.collective == coll
    # every contribution crosses a link once (AllReduce: and every reduced chunk once more)
    per = n * (n - 1) * cpr
    assert len(back.schedule.transfers) == per * (2 if coll == Collective.ALLREDUCE else 1)
    steps = [st for items in low.items_of for lst in items.values() for _, st, _ in lst if st]
    assert sum(st.type == "re" for st in steps) == n * (cpr // group) * max(n - 2, 0)
    assert all(st.src[0] == "s" for st in steps if st.type == "re")


def test_reduce_chains_fuse_as_the_parser_fuses_them() -> None:
    """Within one reduction only the first `re` waits (depid) and only the last signals: the
    parser fuses a `re` into the previous one only when that one has hasdep=0 and this one
    depid=-1 (msccl_parser.cc); AllReduce's sends wait for the last."""
    _, low = scratch.direct(Collective.ALLREDUCE, 8, 16, _uniform(8, 4), 32, 1, "t")
    for items in low.items_of:
        for lst in items.values():
            chain: list = []
            for _, st, dep in [*lst, ("nop", None, None)]:
                if st is not None and st.type == "re" and chain and dep is None:
                    chain.append((st, dep))
                    continue
                if chain:
                    assert chain[0][0].type == "re"
                    assert not any(s.hasdep for s, _ in chain[:-1])
                    assert all(d is None for _, d in chain[1:])
                    assert chain[-1][0].hasdep  # the AllGather's sends wait for it
                chain = [(st, dep)] if st is not None and st.type == "re" else []


@pytest.mark.parametrize("charged", [False, True])
def test_file_runs_at_its_schedule_time_on_mi300x(charged: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Uncharged, with threadblocks left to reduce, the file adds nothing to its schedule at
    64 MiB (simulated); with the reduces on the peers' threadblocks (all 32 move data) it does.
    Charged (the default), the reduces take the time: 910.6 us against the schedule's 211.5,
    and 1,132.7 with them on the peers' threadblocks."""
    monkeypatch.setattr(slicing, "CHARGE_LOCAL_STEPS", charged)
    topo = load_preset("mi300x-8")
    router = Router(topo)
    size = 64 << 20
    cost = protocol_cost("Simple", link_kind=nccl_graph(topo).intra_kind,
                         gpu=gpu_physics(topo.gpu_model))  # fmt: skip
    coll = Collective.REDUCESCATTER
    arr, low = scratch.direct(coll, 8, 16, _uniform(8, 4), 32, 1, "t")
    sched = simulate(arr, topo, size, cost, router).time_us
    name = f"t{int(charged)}"  # evaluate.py caches a file's timing structure by its text
    f = file_time(coll, size, topo, router, render_lowering(low, name=name, proto="Simple"))
    assert isinstance(f, float)
    if charged:
        assert f > 4 * sched
    else:
        assert f == pytest.approx(sched, rel=0.01)
    # Reduces on the peers' threadblocks (no spare one) hold their sends: slower as a file.
    chans = mesh.channels_per_pair(mesh.GroupTopo.gpu_mesh(topo), dict.fromkeys(_uniform(8, 1), 1),
                                   32)  # fmt: skip
    _, busy = scratch.direct(coll, 8, 16, chans, 32, 1, "t")
    g = file_time(coll, size, topo, router, render_lowering(busy, name=name, proto="Simple"))
    assert isinstance(g, float) and g > 1.05 * f


def test_the_step_limit_is_kept() -> None:
    with pytest.raises(MscclFormatError, match="steps"):
        scratch.direct(Collective.REDUCESCATTER, 8, 32, _uniform(8, 4), 32, 1, "t")
    with pytest.raises(ValueError, match="every pair"):
        scratch.direct(Collective.REDUCESCATTER, 4, 8, {(0, 1): 1, (1, 0): 1}, 8, 1, "t")


def test_scratch_variants_follow_the_local_charge() -> None:
    """Offered exactly when the read-back charges local reduces (mesh.SCRATCH_REDUCES), which
    it does by default: their gains no longer rest on free `re`s."""
    assert mesh.SCRATCH_REDUCES and slicing.CHARGE_LOCAL_STEPS
    found = mesh.variants(load_preset("mi300x-8"), Collective.REDUCESCATTER, 32, 1000)
    assert any("/scratch" in lb for lb in found.schedules)


def test_mesh_offers_scratch_variants_on_full_meshes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mesh, "SCRATCH_REDUCES", True)
    full = mesh.variants(load_preset("mi300x-8"), Collective.REDUCESCATTER, 32, 1000)
    labels = [lb for lb in full.schedules if "/scratch" in lb]
    assert labels and all(full.fits(lb) for lb in labels)
    assert "mesh/scratch-k4c16" in labels
    for lb in labels:
        assert full.lowered[lb].threadblocks <= 32
    ag = mesh.variants(load_preset("mi300x-8"), Collective.ALLGATHER, 32, 1000)
    assert not any("/scratch" in lb for lb in ag.schedules)


def test_scratch_files_pass_the_executors_own_code(tmp_path: Path) -> None:
    """MI300X ReduceScatter and AllReduce files as the engine writes them (in place too):
    msccl-executor-nccl's own parser loads each (conformance kit)."""
    names = []
    for coll in REDUCING:
        arr, low = scratch.direct(coll, 8, 16, _uniform(8, 4), 32, 1, "t")
        names.append(f"{coll.value}-8r-scratch-Simple")
        write_in_place_file(tmp_path, names[-1], coll, arr, low)
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    for name in names:
        assert f"PASS msccl/{name}.xml load" in out


def test_scratch_variants_never_make_a_size_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    """They are evaluated after the other mesh variants, against their files: ranked with them,
    their schedules displaced the direct variants at 1-16 KiB on v100-cubemesh-4 AllReduce,
    whose files were faster there (4 KiB: 9.9 against 11.5 us, simulated)."""
    monkeypatch.setattr(mesh, "SCRATCH_REDUCES", True)
    # without the rings, which now take 4 MiB (111.0 us against the scratch file's 120.1)
    monkeypatch.setattr(mesh, "_ring_variants", lambda *a, **k: [])
    topo = load_preset("v100-cubemesh-4")
    sizes = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 22]

    def times() -> dict[int, tuple[str, float]]:
        res = engine.synthesize(topo, Collective.ALLREDUCE, sizes, workers=1)
        return {sr.size_bytes: (sr.chosen, sr.estimate.time_us) for sr in res.sizes}

    with_scratch = times()
    monkeypatch.setattr(mesh, "_scratch_variants", lambda *a, **k: None)
    without = times()
    assert all(with_scratch[s][1] <= without[s][1] for s in sizes)
    assert any("/scratch" in with_scratch[s][0] for s in sizes)  # and it wins somewhere


def test_mesh_files_are_also_timed_with_sends_early(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Each file finalist is timed lowered with the writer's "early" order too (its own
    label), the faster kept: mi300x-8 AlltoAll's fill at 128 MiB loses 12% to its schedule with
    the default order and ~2% early (simulated). The published files pass the kit."""
    topo = load_preset("mi300x-8")
    sizes = [1 << 27]
    res = engine.synthesize(topo, Collective.ALLTOALL, sizes, workers=1, out_dir=tmp_path / "msccl")
    (sr,) = res.sizes
    assert sr.chosen.endswith("/early"), sr.chosen
    monkeypatch.setattr(mesh.MeshVariants, "early", lambda self, label: None)
    (plain,) = engine.synthesize(topo, Collective.ALLTOALL, sizes, workers=1).sizes
    assert sr.estimate.time_us < 0.95 * plain.estimate.time_us
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert "0 failed" in out and "load" in out
