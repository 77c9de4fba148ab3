"""A tuned table through the conformance kit's tuner harness (NCCL 2.30's calling convention and
its rules for which algorithm/protocol cells NCCL offers): every row is picked as written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tuner_plugin_abi import REPO, build

from ccltune.api.plan import TaskKey
from ccltune.topology.presets import load_preset
from ccltune.tune.table import TABLE_ENV, TABLE_FILE, parse_table
from ccltune.tune.tuner import tune_tasks

KIT = REPO.parent / "shared" / "conformance"


@pytest.fixture(scope="module")
def harness() -> Path:
    if not (KIT / "build").exists():
        pytest.skip(f"conformance kit not at {KIT}")
    p = subprocess.run([str(KIT / "build"), "--quiet"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return Path(p.stdout.strip().splitlines()[-1]) / "tuner_harness"


@pytest.mark.parametrize("abi", ["6", "5"])
def test_every_tuned_row_is_what_nccls_calling_convention_gets(harness, tmp_path, abi) -> None:
    keys = [TaskKey(collective=c, min_bytes=1024, max_bytes=1 << 30, ranks=16, nodes=2) for c in
            ("allreduce", "allgather", "reducescatter")]
    result = tune_tasks(keys, load_preset("dgx-h100-2"), budget=40)
    text = result.files[TABLE_FILE]
    (tmp_path / TABLE_FILE).write_text(text)
    table = parse_table(text)
    assert table.rows
    so, _ = build(tmp_path / "build")
    queries, want = [], []
    for r in table.rows:
        for size in (r.min_bytes, (r.min_bytes + r.max_bytes) // 2, r.max_bytes):
            queries.append(f"{r.collective} {size}")
            want.append(f"{r.collective} {size} 0 {r.algorithm} {r.protocol} {table.clamp(r.algorithm, r.channels)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "CCLTUNE_"))}
    env[TABLE_ENV] = str(tmp_path / TABLE_FILE)
    args = [str(harness), *(["-5"] if abi == "5" else []), str(so), "16", "2"]
    p = subprocess.run(args, input="\n".join(queries) + "\n", capture_output=True, text=True, env=env, check=True)
    assert p.stdout.splitlines() == want


def test_without_nvls_the_fallback_row_or_nccl_decides(harness, tmp_path) -> None:
    """The harness's -N: a machine (or data type) where NCCL offers no NVLS cell."""
    keys = [TaskKey(collective="allgather", min_bytes=32 << 20, max_bytes=1 << 30, ranks=8, nodes=1)]
    text = tune_tasks(keys, load_preset("dgx-h100-1"), budget=60).files[TABLE_FILE]
    (tmp_path / TABLE_FILE).write_text(text)
    table = parse_table(text)
    assert any(r.algorithm == "nvls" for r in table.rows)
    so, _ = build(tmp_path / "build")
    queries, want = [], []
    offered = {("ring", p): 1.0 for p in ("ll", "ll128", "simple")}  # allgather, 8 GPUs on 1 node, no NVLS
    for r in table.rows:
        size = (r.min_bytes + r.max_bytes) // 2
        m = table.lookup("allgather", size, 8, 1, offered)
        queries.append(f"allgather {size}")
        want.append(f"allgather {size} 0 " + (f"{m.algorithm} {m.protocol} {m.channels}" if m else "- - 0"))
    assert any(" ring " in w for w, r in zip(want, table.rows, strict=True) if r.algorithm == "nvls")  # a fallback
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "CCLTUNE_"))}
    env[TABLE_ENV] = str(tmp_path / TABLE_FILE)
    p = subprocess.run([str(harness), "-N", str(so), "8", "1"], input="\n".join(queries) + "\n",
                       capture_output=True, text=True, env=env, check=True)
    assert p.stdout.splitlines() == want
    assert all(" nvls " not in line for line in p.stdout.splitlines())
