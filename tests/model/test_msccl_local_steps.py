"""Local steps (`cpy`, `re`) are charged in the read-back: each local operation (a `cpy`, or a run
of `re`s msccl_parser.cc fuses into one reduction) is a transfer from its GPU to itself on its
threadblock, moving cnt x (reads + 1 write) chunks of local memory at the threadblock's rate
(formats/msccl/reader.py, slicing.py; docs/cost-model.md "Local steps"), while
slicing.CHARGE_LOCAL_STEPS is on; off, a file is timed by its sends alone, as before."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import Collective
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.formats.msccl import reader, scratch, slicing
from ccltune.model.formats.msccl.executor import MAX_REDUCE_FUSION
from ccltune.model.formats.msccl.reader import ReadBack, read_msccl
from ccltune.model.formats.msccl.slicing import expand, unit_size
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import PROTOCOLS, lower_msccl, to_msccl_xml
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.schedule.ir import Schedule, Transfer
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.topology.presets import load_preset

MIB = 1 << 20


@pytest.fixture
def charged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "CHARGE_LOCAL_STEPS", True)


def _step(s: int, typ: str, src: str, soff: int, dst: str, doff: int, cnt: int = 2) -> str:
    return (f'<step s="{s}" type="{typ}" srcbuf="{src}" srcoff="{soff}" dstbuf="{dst}" '
            f'dstoff="{doff}" cnt="{cnt}" depid="-1" deps="-1" hasdep="0"/>')  # fmt: skip


def _pair_allreduce() -> str:
    """2 GPUs, one threadblock each: send the input, receive the peer's into scratch, copy the
    input to the output, reduce the scratch into it (2 chunks per step)."""
    gpus = []
    for g in (0, 1):
        steps = [_step(0, "s", "i", 0, "s", 0), _step(1, "r", "s", 0, "s", 0),
                 _step(2, "cpy", "i", 0, "o", 0), _step(3, "re", "s", 0, "o", 0)]  # fmt: skip
        gpus.append(f'<gpu id="{g}" i_chunks="2" o_chunks="2" s_chunks="2">'
                    f'<tb id="0" send="{1 - g}" recv="{1 - g}" chan="0">{"".join(steps)}</tb>'
                    "</gpu>")  # fmt: skip
    return ('<algo name="pair" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" '
            'coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="0">'
            + "".join(gpus) + "</algo>")  # fmt: skip


def _time(rb: ReadBack, topo: ClusterTopology, size: int, coll: Collective,
          engine: str = "heap") -> float:  # fmt: skip
    sl = slicing.slicing(rb.schedule.protocol, size, rb.chunks_per_loop, coll)
    assert sl.iterations == 1
    g = nccl_graph(topo)
    cost = protocol_cost("Simple", link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
    arrays = expand(rb, sl, 1)
    return simulate(arrays, topo, unit_size(arrays), replace(cost, floor_us=0.0), Router(topo),
                    engine=engine).time_us  # type: ignore[arg-type]  # fmt: skip


def _uncharged(rb: ReadBack) -> ReadBack:
    return replace(rb, timed=None, local_tb=None, local_step=None, local_traffic=None)


@pytest.mark.usefixtures("charged")
def test_local_steps_after_a_receive_cost_their_traffic_at_the_threadblock_rate() -> None:
    topo = load_preset("dgx-h100-1")
    rb = read_msccl(_pair_allreduce())
    assert rb.timed is not None and rb.local_traffic is not None
    assert len(rb.schedule.transfers) == 2  # the sends alone, as before
    assert [t.src == t.dst for t in rb.timed.transfers] == [False, False, True, True, True, True]
    assert sorted(rb.local_traffic.tolist()) == [2, 2, 3, 3]  # cpy: 1 + 1; re: 2 + 1
    size = 1 * MIB  # 2 chunks of 512 KiB: one iteration
    physics = gpu_physics(topo.gpu_model)
    assert physics is not None
    rate = physics.tb("Simple") * 1e3  # bytes/us
    charged, free = _time(rb, topo, size, Collective.ALLREDUCE), _time(_uncharged(rb), topo,
                                                                        size, Collective.ALLREDUCE)
    # after the receive, the threadblock copies the buffer (1 read, 1 write) and reduces into
    # it (2 reads, 1 write): (2 + 3) / 2 buffers of payload at one threadblock's rate
    assert charged - free == pytest.approx(2.5 * size / rate, rel=1e-9)


@pytest.mark.usefixtures("charged")
@pytest.mark.parametrize("coll", [Collective.REDUCESCATTER, Collective.ALLREDUCE])
def test_fused_reduces_count_once_and_the_symmetric_engine_agrees(coll: Collective) -> None:
    topo = load_preset("mi300x-8")
    n, k = 8, 4
    _, low = scratch.direct(coll, n, 16, {(u, v): k for u in range(n) for v in range(n) if u != v},
                            32, 1, "t")  # fmt: skip
    text = render_lowering(low, name="t", proto="Simple")
    rb = read_msccl(text)
    assert rb.timed is not None and rb.local_traffic is not None
    reduces = text.count('type="re"')
    ops = len(rb.local_traffic)
    # every re is one source of one operation; runs fuse (at most MAX_REDUCE_FUSION sources)
    assert int((rb.local_traffic - 2).sum()) == reduces
    assert ops < reduces and int(rb.local_traffic.max()) <= MAX_REDUCE_FUSION + 2
    size = 64 * MIB
    heap = _time(rb, topo, size, coll)
    assert _time(rb, topo, size, coll, "symmetric") == pytest.approx(heap, rel=1e-9, abs=1e-9)
    # 4 reducing threadblocks per GPU: the reduces, not the links, take the time
    assert heap > 2 * _time(_uncharged(rb), topo, size, coll)


@pytest.mark.usefixtures("charged")
def test_without_threadblock_physics_local_steps_cost_nothing() -> None:
    topo = load_preset("dgx-h100-1").model_copy(update={"gpu_model": ""})
    rb = read_msccl(_pair_allreduce())
    cost = protocol_cost("Simple")
    assert cost.tb_gbps is None
    sl = slicing.slicing("Simple", MIB, rb.chunks_per_loop, Collective.ALLREDUCE)
    times = [simulate(expand(r, sl, 1), topo, 1.0 / expand(r, sl, 1).chunk_bytes(1.0), cost,
                      engine=e).time_us  # type: ignore[arg-type]
             for r in (rb, _uncharged(rb)) for e in ("heap", "batch")]  # fmt: skip
    assert times == pytest.approx([times[1]] * 4, rel=1e-12)


def test_local_steps_are_charged_by_default() -> None:
    assert slicing.CHARGE_LOCAL_STEPS  # slicing.py: why


def test_uncharged_local_steps_leave_the_timing_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "CHARGE_LOCAL_STEPS", False)
    topo = load_preset("dgx-h100-1")
    rb = read_msccl(_pair_allreduce())
    sl = slicing.slicing("Simple", MIB, rb.chunks_per_loop, Collective.ALLREDUCE)
    assert len(expand(rb, sl, 1)) == len(rb.schedule.transfers)
    assert _time(rb, topo, MIB, Collective.ALLREDUCE) == _time(_uncharged(rb), topo, MIB,
                                                                Collective.ALLREDUCE)


@pytest.mark.parametrize("coll", [Collective.REDUCESCATTER, Collective.ALLREDUCE])
def test_local_operations_survive_the_per_protocol_cache(coll: Collective) -> None:
    """A file read before under another protocol is not read again (reader._same_but_protocol);
    where the executor completes its steps in another order, the sends are renumbered and the
    local operations' deps with them: the result is a fresh read's."""
    _, low = scratch.direct(coll, 4, 8, {(u, v): 2 for u in range(4) for v in range(4) if u != v},
                            8, 2, "t")  # fmt: skip
    text = render_lowering(low, name="t", proto="Simple")

    def rows(rb: ReadBack) -> list[tuple[object, ...]]:
        assert rb.timed is not None
        return [(t.src, t.dst, t.chunk, t.count, t.reduce, t.deps, t.channel)
                for t in rb.timed.transfers]  # fmt: skip

    for proto in PROTOCOLS:
        reader._READS.clear()
        read_msccl(text)
        again = read_msccl(text.replace('proto="Simple"', f'proto="{proto}"', 1))
        reader._READS.clear()
        fresh = read_msccl(text.replace('proto="Simple"', f'proto="{proto}"', 1))
        assert again.timed is not None and again.timed.protocol == proto
        assert rows(again) == rows(fresh)


def _direct_allgather(n: int, c: int) -> Schedule:
    """Every GPU sends each of its c chunks straight to every peer, chunk j on channel j."""
    s = Schedule("direct", Collective.ALLGATHER, n, c)
    for src in range(n):
        for dst in range(n):
            for j in range(c) if src != dst else ():
                s.add(Transfer(src, dst, src * c + j, channel=j))
    return s


def test_the_own_chunks_copy_is_dealt_over_the_threadblocks() -> None:
    """The out-of-place copy of a GPU's own chunks waits for nothing: one chunk on each of 4
    threadblocks, before its first receive (writer._spread_copies), not all on one at the end."""
    s = _direct_allgather(4, 4)
    low = lower_msccl(s)
    for items in low.items_of:
        copies = [(tb, st) for tb, lst in items.items() for _, st, _ in lst
                  if st is not None and st.type == "cpy"]  # fmt: skip
        assert sorted(st.cnt for _, st in copies) == [1, 1, 1, 1]
        assert len({tb for tb, _ in copies}) == 4
        for tb, _ in copies:
            kinds = [x.type for _, x, _ in items[tb] if x is not None]
            assert "r" in kinds and kinds.index("cpy") < kinds.index("r")
    for inplace in (False, True):  # the read-back replays the file both ways
        read_msccl(to_msccl_xml(s, name="d", proto="Simple", inplace=inplace))
