"""Synthesis at scale: memory and repeated work are bounded, counted in bytes and calls (never
seconds), and the CLI reports what benchmarks/synthesis.py reads."""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ccltune.api.common import Collective
from ccltune.cli import _register, app
from ccltune.model.cost import bounds
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import lower_msccl
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth import engine, side
from ccltune.topology.presets import load_preset


def test_one_lowering_per_schedule_however_many_files(tmp_path: Path, monkeypatch) -> None:
    """Ranges of one schedule (one per protocol) render from one lowering: lowering is the
    writer's costly part and does not depend on the protocol or the range."""
    calls: list[tuple[str, str]] = []
    real = engine.lower_msccl

    def counted(sched, **kw):  # type: ignore[no-untyped-def]
        calls.append((sched.name, kw.get("pairing", "forwarding")))
        return real(sched, **kw)

    monkeypatch.setattr(engine, "lower_msccl", counted)
    sizes = [1 << k for k in range(10, 31, 2)]
    res = engine.synthesize(load_preset("dgx-h100-2"), Collective.ALLGATHER, sizes,
                            out_dir=tmp_path, max_threadblocks=16)  # fmt: skip
    files = [r for r in res.ranges if r.xml_file]
    assert files, "nothing was written: the test proves nothing"
    # Every lowering is of a distinct schedule and pairing (screening's), none repeated for a
    # file.
    assert len(calls) == len(set(calls))
    for r in files:
        assert Path(r.xml_file or "").read_text().startswith("<algo")
        assert r.threadblocks >= 1


def test_bound_routes_are_computed_once_per_protocol_not_per_size(monkeypatch) -> None:
    topo = load_preset("h800-rail-64")
    side.bound_us(Collective.ALLGATHER, 1 << 10, topo)  # warm: one route search per rank
    searches = 0
    real = bounds._Graph.distances

    def counted(self, *a, **k):  # type: ignore[no-untyped-def]
        nonlocal searches
        searches += 1
        return real(self, *a, **k)

    monkeypatch.setattr(bounds._Graph, "distances", counted)
    for k in range(11, 31):
        side.bound_us(Collective.ALLGATHER, 1 << k, topo)
    # Only the few cut sets search again: 20 sizes x 3 protocols, far below 64 ranks x 2 each.
    assert searches < 20 * 3 * topo.world_size


@pytest.mark.parametrize("preset,coll,sizes,limit_mb", [
    # Traced peak measured 2026-11-24: 29 MB, file written (docs/synthesis-scale.md). The limit
    # leaves ~2x headroom for schedule changes and fails on Transfer objects kept per variant.
    ("syccl-a800-16", Collective.ALLGATHER, [1 << 20, 1 << 30], 64),
])  # fmt: skip
def test_peak_memory_is_bounded(preset: str, coll: Collective, sizes: list[int], limit_mb: int,
                                tmp_path: Path) -> None:  # fmt: skip
    topo = load_preset(preset)
    tracemalloc.start()
    try:
        res = engine.synthesize(topo, coll, sizes, out_dir=tmp_path, time_budget_s=1e9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.sizes and len(res.sizes) == len(sizes)
    assert peak < limit_mb * 1e6, f"peak {peak / 1e6:.0f} MB (traced) over {limit_mb} MB"


def test_cli_json_and_sm_budget(tmp_path: Path) -> None:
    _register()
    runner = CliRunner()
    out, summary = tmp_path / "msccl", tmp_path / "s.json"
    r = runner.invoke(app, ["synthesize", "--cluster", "dgx-h100-2", "--collective", "allgather",
                            "--sizes", "1K,64M", "--out", str(out), "--json", str(summary),
                            "--max-threadblocks", "16"])  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(summary.read_text())
    assert data["maxThreadblocks"] == 16 and data["ranks"] == 16
    assert [s["bytes"] for s in data["sizes"]] == [1024, 64 << 20]
    assert all(s["source"] == "simulated" for s in data["sizes"])
    written = {r["file"] for r in data["ranges"] if r["file"]}
    assert written == {str(p) for p in out.glob("*.xml")}
    bad = runner.invoke(app, ["synthesize", "--cluster", "dgx-h100-2", "--collective",
                              "allgather", "--max-threadblocks", "0"])  # fmt: skip
    assert bad.exit_code == 2 and "--max-threadblocks" in bad.output


def _shuffled(arr, seed: int):  # type: ignore[no-untyped-def]
    """The same schedule with its transfers listed in a random order (deps renumbered)."""
    n = len(arr)
    perm = np.random.default_rng(seed).permutation(n)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    deps = [inv[arr.dep_idx[arr.dep_ptr[p] : arr.dep_ptr[p + 1]]] for p in perm]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(d) for d in deps], out=ptr[1:])
    return replace(arr, src=arr.src[perm], dst=arr.dst[perm], chunk=arr.chunk[perm],
                   count=arr.count[perm], reduce=arr.reduce[perm], channel=arr.channel[perm],
                   dep_ptr=ptr, dep_idx=np.concatenate(deps).astype(np.int64)), perm  # fmt: skip


@pytest.mark.parametrize("coll", ["allgather", "reducescatter"])
def test_symmetric_engine_takes_translates_in_any_order(coll: str) -> None:
    """A file read back lists each gpu's steps in turn, not N translates of one root's: the
    symmetric engine reorders and still equals the full simulation, transfer by transfer."""
    topo = load_preset("dgx-h100-2")
    res = engine.synthesize(topo, coll, [1 << 20], max_threadblocks=32, evaluate=False)
    arr = next(iter(res.schedules.values()))
    mixed, perm = _shuffled(arr, 7)
    router = Router(topo)
    cost = protocol_cost("Simple", gpu=gpu_physics(topo.gpu_model))
    sym = simulate(mixed, topo, 1 << 24, cost, router, engine="symmetric")
    assert sym.engine == "symmetric", sym.note
    full = simulate(mixed, topo, 1 << 24, cost, router, engine="heap")
    assert sym.time_us == pytest.approx(full.time_us, rel=1e-9)
    np.testing.assert_allclose(sym.finish_us, full.finish_us, rtol=1e-9)
    # And the same schedule in its own order gives the same per-transfer times.
    own = simulate(arr, topo, 1 << 24, cost, router, engine="symmetric")
    np.testing.assert_allclose(sym.finish_us, own.finish_us[perm], rtol=1e-9)


@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "allreduce", "alltoall"])
def test_streamed_xml_equals_the_rendered_tree(coll: str) -> None:
    """The file is written one <gpu> at a time (no ElementTree of the whole file), byte for byte
    what MscclLowering.render builds; names are escaped as ElementTree escapes them."""
    res = engine.synthesize(load_preset("dgx-h100-2"), coll, [1 << 20], max_threadblocks=32,
                            evaluate=False)
    arr = next(iter(res.schedules.values()))
    low = lower_msccl(arr.to_schedule())
    kw: dict[str, object] = {"name": 'a <b> & "c"', "proto": "LL128", "min_bytes": 4096,
                             "max_bytes": 1 << 30, "inplace": coll != "alltoall"}  # fmt: skip
    streamed = render_lowering(low, **kw)
    assert streamed == low.render(**kw)  # type: ignore[arg-type]
    assert streamed.count("<gpu ") == 16
