"""The emitted tuner CSV, read back by an independent reader that follows NCCL's example plugin:
'#' lines are comments, fields are comma separated and trimmed, byte bounds are inclusive,
-1 in nNodes/nRanks/numPipeOps/regBuff matches anything, the first matching row wins, and a call
no row matches gets one channel."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from tune_helpers import preset

from ccltune.api.common import Collective
from ccltune.api.plan import TaskKey
from ccltune.tune.emit import (
    SIZE_MAX,
    TunerRow,
    check_process_wide,
    merge_rows,
    render_nccl_conf,
    render_tuner_csv,
    tuner_rows,
)
from ccltune.tune.keys import make_keys
from ccltune.tune.space import Config, Impl
from ccltune.tune.tuner import tune_tasks


def read_rows(text: str) -> list[dict[str, Any]]:
    rows = []
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        assert 8 <= len(fields) <= 10, line
        assert len(line) < 256, line
        rows.append({
            "coll": fields[0], "lo": int(fields[1]), "hi": int(fields[2]), "algo": fields[3],
            "proto": fields[4], "channels": int(fields[5]), "nodes": int(fields[6]), "ranks": int(fields[7]),
            "pipe": int(fields[8]) if len(fields) > 8 else -1, "reg": int(fields[9]) if len(fields) > 9 else -1,
        })  # fmt: skip
    return rows


def lookup(rows, coll: str, nbytes: int, nodes: int, ranks: int, pipe: int = 1, reg: int = 0):
    for r in rows:
        if (r["coll"] == coll and r["lo"] <= nbytes <= r["hi"] and r["nodes"] in (-1, nodes)
                and r["ranks"] in (-1, ranks) and r["pipe"] in (-1, pipe) and r["reg"] in (-1, reg)):
            return r["algo"], r["proto"], r["channels"]
    return None, None, 1  # the example plugin's behaviour when nothing matches


PROTO = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}


@pytest.fixture(scope="module")
def tuned():
    topo = preset("dgx-h100-2")
    keys = make_keys(["allreduce", "allgather", "broadcast"], 4096, 64 << 20, ranks=16, nodes=2, factor=4)
    keys += make_keys(["allreduce"], 4096, 64 << 20, ranks=8, nodes=1, role="tp", factor=4)
    return tune_tasks(keys, topo, budget=25, seed=3)


def test_csv_selects_the_intended_row_for_every_key(tuned) -> None:
    rows = read_rows(tuned.tuner_csv)
    rng = random.Random(0)
    for t in tuned.tasks:
        k, cfg = t.key, t.deployed
        want = (cfg.impl.algorithm, PROTO[cfg.impl.protocol], cfg.channels)
        for nbytes in {k.min_bytes, k.max_bytes, rng.randint(k.min_bytes, k.max_bytes)}:
            assert lookup(rows, str(k.collective), nbytes, k.nodes, k.ranks) == want, (k.label(), nbytes)


def test_csv_covers_every_size_and_never_uses_minus_one_channels(tuned) -> None:
    rows = read_rows(tuned.tuner_csv)
    assert all(r["channels"] >= 1 for r in rows)
    shapes = {(r["coll"], r["nodes"], r["ranks"]) for r in rows}
    assert shapes == {("allreduce", 2, 16), ("allgather", 2, 16), ("broadcast", 2, 16), ("allreduce", 1, 8)}
    for coll, nodes, ranks in shapes:
        mine = [r for r in rows if (r["coll"], r["nodes"], r["ranks"]) == (coll, nodes, ranks)]
        assert mine[0]["lo"] == 0 and mine[-1]["hi"] == SIZE_MAX
        for a, b in itertools.pairwise(mine):
            assert b["lo"] == a["hi"] + 1  # no gap, no overlap
            assert (a["algo"], a["proto"], a["channels"]) != (b["algo"], b["proto"], b["channels"])  # merged


def test_rows_merge_and_cover() -> None:
    ring = Config(Impl("ring", "LL"), 4, 512, 4 << 20)
    tree = Config(Impl("tree", "Simple"), 8, 512, 4 << 20)
    k = [TaskKey(collective="allreduce", min_bytes=lo, max_bytes=hi, ranks=8, nodes=1)
         for lo, hi in ((1024, 2047), (2048, 4095), (8192, 16383))]
    rows, notes = tuner_rows([(k[0], ring), (k[1], ring), (k[2], tree)])
    assert [(r.min_bytes, r.max_bytes, r.algorithm) for r in rows] == [(0, 8191, "ring"), (8192, SIZE_MAX, "tree")]
    assert not notes
    # Two roles with the same shape cannot be told apart by the plugin: the first row wins, noted.
    dp = k[0].model_copy(update={"role": "dp"})
    rows, notes = tuner_rows([(k[0], ring), (dp, tree)])
    assert len(rows) == 1 and rows[0].algorithm == "tree" and "shadowed" in notes[0]  # roles sort: dp < world
    assert merge_rows([]) == []
    with pytest.raises(ValueError, match="channels must be >= 1"):
        render_tuner_csv([TunerRow("allreduce", 0, 1, "ring", "ll", -1, 1, 8)])


def test_alltoall_has_no_tuner_rows() -> None:
    k = TaskKey(collective=Collective.ALLTOALL, min_bytes=1, max_bytes=10, ranks=8, nodes=1)
    rows, _ = tuner_rows([(k, Config(Impl("p2p", "Simple"), 32, 512, 4 << 20))])
    assert rows == []


def test_process_wide_settings_never_restrict_per_call_choices() -> None:
    check_process_wide({"NCCL_BUFFSIZE": "8388608"})
    with pytest.raises(AssertionError, match="NCCL_ALGO"):
        check_process_wide({"NCCL_ALGO": "ring"})
    with pytest.raises(AssertionError, match="LL128"):
        check_process_wide({"NCCL_X": "Simple,ll128"})
    with pytest.raises(AssertionError, match="NCCL_PROTO"):
        render_nccl_conf({"NCCL_PROTO": "Simple"})


def test_nccl_conf_lines(tuned) -> None:
    text = tuned.nccl_conf
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    env = dict(ln.split("=", 1) for ln in lines)
    assert env == tuned.env and not {"NCCL_ALGO", "NCCL_PROTO"} & env.keys()
    with pytest.raises(ValueError, match="one KEY=VALUE line"):
        render_nccl_conf({"NCCL_X": "a\nb"})
