"""A file's lowering is dropped once its text is rendered for timing, and the published file is
written from that text, byte for byte what writing the lowering gives (docs/synthesis-scale.md,
"Session 10, second round")."""

from __future__ import annotations

import html
import io
import re
import weakref
from pathlib import Path

import pytest
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.stream import render_lowering, write_lowering, write_retitled
from ccltune.model.formats.msccl.writer import MscclLowering
from ccltune.synth import engine

SIZES = [1 << 10, 1 << 18, 1 << 22, 1 << 26, 1 << 28]
TOPO = make_cluster(4, 2, "nvswitch", nvlink=200.0, nic_gbps=100.0)


def test_no_lowering_held_once_rendered_and_files_unchanged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rendered: dict[str, MscclLowering] = {}  # kept here (not by the engine) to compare with
    real_render = engine.render_lowering

    def spy_render(low: MscclLowering, **kw: object) -> str:
        rendered.setdefault(str(kw["name"]), low)
        return real_render(low, **kw)

    held: list[str] = []
    real_ranges = engine._ranges

    def spy_ranges(*args: object, **kw: object) -> list[engine.RangeResult]:
        lowered = args[6] if len(args) > 6 else kw.get("lowered")
        held.extend(lb for lb in rendered if lb in (lowered or {}))  # type: ignore[operator]
        return real_ranges(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "render_lowering", spy_render)
    monkeypatch.setattr(engine, "_ranges", spy_ranges)
    out = tmp_path / "files"
    res = engine.synthesize(TOPO, Collective.ALLGATHER, SIZES, max_threadblocks=4, out_dir=out)
    assert rendered and not held  # every rendered file's lowering was let go before writing
    written = [rr for rr in res.ranges if rr.xml_file is not None and rr.label in rendered]
    assert written
    for rr in written:
        text = Path(str(rr.xml_file)).read_text(encoding="utf-8")
        name = html.unescape(re.search(r' name="([^"]*)"', text)[1])  # type: ignore[index]
        low = rendered[rr.label]
        arr = res.schedules[rr.label]
        expected = io.StringIO()
        write_lowering(low, expected, name=name, proto=rr.protocol, nchannels=arr.channels,
                       min_bytes=rr.file_min_bytes, max_bytes=rr.max_bytes or None,
                       inplace=True)  # fmt: skip
        assert text == expected.getvalue()


def test_no_lowering_alive_while_its_file_is_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    # the rail-512 ring's lowering (338 MB) was held through every timing of its file
    lowerings: list[weakref.ref[MscclLowering]] = []
    real_render, real_time = engine.render_lowering, engine.file_time

    def spy_render(low: MscclLowering, **kw: object) -> str:
        lowerings.append(weakref.ref(low))
        return real_render(low, **kw)

    alive: list[int] = []

    def spy_time(*args: object) -> float | str:
        alive.append(sum(ref() is not None for ref in lowerings))
        return real_time(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "render_lowering", spy_render)
    monkeypatch.setattr(engine, "file_time", spy_time)
    engine.synthesize(TOPO, Collective.ALLGATHER, SIZES, max_threadblocks=4)
    assert lowerings and alive and not any(alive)


def test_retitled_text_is_the_lowering_written_with_those_attributes() -> None:
    res = engine.synthesize(TOPO, Collective.ALLGATHER, [1 << 26], max_threadblocks=4)
    arr = next(iter(res.schedules.values()))
    low = engine.lower_msccl(arr.to_schedule(), max_threadblocks=4)
    text = render_lowering(low, name="x", proto="LL", nchannels=arr.channels)
    got, want = io.StringIO(), io.StringIO()
    write_retitled(text, got, name='a&"b', proto="Simple", minBytes=4096, maxBytes=1 << 20,
                   inplace=1)  # fmt: skip
    write_lowering(low, want, name='a&"b', proto="Simple", nchannels=arr.channels,
                   min_bytes=4096, max_bytes=1 << 20, inplace=True)  # fmt: skip
    assert got.getvalue() == want.getvalue()
