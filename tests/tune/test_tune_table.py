"""The tuner table tuning writes for ccltune's plugin, and process-wide knobs that slow no task."""

from __future__ import annotations

import functools

import pytest
from tune_helpers import preset

from ccltune.api.plan import TaskKey
from ccltune.tune.keys import make_keys
from ccltune.tune.space import Config, Impl
from ccltune.tune.table import (
    ALGORITHMS,
    PROTOCOLS,
    TABLE_FILE,
    TableError,
    TableRow,
    parse_table,
    render_table,
    table_rows,
)
from ccltune.tune.tuner import TuningResult, tune_tasks

ALL = {(a, p): 1.0 for a in ALGORITHMS for p in PROTOCOLS}
PROTO = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}


@functools.cache
def dgx_h100_2() -> TuningResult:
    """The issue's example: `ccltune tune --cluster dgx-h100-2 --collective allreduce,allgather`."""
    keys = [TaskKey(collective=c, min_bytes=1024, max_bytes=1 << 30, ranks=16, nodes=2) for c in
            ("allreduce", "allgather")]
    return tune_tasks(keys, preset("dgx-h100-2"))


def test_no_task_is_predicted_slower_than_nccls_default() -> None:
    result = dgx_h100_2()
    slower = [t.key.label() for t in result.tasks if t.chosen_measure.time_us > t.default_measure.time_us]
    assert not slower
    # 512K buffers were the geometric-mean winner that slowed 512M-1G allgather to 0.94x.
    assert result.env.get("NCCL_BUFFSIZE") != "524288"


def test_knobs_that_would_slow_a_task_are_named() -> None:
    result = dgx_h100_2()
    note = next(n for n in result.notes if "best geometric mean but would run" in n)
    assert "allgather/world/16r2n/536870912-1073741823" in note and "NCCL_BUFFSIZE 524288" in note
    loser = next(t for t in result.tasks if t.key.label() == "allgather/world/16r2n/536870912-1073741823")
    assert any("process-wide knobs left at" in n for n in loser.notes)


def test_every_pinned_bucket_is_realized_by_its_row_and_the_rest_by_nccl() -> None:
    result = dgx_h100_2()
    table = parse_table(result.files[TABLE_FILE])
    assert table.nvls_channels == 16  # H100: NVLS_NCHANNELS_SM90
    for t in result.tasks:
        choice = t.choice()
        for size in (t.key.min_bytes, t.key.max_bytes):
            match = table.lookup(str(t.key.collective), size, t.key.ranks, t.key.nodes, ALL)
            if t.kept_default:
                assert match is None and choice.realized_by == "NCCL default", t.key.label()
                continue
            assert t.deployed is not None and match is not None, t.key.label()
            assert choice.realized_by == f"tuner row {match.row}"
            assert (match.algorithm, match.protocol, match.channels) == (
                t.deployed.impl.algorithm, PROTO[t.deployed.impl.protocol], t.deployed.channels)
    by_key = result.plan_tasks_by_key()
    assert all(e.choice and e.choice.realized_by for p in by_key for e in p.chosen_estimates)
    assert all(p.default.realized_by == "NCCL default" for p in by_key)


def test_nvls_estimates_are_for_the_channels_nccl_builds() -> None:
    for t in dgx_h100_2().tasks:
        if t.deployed is not None and t.deployed.impl.algorithm in ("nvls", "nvls_tree"):
            assert t.deployed.channels <= 16, t.key.label()


def _cfg(algo: str, proto: str, channels: int) -> Config:
    return Config(Impl(algo, proto), channels, 512, 4 << 20)


def test_rows_merge_neighbours_and_leave_gaps_to_nccl() -> None:
    keys = make_keys(["allreduce"], 1024, 8191, ranks=8, nodes=1)  # 1K-2K-1, 2K-4K-1, 4K-8K-1
    built = table_rows([(keys[0], _cfg("ring", "LL", 4)), (keys[1], _cfg("ring", "LL", 4)),
                        (keys[2], _cfg("tree", "Simple", 8))], "hopper")
    assert [r.line() for r in built.rows] == ["allreduce 1024 4095 8 1 ring ll 4 -",
                                              "allreduce 4096 8191 8 1 tree simple 8 -"]
    assert [built.row_of[k.label()] for k in keys] == [1, 1, 2]
    table = parse_table(render_table(built.rows, nvls=built.nvls))
    assert table.lookup("allreduce", 1023, 8, 1, ALL) is None  # below the tuned range: NCCL decides
    assert table.lookup("allreduce", 8192, 8, 1, ALL) is None


def test_a_second_role_of_the_same_shape_keeps_the_first_row_and_says_so() -> None:
    tp = make_keys(["allreduce"], 1024, 4095, ranks=8, nodes=1, role="tp")
    dp = make_keys(["allreduce"], 2048, 8191, ranks=8, nodes=1, role="dp")
    built = table_rows([(k, _cfg("ring", "LL", 2)) for k in tp] + [(k, _cfg("tree", "LL128", 6)) for k in dp],
                       "ampere")
    table = parse_table(render_table(built.rows))
    assert table.lookup("allreduce", 3000, 8, 1, ALL).algorithm == "ring"  # type: ignore[union-attr]
    assert table.lookup("allreduce", 5000, 8, 1, ALL).algorithm == "tree"  # type: ignore[union-attr]
    assert any("another role of the same shape" in n for n in built.notes)


def test_nvls_rows_are_clamped_per_arch_and_nodes() -> None:
    key = make_keys(["allreduce"], 1 << 20, 1 << 20, ranks=8, nodes=1)[0]
    built = table_rows([(key, _cfg("nvls", "Simple", 32))], "blackwell")
    assert built.rows[0].channels == 24 and built.nvls == 24  # NVLS_NCHANNELS_SM100_NVL, one node
    assert "runs 24 on blackwell" in built.notes[0]


def test_render_refuses_what_the_plugin_would_refuse() -> None:
    with pytest.raises(TableError, match="overlap"):
        render_table([TableRow("allreduce", 0, 100, 8, 1, "ring", "ll", 1),
                      TableRow("allreduce", 50, 200, 8, 1, "ring", "ll", 1)])
    with pytest.raises(TableError, match="channels"):
        render_table([TableRow("allreduce", 0, 100, 8, 1, "ring", "ll", 65)])


@functools.cache
def nvls_allgather() -> TuningResult:
    keys = [TaskKey(collective="allgather", min_bytes=32 << 20, max_bytes=1 << 30, ranks=8, nodes=1)]
    return tune_tasks(keys, preset("dgx-h100-1"), budget=60)


def test_nvls_rows_carry_a_ring_or_tree_fallback_no_slower_than_nccl() -> None:
    result = nvls_allgather()
    table = parse_table(result.files[TABLE_FILE])
    no_nvls = {k: v for k, v in ALL.items() if not k[0].startswith("nvls")}
    fell = 0
    for t in result.tasks:
        if t.kept_default or t.deployed is None or t.deployed.impl.algorithm != "nvls":
            continue
        first = table.lookup("allgather", t.key.min_bytes, 8, 1, ALL)
        assert first is not None and first.algorithm == "nvls"
        second = table.lookup("allgather", t.key.min_bytes, 8, 1, no_nvls)
        note = next((n for n in t.notes if n.startswith("fallback row when NCCL does not offer nvls")), None)
        if second is None:
            assert note is None  # no fallback: NCCL decides when NVLS is refused
            continue
        fell += 1
        assert second.row == first.row + 1 and second.algorithm in ("ring", "tree")
        assert note is not None and float(note.rsplit(", ", 1)[1].split("x")[0]) >= 1.0
    assert fell >= 1
