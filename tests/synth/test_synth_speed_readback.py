"""Timing a file costs less and gives the same numbers (docs/synthesis-scale.md, "Session 6"):
the sliced schedule's dependencies built without a sort over all iterations, the read-back's
cycle check without building the schedule, and one rendering per lowering for all protocols."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model.formats.msccl import reader, slicing
from ccltune.model.formats.msccl.executor import CHUNK_SLOTS, NCCL_STEPS
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.schedule.check import ScheduleError, topological_order
from ccltune.model.schedule.ir import Schedule, ScheduleArrays, Transfer
from ccltune.synth.engine import synthesize
from ccltune.synth.grid import as_protocol

PROTOCOLS = ("LL", "LL128", "Simple")


def _texts(coll: Collective, count: int = 2) -> list[str]:
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    res = synthesize(topo, coll, [1 << 16, 1 << 26], max_threadblocks=8, evaluate=False)
    out = []
    for arr in list(res.schedules.values())[:count]:
        low = lower_msccl(arr.to_schedule(), max_threadblocks=8)
        out.append(render_lowering(low, name="probe & <x>", proto="Simple",
                                   nchannels=arr.channels))  # fmt: skip
    assert out
    return out


def _reference_deps(rb: reader.ReadBack, sl: slicing.Slicing, k: int) -> tuple[np.ndarray, ...]:
    """The sliced schedule's dependencies by their definition (slicing.py's docstring): the
    file's within each iteration, the threadblock's last send and receive of the previous one,
    the same transfer `depth` iterations back; every edge listed, then sorted and made
    distinct. Charged local operations (`rb.timed`, after the sends) are a send and a receive
    of their threadblock."""
    charged = slicing.CHARGE_LOCAL_STEPS and rb.timed is not None
    base = ScheduleArrays.from_schedule(rb.timed if charged and rb.timed else rb.schedule)
    n = len(base)
    tb_base = np.concatenate([[0], np.cumsum(rb.threadblocks)]).astype(np.int64)
    none = np.zeros(0, dtype=np.int32)
    local_tb = rb.local_tb if charged and rb.local_tb is not None else none
    local_step = rb.local_step if charged and rb.local_step is not None else none
    send_tb = tb_base[base.src] + np.concatenate([rb.send_tb, local_tb])
    recv_tb, send_step, recv_step = (np.concatenate([a, b]) for a, b in (
        (rb.recv_tb, local_tb), (rb.send_step, local_step), (rb.recv_step, local_step)))
    last_send: dict[int, int] = {}
    last_recv: dict[int, int] = {}
    for i in range(n):  # step positions grow along a threadblock: the last one wins
        if send_tb[i] not in last_send or send_step[i] > send_step[last_send[send_tb[i]]]:
            last_send[int(send_tb[i])] = i
        rtb = int(tb_base[base.dst[i]] + recv_tb[i])
        if rtb not in last_recv or recv_step[i] > recv_step[last_recv[rtb]]:
            last_recv[rtb] = i
    conn = [(int(base.src[i]), int(base.dst[i]), int(base.channel[i])) for i in range(n)]
    slots: dict[tuple[int, int, int], int] = {}
    for i in range(n):
        calls = sl.calls(int(base.count[i]))
        slots[conn[i]] = slots.get(conn[i], 0) + CHUNK_SLOTS[sl.protocol] * calls
    edges = set()
    for j in range(k):
        for i in range(n):
            me = j * n + i
            for d in base.dep_idx[base.dep_ptr[i] : base.dep_ptr[i + 1]]:
                edges.add((me, j * n + int(d)))
            if j:
                for prev in (last_send.get(int(send_tb[i])), last_recv.get(int(send_tb[i]))):
                    if prev is not None:
                        edges.add((me, (j - 1) * n + prev))
                depth = max(1, NCCL_STEPS // max(slots[conn[i]], 1))
                if depth <= j:
                    edges.add((me, (j - depth) * n + i))
    ordered = sorted(edges)
    ptr = np.zeros(n * k + 1, dtype=np.int64)
    np.cumsum(np.bincount([o for o, _ in ordered], minlength=n * k), out=ptr[1:])
    return ptr, np.array([d for _, d in ordered], dtype=np.int64)


@pytest.mark.parametrize("charged", [False, True])
@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.ALLREDUCE])
def test_sliced_dependencies_are_their_definition(coll: Collective, charged: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(slicing, "CHARGE_LOCAL_STEPS", charged)
    for text in _texts(coll):
        for proto in PROTOCOLS:
            rb = reader.read_msccl(as_protocol(text, proto))
            for size in (1 << 12, 1 << 24, 1 << 30):
                sl = slicing.slicing(proto, size, rb.chunks_per_loop, coll)
                for k in (1, 2, 3, 9):
                    got = slicing.structure(rb, sl, k)
                    ptr, idx = _reference_deps(rb, sl, k)
                    assert np.array_equal(got.dep_ptr, ptr), (proto, size, k)
                    assert np.array_equal(got.dep_idx, idx), (proto, size, k)


def test_unsorted_file_dependencies_are_sorted_and_made_distinct() -> None:
    rb = reader.read_msccl(_texts(Collective.ALLGATHER, 1)[0])

    def mess(s: Schedule) -> Schedule:
        return replace(s, transfers=[Transfer(t.src, t.dst, t.chunk, t.count, t.reduce,
                                              tuple(reversed(t.deps)) * 2, t.channel)
                                     for t in s.transfers])  # fmt: skip

    # the file's local copies are timed too (slicing.CHARGE_LOCAL_STEPS): messed up alike
    twin = replace(rb, schedule=mess(rb.schedule),
                   timed=None if rb.timed is None else mess(rb.timed))  # fmt: skip
    assert any(len(t.deps) > 2 for t in twin.schedule.transfers)
    sl = slicing.slicing("Simple", 1 << 26, rb.chunks_per_loop, Collective.ALLGATHER)
    for k in (1, 4):
        a, b = slicing.structure(rb, sl, k), slicing.structure(twin, sl, k)
        assert np.array_equal(a.dep_ptr, b.dep_ptr) and np.array_equal(a.dep_idx, b.dep_idx)


def test_acyclic_agrees_with_the_schedule_check() -> None:
    rng = random.Random(7)
    cyclic = 0
    for case in range(300):
        n = rng.randint(1, 40)
        deps = [frozenset(j for j in range(n) if j != i and rng.random() < 3 / n)
                for i in range(n)]  # fmt: skip
        if case % 2:  # mostly forward edges: acyclic unless a back edge closes a cycle
            deps = [frozenset(j for j in d if j < i or rng.random() < 0.02)
                    for i, d in enumerate(deps)]  # fmt: skip
        probe = Schedule("probe", Collective.ALLGATHER, 1, 1,
                         [Transfer(0, 0, 0, 1, False, tuple(sorted(d))) for d in deps])  # fmt: skip
        try:
            topological_order(probe)
            ok = True
        except ScheduleError:
            ok, cyclic = False, cyclic + 1
        assert reader._acyclic(deps) == ok
    assert 30 < cyclic < 270  # both kinds were tried


def test_a_file_rendered_once_reads_as_every_protocol() -> None:
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    res = synthesize(topo, Collective.ALLGATHER, [1 << 20], max_threadblocks=8, evaluate=False)
    arr = next(iter(res.schedules.values()))
    low = lower_msccl(arr.to_schedule(), max_threadblocks=8)
    name = 'mix(a > b) "proto=" & <c>'
    texts = {p: render_lowering(low, name=name, proto=p, nchannels=arr.channels)
             for p in PROTOCOLS}  # fmt: skip
    for p in PROTOCOLS:
        for q in PROTOCOLS:
            assert as_protocol(texts[p], q) == texts[q]
