"""Replay tables keyed by MSCCL variant, timed-out points kept missing, and profile directories."""

from __future__ import annotations

from pathlib import Path

import pytest
from tune_helpers import DATA

from ccltune.api.common import Collective, Source
from ccltune.api.plan import TaskKey
from ccltune.topology.load import load_cluster
from ccltune.tune.fabric import facts_for
from ccltune.tune.profilers.base import ProfilerError
from ccltune.tune.profilers.replay import ReplayProfiler
from ccltune.tune.space import Config, Impl, build_space

HEADER = "collective,size_bytes,algorithm,protocol,channels,nodes,ranks,cost_metric,bandwidth_gbps,latency_us"
M, G = 1 << 20, 1 << 30


def _key(size: int, ranks: int = 8, nodes: int = 1) -> TaskKey:
    return TaskKey(collective="allreduce", min_bytes=size, max_bytes=size, ranks=ranks, nodes=nodes)


def _facts():
    return facts_for(load_cluster("dgx-h100-1"), 8, 1)


def test_a_timed_out_point_is_missing_never_another_sizes_time() -> None:
    # Issue 14: a configuration that timed out at 1G was replayed with 512M's time (1961 GB/s).
    rows = [f"allreduce,{512 * M},ring,LL,8,1,8,latency,0,2000.0",
            f"allreduce,{G},ring,LL,8,1,8,latency,0,timeout",
            f"allreduce,{2 * G},ring,LL,8,1,8,latency,0,9000.0",
            f"allreduce,{G},ring,Simple,8,1,8,latency,0,5000.0"]
    text = "\n".join([HEADER, *rows]) + "\n"
    ll = Config(Impl("ring", "LL"), 8, 512, 4 << 20)
    for fallback in ("error", "interpolate"):
        prof = ReplayProfiler(fallback=fallback)
        prof.add_sweep_csv(text, "t.csv")
        with pytest.raises(ProfilerError, match="timed out or failed; the point is missing"):
            prof.measure(_key(G), G, ll)
        space = prof.space(_key(G), _facts(), build_space(Collective.ALLREDUCE, _facts()))
        assert [s.impl.protocol for s in space.subspaces] == ["Simple"]  # not offered at 1G
        assert "1 timed-out or failed points kept missing" in prof.notes[0]
    # Between 512M and 2G the timed-out 1G lies: 768M is not interpolated across it.
    with pytest.raises(ProfilerError, match="timed out between"):
        prof.measure(_key(768 * M), 768 * M, ll)


def test_interpolation_only_between_measured_neighbours_and_labelled() -> None:
    rows = [f"allreduce,{M},ring,Simple,8,1,8,latency,0,100.0",
            f"allreduce,{4 * M},ring,Simple,8,1,8,latency,0,400.0"]
    prof = ReplayProfiler(fallback="interpolate")
    prof.add_sweep_csv("\n".join([HEADER, *rows]) + "\n", "t.csv")
    ring = Config(Impl("ring", "Simple"), 8, 512, 4 << 20)
    m = prof.measure(_key(2 * M), 2 * M, ring)
    assert m.time_us == pytest.approx(200.0) and m.note == f"interpolated between measured {M} and {4 * M} bytes"
    with pytest.raises(ProfilerError, match="outside the measured sizes"):
        prof.measure(_key(8 * M), 8 * M, ring)  # nothing is extrapolated


def test_rows_keyed_by_msccl_variant() -> None:
    rows = [f"allreduce,{M},ring,Simple,16,1,8,latency,0,80.0,,,",
            f"allreduce,{M},msccl:allpairs,LL128,2,1,8,latency,0,60.0,4,,",
            f"allreduce,{M},msccl:allpairs,LL128,2,1,8,latency,0,50.0,8,,",
            f"allreduce,{M},msccl:allpairs,LL128,4,1,8,latency,0,55.0,8,,",  # 32 threadblock channels
            f"allreduce,{M},MSCCL:allpairs,Simple,8,1,8,latency,0,70.0,8,,"]  # 64 > MAXCHANNELS
    text = "\n".join([HEADER + ",instances,threads,buffsize", *rows]) + "\n"
    full = build_space(Collective.ALLREDUCE, _facts())
    nccl = ReplayProfiler()
    nccl.add_sweep_csv(text, "v.csv")
    only_nccl = nccl.space(_key(M), _facts(), full)
    assert [s.impl.algorithm for s in only_nccl.subspaces] == ["ring"]
    assert any("runtime nccl does not run MSCCL" in n for n in only_nccl.notes)
    joint = ReplayProfiler(runtime="msccl")
    joint.add_sweep_csv(text, "v.csv")
    space = joint.space(_key(M), _facts(), full)
    sub = space.subspace(Impl("msccl:allpairs", "LL128"))
    assert sorted(c.point for c in sub) == [(2, 640, 4 << 20, 4), (2, 640, 4 << 20, 8), (4, 640, 4 << 20, 8)]
    assert any("exceed MAXCHANNELS 32" in n for n in space.notes)
    best = min(space, key=lambda c: joint.measure(_key(M), M, c).time_us)
    assert best.label() == "msccl:allpairs/LL128/p2p 2ch 640t 4096K x8"
    bad = ReplayProfiler()
    with pytest.raises(ValueError, match=r"b.csv:2: instances 2: only MSCCL rows"):
        bad.add_sweep_csv(HEADER + ",instances\n" + f"allreduce,{M},ring,LL,8,1,8,latency,0,10.0,2\n", "b.csv")


NCCL_TESTS_LOG = """# nThread 1 nGpus 1 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid  1001 on     node-a device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  1002 on     node-a device  1 [0x0a] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  2001 on     node-b device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  2002 on     node-b device  1 [0x0a] NVIDIA H100 80GB HBM3
     1048576        262144     float     sum      -1    70.00   14.98   22.47      0    69.00   15.20   22.80      0
     2097152        524288     float     sum      -1    90.00   23.30   34.95      0    89.00   23.56   35.34      0
"""


def test_profiles_directory_is_measured_data(tmp_path: Path) -> None:
    (tmp_path / "all_reduce_perf-2x2.log").write_text(NCCL_TESTS_LOG)
    (tmp_path / "sweep.csv").write_text((Path(DATA) / "nccl-sweep-schema-sample.csv").read_text())
    (tmp_path / "README.md").write_text("not a profile")
    prof = ReplayProfiler.from_dir(tmp_path)
    assert prof.source == Source.MEASURED
    logged = prof.default_measure(_key(M, ranks=4, nodes=2), M)  # shape from the '# Rank' lines
    assert logged is not None and logged.time_us == 70.0 and logged.source == Source.MEASURED
    assert prof.default_measure(_key(8 * M, ranks=4, nodes=2), 8 * M) is None  # not run there: missing
    with pytest.raises(ValueError, match=r"README\.md is not a directory"):
        ReplayProfiler.from_dir(tmp_path / "README.md")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no \.csv, \.log or \.txt profile"):
        ReplayProfiler.from_dir(tmp_path / "empty")
    unnamed = tmp_path / "u"
    unnamed.mkdir()
    (unnamed / "run1.log").write_text(NCCL_TESTS_LOG)
    with pytest.raises(ValueError, match="name the file after the binary"):
        ReplayProfiler.from_dir(unnamed)


def _surface_profiles(directory: Path, sizes: tuple[int, ...]) -> None:
    """A profile directory in the sweep CSV schema, its numbers from the simulated surface."""
    from ccltune.tune.profilers.simulated import SimulatedProfiler

    topo = load_cluster("dgx-h100-1")
    sim = SimulatedProfiler(topo, noise=0.0)
    lines = [HEADER]
    for size in sizes:
        key = _key(size)
        for c in build_space(Collective.ALLREDUCE, _facts()):
            if c.threads in (512, 640) and c.buffsize == 4 << 20 and c.impl.transport == "p2p":
                t = sim.true_time_us(key, size, c)
                lines.append(f"allreduce,{size},{c.impl.algorithm},{c.impl.protocol},{c.channels},1,8,latency,0,{t}")
    (directory / "h100-allreduce.csv").write_text("\n".join(lines) + "\n")


def test_plan_with_profiles_tunes_on_them_and_says_measured(tmp_path: Path) -> None:
    from ccltune.api.ccltuning import CCLTuningSpec
    from ccltune.pipeline import build_plan

    _surface_profiles(tmp_path, (64 << 10, M, 16 * M))
    spec = CCLTuningSpec.model_validate({
        "selector": {"matchLabels": {"app": "x"}},
        "collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "16M"},
                        {"op": "allgather", "minBytes": "64K", "maxBytes": "1M"}],
        "synthesis": {"enabled": False},
        "tuning": {"enabled": True, "searcher": "autoccl", "profiler": "simulated", "budget": 40},
    })
    plan = build_plan(spec, load_cluster("dgx-h100-1"), name="p", profiles=tmp_path)
    allreduce = next(t for t in plan.tasks if t.key.collective == Collective.ALLREDUCE)
    assert {e.source for e in allreduce.chosen_estimates} == {Source.MEASURED}
    assert {e.size_bytes for e in allreduce.chosen_estimates} == {64 << 10, M, 16 * M}
    allgather = next(t for t in plan.tasks if t.key.collective == Collective.ALLGATHER)
    assert Source.MEASURED not in {e.source for e in allgather.chosen_estimates}  # no profile: untouched
    assert any("allgather" in n and "no size in this range" in n for n in plan.notes)


def test_cli_tune_with_profiles(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from ccltune.cli import tune as tune_cli

    app = typer.Typer()

    @app.callback()
    def _root() -> None: ...

    tune_cli.register(app)
    _surface_profiles(tmp_path, (64 << 10, M))
    out = tmp_path / "out"
    ok = CliRunner().invoke(app, ["tune", "--cluster", "dgx-h100-1", "--profiles", str(tmp_path), "--sizes", "64K:1M",
                                  "--budget", "20", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert "measured" in ok.output
    assert '"source": "measured"' in (out / "tuning.json").read_text()
    both = CliRunner().invoke(app, ["tune", "--cluster", "dgx-h100-1", "--profiles", str(tmp_path),
                                    "--profiler", f"replay:{DATA}/nccl-sweep-schema-sample.csv"])
    assert both.exit_code == 2 and "give either --profiles or --profiler" in both.output
    missing = CliRunner().invoke(app, ["tune", "--cluster", "dgx-h100-1", "--profiles", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "is not a directory" in missing.output


def test_tuner_searches_variants_within_its_budget_and_reports_the_winner(tmp_path: Path) -> None:
    from ccltune.tune.profilers.simulated import sweep_csv
    from ccltune.tune.tuner import tune_tasks

    topo = load_cluster("dgx-h100-1")
    table = tmp_path / "joint.csv"
    table.write_text(sweep_csv(topo, 8, 1, [Collective.ALLREDUCE], [M, 32 * M]))
    key = TaskKey(collective="allreduce", min_bytes=M, max_bytes=32 * M, ranks=8, nodes=1)
    runs = {rt: tune_tasks([key], topo, profiler=f"replay:{table}", runtime=rt, budget=40, verify_reps=1)
            for rt in ("nccl", "msccl")}
    assert all(t.synthesized is None for t in runs["nccl"].tasks)  # stock NCCL cannot run them
    joint = runs["msccl"].tasks
    assert all(t.trials <= 40 for t in joint)
    won = [t for t in joint if t.synthesized is not None]
    assert won, "on this surface MSCCL allpairs wins at 1M"
    for t in won:
        assert t.synthesized is not None and t.synthesized.measurement.note == "picked by the joint search"
        assert t.choice().kind == "msccl"
        assert t.deployed is not None and not t.deployed.impl.algorithm.startswith("msccl:")  # the tuner row
        assert t.chosen_measure.time_us < t.default_measure.time_us
        nccl_run = next(n for n in runs["nccl"].tasks if n.size == t.size)
        assert t.chosen_measure.time_us < nccl_run.chosen_measure.time_us


def test_interpolated_times_are_labelled_in_the_tuner_notes(tmp_path: Path) -> None:
    from ccltune.tune.tuner import tune_tasks

    rows = [f"allreduce,{size},ring,{proto},{ch},1,8,latency,0,{t}"
            for size, scale in ((M, 1.0), (4 * M, 3.0), (2 * M, 2.0))
            for proto, ch, t in (("Simple", 8, 100.0 * scale), ("LL", 8, 90.0 * scale))
            if not (size == 2 * M and proto == "LL")]  # LL not measured at 2M: interpolated there
    table = tmp_path / "t.csv"
    table.write_text("\n".join([HEADER, *rows]) + "\n")
    key = TaskKey(collective="allreduce", min_bytes=M, max_bytes=4 * M, ranks=8, nodes=1)
    result = tune_tasks([key], load_cluster("dgx-h100-1"), profiler=f"replay:{table}", fallback="interpolate",
                        budget=5, verify_reps=1)
    at_2m = next(t for t in result.tasks if t.size == 2 * M)
    assert at_2m.chosen_measure.note.startswith("interpolated between measured")
    assert any("interpolated between measured" in n and "not measured at 2097152 bytes" in n for n in at_2m.notes)
