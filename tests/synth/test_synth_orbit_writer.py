"""A synthesized schedule (N translates of root 0's transfers) lowers to a file whose rank r part
is rank 0's translated: the same threadblocks, steps, dependencies and counts in the same order,
peers and chunk slots moved by the translation (writer.py, frames.py; issue 18). The file read
back then takes the symmetric simulator, and times as the full simulation does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.formats.msccl import scratch, writer
from ccltune.model.formats.msccl import slicing as slicing_module
from ccltune.model.formats.msccl.frames import Frames, find_frames, translates_exactly
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.slicing import slicing, structure, unit_size, with_slices
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import Loc, MscclLowering, _Layout, lower_msccl
from ccltune.model.nccl.baselines import ring_allgather
from ccltune.model.schedule.ir import Schedule, Transfer
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.model.sim.symmetric_sim import prepare_symmetric
from ccltune.synth.engine import synthesize
from ccltune.topology.presets import load_preset


def _moved(lay: _Layout, frames: Frames, r: int, loc: Loc) -> Loc:
    """Rank 0's slot `loc` as rank r holds the translated chunk."""
    buf, off = loc
    if off < 0 or buf == "s":
        return loc
    if buf == "o":
        k = frames.chunk_in(r, lay.output_chunk(0, off))
        got = lay.output_off(r, k)
    else:
        chunk = lay.input_chunk(0, off)
        assert chunk is not None
        got = lay.input_off(r, frames.chunk_in(r, chunk))
    assert got is not None
    return (buf, got)


def _translated(low: MscclLowering, frames: Frames) -> None:
    """Every rank's part equals rank 0's with peers and slots translated."""
    lay = low.layout
    for r in range(low.schedule.nranks):
        peer = [int(p) for p in frames.to_rank[r]]
        want = [(peer[p] if p >= 0 else -1, peer[q] if q >= 0 else -1, c)
                for p, q, c in low.tb_meta[0]]  # fmt: skip
        assert low.tb_meta[r] == want, f"rank {r} threadblocks"
        assert len(low.scratch[r]) == len(low.scratch[0])
        assert sorted(low.items_of[r]) == sorted(low.items_of[0])
        for tb, items in low.items_of[0].items():
            mine = low.items_of[r][tb]
            assert len(mine) == len(items), f"rank {r} tb {tb}"
            for (kind0, st0, dep0), (kind, st, dep) in zip(items, mine, strict=True):
                assert kind == kind0
                assert (dep0 is None) == (dep is None)
                if dep0 is not None and dep is not None:
                    assert (dep.tb, dep.index) == (dep0.tb, dep0.index)
                if st0 is None or st is None:
                    assert st0 is st is None
                    continue
                assert (st.type, st.cnt, st.hasdep, st.index) == (st0.type, st0.cnt,
                                                                  st0.hasdep, st0.index)  # fmt: skip
                assert st.src == _moved(lay, frames, r, st0.src), f"rank {r} tb {tb} src"
                assert st.dst == _moved(lay, frames, r, st0.dst), f"rank {r} tb {tb} dst"


def _schedules(coll: Collective, budget: int, count: int = 4) -> list:
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    res = synthesize(topo, coll, [1 << 16, 1 << 26], max_threadblocks=budget, evaluate=False)
    assert res.schedules
    return [topo, *list(res.schedules.values())[:count]]


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                  Collective.ALLREDUCE])  # fmt: skip
@pytest.mark.parametrize("budget", [16, 6])
def test_rank_r_is_rank_0_translated(coll: Collective, budget: int) -> None:
    """Lowered rank by rank, rank r's part is rank 0's translated. Also at a budget that forces merged threadblocks (the merge's ties are broken in each
    rank's frame)."""
    _, *arrays = _schedules(coll, budget)
    lowered = 0
    for arr in arrays:
        sched = arr.to_schedule()
        frames = find_frames(sched)
        assert frames is not None
        try:  # every rank lowered on its own (the path that does not assume the symmetry)
            low = writer._lower(sched, budget, {}, 1 + max(t.channel for t in sched.transfers))
        except ValueError:
            continue  # does not fit the budget: nothing to compare
        _translated(low, frames)
        lowered += 1
    assert lowered


def _full(arrays, topo, cost):  # type: ignore[no-untyped-def]
    return simulate(arrays, topo, unit_size(arrays), cost, Router(topo), engine="heap")


@pytest.mark.parametrize(("coll", "charged"), [
    (Collective.ALLGATHER, False), (Collective.ALLGATHER, True), (Collective.REDUCESCATTER, True),
    (Collective.ALLREDUCE, True)])  # fmt: skip
def test_the_file_read_back_takes_the_symmetric_engine_and_agrees(
        coll: Collective, charged: bool, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """What published_estimate times: the read-back file, sliced; symmetric equals heap, with and
    without threadblock physics. Charged, an AllGather file's own-chunk copies (writer
    _spread_copies) are local operations sharing their threadblock's receive side."""
    monkeypatch.setattr(slicing_module, "CHARGE_LOCAL_STEPS", charged)
    topo, *arrays = _schedules(coll, 16, count=3)
    router = Router(topo)
    copies = 0
    for arr in arrays:
        low = lower_msccl(arr.to_schedule(), max_threadblocks=16)
        for proto, size in (("Simple", 1 << 26), ("LL", 1 << 16)):
            rb = read_msccl(render_lowering(low, name="orbit", proto=proto,
                                            nchannels=arr.channels))  # fmt: skip
            sl = slicing(proto, size, rb.chunks_per_loop, coll)
            sliced = with_slices(structure(rb, sl, 2), rb, sl)
            local = bool((sliced.src == sliced.dst).any())
            copies += local
            for gpu in (topo.gpu_model, "H100-SXM5-80GB"):
                cost = replace(protocol_cost(proto, gpu=gpu_physics(gpu)), floor_us=0.0)
                q = prepare_symmetric(sliced, topo, router, cost)
                if local and cost.tb_gbps is None:  # free local work: the heap engine's alone
                    assert q == "local work without threadblock physics"
                    continue
                assert not isinstance(q, str), q
                sym = simulate(sliced, topo, unit_size(sliced), cost, router, engine="symmetric")
                assert sym.engine == "symmetric"
                full = _full(sliced, topo, cost)
                assert sym.time_us == pytest.approx(full.time_us, rel=1e-9)
    assert copies == (coll == Collective.ALLGATHER and charged) * 2 * len(arrays)


@pytest.mark.parametrize("coll", [Collective.REDUCESCATTER, Collective.ALLREDUCE])
def test_a_scratch_file_with_fused_reduces_takes_the_symmetric_engine(coll: Collective) -> None:
    """Charged `re` runs (formats/msccl/scratch.py) on reducing threadblocks that neither send
    nor receive, sliced over several iterations: symmetric equals heap."""
    topo = load_preset("mi300x-8")
    n = 8
    _, low = scratch.direct(coll, n, 16, {(u, v): 4 for u in range(n) for v in range(n) if u != v},
                            32, 1, "t")  # fmt: skip
    rb = read_msccl(render_lowering(low, name="t", proto="Simple"))
    assert rb.local_tb is not None
    sl = slicing(rb.schedule.protocol, 1 << 27, rb.chunks_per_loop, coll)
    sliced = with_slices(structure(rb, sl, 3), rb, sl)
    cost = replace(protocol_cost("Simple", gpu=gpu_physics(topo.gpu_model)), floor_us=0.0)
    router = Router(topo)
    assert not isinstance(prepare_symmetric(sliced, topo, router, cost), str)
    sym = simulate(sliced, topo, unit_size(sliced), cost, router, engine="symmetric")
    assert sym.engine == "symmetric"
    assert sym.time_us == pytest.approx(_full(sliced, topo, cost).time_us, rel=1e-9)


def test_a_threadblock_split_on_one_rank_is_not_taken_for_a_translate(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """One send of rank 3 moved to a threadblock id of its own: the labels made from rank 0's
    would still agree across ranks, but name fewer sides than the file has, so the symmetric
    engine refuses and the full simulation times it."""
    monkeypatch.setattr(slicing_module, "CHARGE_LOCAL_STEPS", True)
    topo, arr = _schedules(Collective.ALLGATHER, 16, count=1)
    rb = read_msccl(render_lowering(lower_msccl(arr.to_schedule(), max_threadblocks=16),
                                    name="orbit", proto="Simple", nchannels=arr.channels))  # fmt: skip
    sl = slicing("Simple", 1 << 26, rb.chunks_per_loop, Collective.ALLGATHER)
    sliced = with_slices(structure(rb, sl, 2), rb, sl)
    assert sliced.tb is not None
    split = np.flatnonzero((sliced.src == 3) & (sliced.dst != 3))[-1]
    sliced.tb = sliced.tb.copy()
    sliced.tb[split] = int(sliced.tb.max()) + 1
    cost = replace(protocol_cost("Simple", gpu=gpu_physics("H100-SXM5-80GB")), floor_us=0.0)
    router = Router(topo)
    assert isinstance(prepare_symmetric(sliced, topo, router, cost), str)
    sym = simulate(sliced, topo, unit_size(sliced), cost, router, engine="symmetric")
    assert sym.engine != "symmetric"
    assert sym.time_us == _full(sliced, topo, cost).time_us


def test_schedules_that_are_not_translates_keep_absolute_order() -> None:
    """NCCL's ring, a broadcast and a schedule whose blocks are not one block's images get no
    frames: the writer sorts by absolute rank as before."""
    topo = make_cluster(4, 2, "nvswitch")
    assert find_frames(ring_allgather(topo, chunks=2, channels=2).to_schedule()) is None
    bcast = Schedule("b", Collective.BROADCAST, 2, 1, [Transfer(0, 1, 0)])
    assert find_frames(bcast) is None
    # two blocks, but block 1 is not block 0 under one rank permutation
    odd = Schedule("odd", Collective.ALLGATHER, 3, 1, [
        Transfer(0, 1, 0), Transfer(0, 2, 0), Transfer(1, 2, 1), Transfer(1, 0, 1),
        Transfer(2, 1, 2), Transfer(2, 0, 2)])  # fmt: skip
    assert find_frames(odd) is None


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                  Collective.ALLREDUCE])  # fmt: skip
@pytest.mark.parametrize("budget", [16, 6, 4])
def test_lowering_rank_0_alone_writes_the_same_file(coll: Collective, budget: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Rank 0 lowered and translated == every rank lowered, byte for byte (connections split
    over the step limit included)."""
    _, *arrays = _schedules(coll, budget, count=8)
    calls: list[int] = []
    orbit = writer._lower_orbit

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return orbit(*a, **k)

    compared = 0
    for arr in arrays:
        sched = arr.to_schedule()
        frames = find_frames(sched)
        assert frames is not None and translates_exactly(sched, frames)
        monkeypatch.setattr(writer, "translates_exactly", lambda *_: False)
        try:
            full = lower_msccl(sched, max_threadblocks=budget)
        except writer.MscclFormatError as exc:
            monkeypatch.undo()
            with pytest.raises(writer.MscclFormatError, match=str(exc).split(";")[0]):
                lower_msccl(sched, max_threadblocks=budget)
            continue
        monkeypatch.undo()
        monkeypatch.setattr(writer, "_lower_orbit", counting)
        before = len(calls)
        fast = lower_msccl(sched, max_threadblocks=budget)
        monkeypatch.undo()
        assert len(calls) > before
        for proto in ("Simple", "LL"):
            kw = {"name": "orbit", "proto": proto, "nchannels": arr.channels}
            assert render_lowering(fast, **kw) == render_lowering(full, **kw)
        shape = ("threadblocks", "max_steps", "split_connections")
        assert [getattr(fast, a) for a in shape] == [getattr(full, a) for a in shape]
        compared += 1
    assert compared


def _ring(n: int, c: int) -> Schedule:
    """N translates of root 0's chunks walking a ring, each hop after the chunk's previous hop
    and after the previous chunk's same hop: every connection carries c x (N-1) steps that
    cannot fuse, over the executor's 64."""
    s = Schedule("ring", Collective.ALLGATHER, n, c)
    for r in range(n):
        base = len(s.transfers)
        for k in range(c):
            for i in range(n - 1):
                deps = [base + (k * (n - 1) + i - 1)] if i else []
                if k:
                    deps.append(base + (k - 1) * (n - 1) + i)
                s.add(Transfer((r + i) % n, (r + i + 1) % n, r * c + k, deps=tuple(deps)))
    return s


def test_connections_split_over_the_step_limit_match_too(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = _ring(4, 40)
    frames = find_frames(sched)
    assert frames is not None and translates_exactly(sched, frames)
    fast = lower_msccl(sched)
    monkeypatch.setattr(writer, "translates_exactly", lambda *_: False)
    full = lower_msccl(sched)
    assert full.split_connections and full.max_steps <= 64
    assert fast.split_connections == full.split_connections
    kw = {"name": "ring", "proto": "Simple", "nchannels": 1}
    assert render_lowering(fast, **kw) == render_lowering(full, **kw)


def test_exact_translation_is_checked_not_assumed() -> None:
    """A dependency, a channel or a chunk changed in one block: the schedule still has frames
    (its blocks are images of block 0's ranks) but is not its own translate, so it is lowered
    rank by rank."""
    _, arr = _schedules(Collective.ALLGATHER, 16, count=1)
    sched = arr.to_schedule()
    frames = find_frames(sched)
    assert frames is not None and translates_exactly(sched, frames)
    t = frames.per_block
    last = sched.transfers[-1]
    for changed in (replace(last, deps=()), replace(last, channel=last.channel + 1),
                    replace(last, chunk=sched.transfers[t - 1].chunk)):  # fmt: skip
        other = replace(sched, transfers=[*sched.transfers[:-1], changed])
        got = find_frames(other)
        assert got is not None and not translates_exactly(other, got)
