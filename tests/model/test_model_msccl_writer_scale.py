"""The MSCCL writer at scale: lowering memory bounded by one rank's work, and connections over
msccl-executor's 64 steps per threadblock split across threadblocks (issue 18)."""

from __future__ import annotations

import subprocess
import tracemalloc
from pathlib import Path

import pytest

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.limits import MAX_STEPS
from ccltune.model.formats.msccl.reader import read_msccl
from ccltune.model.formats.msccl.writer import MscclFormatError, lower_msccl, to_msccl_xml
from ccltune.model.schedule.ir import Schedule, Transfer

CHECK_PLAN = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "check-plan"


def _swap(c: int) -> Schedule:
    """2 ranks swap c chunks one at a time, each send after the previous one: one connection
    each way with c steps that cannot become fewer."""
    s = Schedule("long", Collective.ALLGATHER, 2, c)
    for k in range(2 * c):
        s.add(Transfer(k // c, 1 - k // c, k, deps=(k - 1,) if k % c else ()))
    return s


def _chained_reducescatter(n: int) -> Schedule:
    """Ring reduce-scatter whose transfers form one chain (each waits for the one before, as
    FIFO queue edges chain a synthesized schedule): every transfer is an ancestor of every
    later one, on every rank."""
    s = Schedule("chain", Collective.REDUCESCATTER, n, 1)
    prev = -1
    for k in range(n):
        for i in range(n - 1):
            src, dst = (k + i + 1) % n, (k + i + 2) % n
            prev = s.add(Transfer(src, dst, k, reduce=True, deps=(prev,) if prev >= 0 else ()))
    return s


def test_a_connection_over_the_step_limit_is_split_across_threadblocks() -> None:
    low = lower_msccl(_swap(100))
    assert low.max_steps <= MAX_STEPS
    # Each direction: the same peers on channel 0 and on channel 1 (0 + 1 x channels used).
    assert sorted(low.tb_meta[0]) == [(-1, 1, 0), (-1, 1, 1), (1, -1, 0), (1, -1, 1)]
    # The schedule's own channel count (as the engine passes it) widens to the split's.
    xml = to_msccl_xml(_swap(100), name="split", proto="Simple", nchannels=1)
    assert ' nchannels="2" ' in xml.split("\n", 1)[0]
    back = read_msccl(xml)  # runs it as the executor does (no deadlock) and proves the data
    assert len(back.schedule.transfers) == 200
    assert list(back.threadblocks) == [4, 4]
    # Consecutive: the first threadblock sends chunks 0-49, the second 50-99, in order.
    tb_of = {int(t.chunk): int(tb) for t, tb in zip(back.schedule.transfers, back.send_tb,
                                                    strict=True) if t.src == 0}  # fmt: skip
    first = {tb_of[k] for k in range(50)}
    assert len(first) == 1 and first.isdisjoint(tb_of[k] for k in range(50, 100))


def test_splitting_stops_at_the_sm_budget_and_the_step_limit_is_reported() -> None:
    with pytest.raises(MscclFormatError, match=r"tb \d+ needs 10\d steps; the executor allows 64"):
        to_msccl_xml(_swap(100), name="x", proto="Simple", max_threadblocks=2)
    # An executor built for more steps needs no split.
    low = lower_msccl(_swap(100), max_steps=128)
    assert (low.threadblocks, low.channels_used) == (2, 1) and low.max_steps > MAX_STEPS


def test_nothing_is_split_under_the_step_limit() -> None:
    low = lower_msccl(_swap(60))
    assert low.threadblocks == 2 and low.channels_used == 1


def test_lowering_memory_is_bounded_by_one_ranks_memo() -> None:
    """A dense DAG (every earlier transfer an ancestor): nearest ancestors memoised over every
    (transfer, rank) pair took 39 MB traced at 48 ranks and grow as transfers x ranks (the
    3-tier 128-GPU ReduceScatter passed 6 GB); per rank it is 10 MB here."""
    s = _chained_reducescatter(48)
    tracemalloc.start()
    try:
        low = lower_msccl(s)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert low.max_steps <= MAX_STEPS
    assert peak < 20e6, f"{peak / 1e6:.1f} MB traced"
    read_msccl(to_msccl_xml(s, name="chain", proto="Simple"))


def test_split_files_load_and_are_selected_by_the_executor(tmp_path: Path) -> None:
    """msccl-executor-nccl's own parser (MSCCL_MAX_NUM_STEPS 64) and selection rule on files
    whose connections were split: 3 parts of a 128-step stream, and a chained ReduceScatter."""
    assert CHECK_PLAN.exists(), f"conformance kit missing at {CHECK_PLAN}"
    files = tmp_path / "msccl"
    files.mkdir()
    for name, s, lo in (("a-swap", _swap(128), 1 << 20),
                        ("b-chain", _chained_reducescatter(48), 48 << 16)):  # fmt: skip
        assert lower_msccl(s, max_steps=1 << 20).max_steps > MAX_STEPS  # split is needed
        (files / f"{name}.xml").write_text(to_msccl_xml(s, name=name, proto="Simple",
                                                        min_bytes=lo, max_bytes=lo * 16))  # fmt: skip
    p = subprocess.run([str(CHECK_PLAN), str(tmp_path)], capture_output=True, text=True,
                       timeout=900)  # fmt: skip
    assert p.returncode != 2, p.stdout + p.stderr  # the kit could not run: nothing was checked
    assert p.returncode == 0, p.stdout
    assert p.stdout.count("PASS msccl/") == 4, p.stdout
