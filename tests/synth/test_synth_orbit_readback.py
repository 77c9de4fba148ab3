"""A file whose ranks are rank 0's translates is read through rank 0 (formats/msccl/
translates.py): the result must be exactly what parsing every `<gpu>` gives, and a file whose
rank 5 differs anywhere must be parsed element by element (issue 18)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model import evaluate
from ccltune.model.formats.msccl import reader
from ccltune.model.formats.msccl.reader import ReadBack, read_msccl
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError, lower_msccl
from ccltune.model.nccl.baselines import ring_allgather
from ccltune.synth.engine import synthesize
from ccltune.topology.presets import load_preset


def _files(topo, coll: Collective, budget: int, count: int = 2) -> list[str]:
    res = synthesize(topo, coll, [1 << 16, 1 << 26], max_threadblocks=budget, evaluate=False)
    out = []
    for arr in list(res.schedules.values())[:count]:
        try:
            low = lower_msccl(arr.to_schedule(), max_threadblocks=budget)
        except ValueError:
            continue
        out.append(render_lowering(low, name="orbit", proto="Simple", nchannels=arr.channels))
    assert out
    return out


def _steps(tbs) -> list:
    return [[[(x.gpu, x.tb, x.idx, x.type, x.srcbuf, x.srcoff, x.dstbuf, x.dstoff, x.cnt,
               x.depid, x.deps, x.hasdep, x.chan, x.send, x.recv) for x in t] for t in g]
            for g in tbs]  # fmt: skip


def _read_full(text: str, monkeypatch: pytest.MonkeyPatch) -> ReadBack:
    reader._READS.clear()
    with monkeypatch.context() as m:
        m.setattr(reader, "_parse_translated", lambda _text, _maps=None: None)
        return read_msccl(text)


def _same(a: ReadBack, b: ReadBack) -> None:
    assert a.schedule == b.schedule
    assert a.chunks_per_loop == b.chunks_per_loop
    for name in ("send_tb", "recv_tb", "send_step", "recv_step", "threadblocks"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


CASES = [
    ("syccl-a800-16", Collective.ALLGATHER, 8),
    ("dgx-h100-2", Collective.ALLGATHER, 16),
    ("dgx-h100-2", Collective.REDUCESCATTER, 16),
    ("dgx-h100-2", Collective.ALLREDUCE, 16),
]


@pytest.mark.parametrize(("preset", "coll", "budget"), CASES)
def test_translated_files_read_through_rank_0_exactly(preset: str, coll: Collective, budget: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    topo = load_preset(preset)
    for text in _files(topo, coll, budget):
        fast = reader._parse_translated(text)
        assert fast is not None  # the writer's translated files take the fast path
        full = reader._parse_each(text)
        assert fast[0] == full[0] and fast[1] == full[1]
        assert _steps(fast[2]) == _steps(full[2])
        full_read = _read_full(text, monkeypatch)
        reader._READS.clear()
        _same(read_msccl(text), full_read)
        for size in (1 << 16, 1 << 26):  # what synthesis compares: the published file's time
            evaluate._read_back.cache_clear()
            evaluate._structure.cache_clear()
            reader._READS.clear()
            t_fast = evaluate.published_estimate(coll, size, topo, text).time_us
            evaluate._read_back.cache_clear()
            evaluate._structure.cache_clear()
            with monkeypatch.context() as m:
                m.setattr(reader, "_parse_translated", lambda _text, _maps=None: None)
                reader._READS.clear()
                t_full = evaluate.published_estimate(coll, size, topo, text).time_us
            assert t_fast == t_full
    evaluate._read_back.cache_clear()
    evaluate._structure.cache_clear()


def _rank_element(text: str, r: int) -> tuple[int, int]:
    start = text.index(f'<gpu id="{r}"')
    return start, text.index("</gpu>", start)


# One attribute of rank 5 changed: each must send the file down the element-by-element path.
EDITS = [
    (r' cnt="(\d+)"', lambda m: f' cnt="{int(m.group(1)) + 1}"'),
    (r' depid="(-?\d+)"', lambda m: f' depid="{int(m.group(1)) + 1}"'),
    (r' dstoff="(\d+)"', lambda m: f' dstoff="{int(m.group(1)) ^ 1}"'),
    (r' recv="(\d+)"', lambda m: f' recv="{(int(m.group(1)) + 1) % 8}"'),
    (r' type="r"', lambda m: ' type="nop"'),
    (r' hasdep="0"', lambda m: ' hasdep="1"'),
    (r' chan="0"', lambda m: ' chan="1"'),
    (r"<step ", lambda m: "<!-- x --><step "),
    (r' cnt="(\d+)"', lambda m: f" cnt='{m.group(1)}'"),
    (r' dstoff="(\d+)"', lambda m: ' dstoff="99999999999999999999"'),
    (r' dstoff="(\d+)"', lambda m: f' dstoff="0{m.group(1)}"'),
]


@pytest.mark.parametrize(("pattern", "edit"), EDITS)
def test_one_attribute_differing_on_rank_5_falls_back(pattern: str, edit,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    text = _files(topo, Collective.ALLGATHER, 16, count=1)[0]
    assert reader._parse_translated(text) is not None
    a, b = _rank_element(text, 5)
    changed = text[:a] + re.sub(pattern, edit, text[a:b], count=1) + text[b:]
    assert changed != text
    assert reader._parse_translated(changed) is None
    try:
        want: ReadBack | str = _read_full(changed, monkeypatch)
    except MscclFormatError as exc:
        want = str(exc)
    reader._READS.clear()
    try:
        got: ReadBack | str = read_msccl(changed)
    except MscclFormatError as exc:
        got = str(exc)
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
    else:
        _same(got, want)


def test_a_file_that_is_not_translates_is_parsed_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's ring: its `<gpu>` elements may or may not be translates; either way the read is
    the element-by-element one's."""
    low = lower_msccl(ring_allgather(make_cluster(4, 2, "nvswitch")).to_schedule())
    text = render_lowering(low, name="ring", proto="Simple")
    reader._READS.clear()
    _same(read_msccl(text), _read_full(text, monkeypatch))


def test_another_protocol_in_another_order_reuses_the_proof(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The executor completes the steps in another order under another protocol's FIFO slots:
    the first read's parse and proof are reused (happens-before does not depend on the
    order), and the transfers, numbered in the new order, equal a fresh read's."""
    reordered = 0
    for text in _files(load_preset("syccl-a800-16"), Collective.ALLGATHER, 8, count=4):
        reordered += _second_protocol(text, monkeypatch)
    assert reordered  # the case this test is about happened


def _second_protocol(text: str, monkeypatch: pytest.MonkeyPatch) -> int:
    reordered = 0
    for other in ("LL", "LL128"):
        second = text.replace('proto="Simple"', f'proto="{other}"', 1)
        reader._READS.clear()
        reader.read_msccl(text)
        seen = next(iter(reader._READS.values()))
        attrs = seen.attrs
        order = reader.execute(seen.prog, reader.slots_per_step(
            other, int(attrs["maxBytes"]), int(attrs["nchunksperloop"])))  # fmt: skip
        reordered += tuple(x.uid for x in order) != seen.order
        with monkeypatch.context() as m:
            m.setattr(reader, "_parse", lambda _text: pytest.fail("parsed again"))
            m.setattr(reader, "prove", lambda *_a: pytest.fail("proved again"))
            shared = reader.read_msccl(second)
        assert shared.schedule.protocol == other
        _same(shared, _read_full(second, monkeypatch))
    return reordered


def test_rank_0_with_a_comment_is_parsed_element_by_element(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A comment in rank 0 could hold `"`s that misalign the tokens: not read through rank 0."""
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    text = _files(topo, Collective.ALLGATHER, 16, count=1)[0]
    a, b = _rank_element(text, 0)
    changed = text[:a] + text[a:b].replace("<tb ", '<!-- " send="1" --><tb ', 1) + text[b:]
    assert reader._parse_translated(changed) is None
    full = _read_full(changed, monkeypatch)
    reader._READS.clear()
    _same(read_msccl(changed), full)
