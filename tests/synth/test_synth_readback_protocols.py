"""A lowering timed as a file per protocol is parsed, proved and converted once (reader.py's
`_same_but_protocol`): the second protocol's read-back must equal a fresh read of its file."""

from __future__ import annotations

import numpy as np
import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model import evaluate
from ccltune.model.evaluate import published_estimate
from ccltune.model.formats.msccl import reader
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.synth.engine import synthesize

PROTOCOLS = ("LL", "LL128", "Simple")


def _same(a: reader.ReadBack, b: reader.ReadBack) -> None:
    assert a.schedule == b.schedule
    assert a.chunks_per_loop == b.chunks_per_loop
    for f in ("send_tb", "recv_tb", "send_step", "recv_step", "threadblocks"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER])
def test_other_protocols_read_back_as_a_fresh_read(coll: Collective,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    topo = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)
    res = synthesize(topo, coll, [1 << 16, 1 << 26], max_threadblocks=8, evaluate=False)
    assert res.schedules
    parse = reader._parse
    parsed: list[str] = []

    def counting(text: str, maps: object = None) -> object:
        parsed.append(text)
        return parse(text, maps)

    for arr in list(res.schedules.values())[:3]:
        low = lower_msccl(arr.to_schedule(), max_threadblocks=8)
        texts = {p: render_lowering(low, name="probe", proto=p, nchannels=arr.channels)
                 for p in PROTOCOLS}  # fmt: skip
        fresh = {}
        for p, text in texts.items():
            reader._READS.clear()
            fresh[p] = reader.read_msccl(text)
        reader._READS.clear()
        parsed.clear()
        monkeypatch.setattr(reader, "_parse", counting)
        shared = {p: reader.read_msccl(text) for p, text in texts.items()}
        monkeypatch.setattr(reader, "_parse", parse)
        assert len(parsed) < len(PROTOCOLS)  # at least one protocol reused the first read
        for p in PROTOCOLS:
            assert shared[p].schedule.protocol == p
            _same(shared[p], fresh[p])
        # and what the engine compares: the simulated time of each file as published
        for p, text in texts.items():
            other = texts["Simple" if p != "Simple" else "LL"]
            for size in (1 << 16, 1 << 26):
                reader._READS.clear()
                evaluate._read_back.cache_clear()
                alone = published_estimate(coll, size, topo, text).time_us
                reader._READS.clear()
                evaluate._read_back.cache_clear()
                reader.read_msccl(other)
                assert published_estimate(coll, size, topo, text).time_us == alone


def test_a_file_that_differs_beyond_the_protocol_is_read_afresh() -> None:
    topo = make_cluster(4, 2, "nvswitch")
    res = synthesize(topo, Collective.ALLGATHER, [1 << 20], evaluate=False)
    arr = next(iter(res.schedules.values()))
    low = lower_msccl(arr.to_schedule(), max_threadblocks=res.max_threadblocks)
    a = render_lowering(low, name="a", proto="LL", nchannels=arr.channels)
    b = render_lowering(low, name="b", proto="Simple", nchannels=arr.channels)
    reader._READS.clear()
    reader.read_msccl(a)
    assert reader.read_msccl(b).schedule.name == "b"
    with pytest.raises(reader.MscclFormatError, match="proto"):
        reader.read_msccl(a.replace('proto="LL"', 'proto="LL64"', 1))
