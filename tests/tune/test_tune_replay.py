"""Replay parsing on the real files in ../shared/data, and clear errors on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from tune_helpers import DATA, preset

from ccltune.api.common import Collective, Source
from ccltune.api.plan import TaskKey
from ccltune.tune.default import nccl_default_config, nccl_prior, nearest_replayed
from ccltune.tune.fabric import facts_for
from ccltune.tune.profilers.base import ProfilerError
from ccltune.tune.profilers.nccltests import parse_log
from ccltune.tune.profilers.replay import ReplayProfiler
from ccltune.tune.searchers import SEARCHERS, make_searcher
from ccltune.tune.space import Config, Impl, build_space
from ccltune.tune.tuner import tune_tasks

NCCL_LOG = Path(DATA) / "ndv4-1x8-allreduce-nccl.txt"
MSCCL_LOG = Path(DATA) / "ndv4-1x8-allreduce-msccl.txt"
SWEEP = Path(DATA) / "nccl-sweep-schema-sample.csv"


def key(coll: str = "allreduce", lo: int = 1024, hi: int = 1024, ranks: int = 8, nodes: int = 1) -> TaskKey:
    return TaskKey(collective=coll, min_bytes=lo, max_bytes=hi, ranks=ranks, nodes=nodes)


def test_parse_real_nccl_tests_logs() -> None:
    nccl = parse_log(NCCL_LOG.read_text(), NCCL_LOG.name)
    msccl = parse_log(MSCCL_LOG.read_text(), MSCCL_LOG.name)
    assert list(nccl.sections) == ["NCCL"] and list(msccl.sections) == ["MSCCL"]
    rows = nccl.rows()
    assert len(rows) == 19
    assert [r.size for r in rows] == [128 << i for i in range(19)]
    last = rows[-1]
    assert (last.size, last.count, last.dtype, last.redop) == (33554432, 8388608, "float", "sum")
    assert (last.time_us, last.algbw_gbps, last.busbw_gbps) == (379.5, 88.41, 154.71)
    assert (last.inplace_time_us, last.inplace_busbw_gbps) == (379.4, 154.77)
    m = {r.size: r for r in msccl.rows()}
    assert m[1048576].inplace_time_us == 38.08 and m[1048576].time_us == 71.60


def test_parser_accepts_root_column_comments_and_nccl_info() -> None:
    text = (
        "# nccl-tests header\n"
        "host:1:1 [0] NCCL INFO Using network IB\n"
        "     1024   256   float   none   0   12.5   0.08   0.08   0   12.1   0.08   0.08   N/A\n"
    )
    row = parse_log(text).rows()[0]
    assert row.root == 0 and row.time_us == 12.5 and row.inplace_time_us == 12.1


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("# c\n  1024 256 float sum 12.5 0.08 0.08\n", r"x:2: malformed nccl-tests row"),
        ("1024 256 float sum abc 0.08 0.08 0 12 0.1 0.1 0\n", r"x:1: time 'abc' is not a number"),
        ("1K 256 float sum 1 0.08 0.08 0 12 0.1 0.1 0\n", r"x:1: size and count must be integers"),
        ("# only comments\n", r"x: no nccl-tests result rows"),
        ("1024 256 float sum 1 0.08 0.08 0 12 0.1 0.1 0 MSCCL:\n", r"x:1: #wrong 'MSCCL:' is not a number"),
    ],
)
def test_malformed_log_lines_name_the_line(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_log(text, "x")


def test_sweep_csv_sample_loads_and_replays() -> None:
    prof = ReplayProfiler.from_file(SWEEP)
    ring = Config(Impl("ring", "Simple"), 4, 512, 4 << 20)
    m = prof.measure(key(), 1024, ring)
    assert m.time_us == 10.8 and m.source == Source.REPLAYED
    assert prof.sizes(key(lo=1, hi=1 << 30)) == [1024, 32768, 1048576]
    # nvls rows are measured on the table's machine; on an A100 they are not valid and are dropped.
    a100 = facts_for(preset("dgx-a100-1"), 8, 1)
    k = key(lo=1048576, hi=1048576)
    space = prof.space(k, a100, build_space(Collective.ALLREDUCE, a100))
    assert {s.impl.algorithm for s in space.subspaces} == {"ring"}
    assert any("nvls" in n for n in space.notes)


def test_missing_point_is_an_error_unless_bracketed_by_measured_neighbours() -> None:
    strict = ReplayProfiler.from_file(SWEEP)
    ring = Config(Impl("ring", "Simple"), 4, 512, 4 << 20)
    with pytest.raises(ProfilerError, match=r"no point for allreduce ring/Simple/p2p 4ch .* at 4096 bytes"):
        strict.measure(key(), 4096, ring)
    with pytest.raises(ValueError, match="fallback: 'nearest' is not one of error, interpolate"):
        ReplayProfiler.from_file(SWEEP, fallback="nearest")  # another size's time is never used as is
    interp = ReplayProfiler.from_file(SWEEP, fallback="interpolate").measure(key(), 4096, ring)
    assert 10.8 < interp.time_us < 18.4 and "interpolated between measured" in interp.note


def test_searchers_only_ask_a_strict_replay_for_what_it_has(tmp_path: Path) -> None:
    """A table measured unevenly: at 64 KiB only some channel counts of some implementations."""
    header = SWEEP.read_text().splitlines()[0]
    rows = [f"allreduce,{size},{algo},{proto},{ch},1,8,-1,-1,0,0,{10 + ch / 4 + (size >> 14)}"
            for size in (16384, 65536) for algo in ("ring", "tree") for proto in ("ll", "simple")
            for ch in (1, 2, 4, 8, 16, 32) if size == 16384 or (algo == "ring" and ch in (2, 8, 32))]
    table = tmp_path / "uneven.csv"
    table.write_text("\n".join([header, *rows]) + "\n")
    prof = ReplayProfiler.from_file(table)  # fallback "error": an off-table point raises
    facts = facts_for(preset("dgx-a100-1"), 8, 1)
    full = build_space(Collective.ALLREDUCE, facts)
    k = key(lo=65536, hi=65536)
    space = prof.space(k, facts, full)
    assert len(space) == 6
    start = nearest_replayed(Collective.ALLREDUCE, 65536, nccl_default_config(Collective.ALLREDUCE, 65536, facts, full).config,
                             space, facts)
    prior = nccl_prior(Collective.ALLREDUCE, 65536, facts, space)
    for name in SEARCHERS:
        for budget in (1, 3, 20):
            result = make_searcher(name).search(space, lambda c, r: prof.measure(k, 65536, c, r).time_us, budget,
                                                seed=0, start=start, prior=prior)
            assert {t.config for t in result.trials} <= set(space), name


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("", r"empty table"),
        ("allreduce,1024,ring,simple,4,1,8,-1,-1,0.1,1,abc\n", r"t.csv:2: .*could not convert|t.csv:2"),
        ("allgatherv,1024,ring,simple,4,1,8,-1,-1,0.1,1,2\n", r"t.csv:2: collective: unknown collective 'allgatherv'"),
        ("allreduce,1024,ring,simple,4,1,8,-1,-1,0.1,1,2\nallreduce,1024,spiral,simple,4,1,8,-1,-1,0.1,1,2\n",
         r"t.csv:3: unknown NCCL algorithm 'spiral'"),
        ("allreduce,1024,ring,simple,-1,1,8,-1,-1,0.1,1,2\n", r"t.csv:2: channels must be >= 1"),
    ],
)
def test_bad_sweep_tables_name_the_line(tmp_path: Path, body: str, match: str) -> None:
    header = SWEEP.read_text().splitlines()[0]
    f = tmp_path / "t.csv"
    f.write_text(header + "\n" + body)
    with pytest.raises(ValueError, match=match):
        ReplayProfiler.from_file(f)


def test_bad_header_names_missing_columns(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("collective,size_bytes,algorithm\nallreduce,1,ring\n")
    with pytest.raises(ValueError, match=r"t.csv:1: sweep CSV header lacks column\(s\) protocol, channels"):
        ReplayProfiler.from_file(f)


def test_log_replay_chooses_between_nccl_and_msccl(tmp_path: Path) -> None:
    both = tmp_path / "both.txt"
    both.write_text(NCCL_LOG.read_text().rstrip("\n") + "\n" + MSCCL_LOG.read_text())
    topo = preset("dgx-a100-1")
    k = key(lo=128, hi=32 << 20)
    result = tune_tasks([k], topo, profiler=f"replay:{both}", collective="allreduce", ranks=8, nodes=1,
                        inplace=True, budget=5)
    by_size = {t.size: t for t in result.tasks}
    assert sorted(by_size) == [128 << i for i in range(19)]
    # In-place, MSCCL is 71.80 -> 38.08 us at 1 MiB; at 128 B the logged NCCL run is faster.
    assert by_size[1 << 20].synthesized is not None and by_size[1 << 20].chosen_measure.time_us == 38.08
    assert by_size[1 << 20].default_measure.time_us == 71.80
    assert by_size[128].synthesized is None
    assert all(t.default_measure.source == Source.REPLAYED for t in result.tasks)
    plan = by_size[1 << 20].plan_task()
    assert plan.chosen.kind == "msccl" and plan.chosen_estimates[0].source == Source.REPLAYED


def test_log_replay_needs_the_run_shape() -> None:
    with pytest.raises(ValueError, match="needs the collective, ranks and nodes"):
        ReplayProfiler.from_file(NCCL_LOG)
