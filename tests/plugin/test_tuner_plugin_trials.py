"""Trial mode (CCLTUNE_TRIALS): the plugin switches configuration per call along nccl-tests' call
sequence, the same on every rank (docs/live-tuning.md, "Next step: trial mode")."""

from __future__ import annotations

from pathlib import Path

import pytest
from tuner_plugin_abi import ALGORITHMS, PROTOCOLS, Log, Plugin, build, cost_table

TRIALS_ENV = "CCLTUNE_TRIALS"
ALL = {(a, p): 10.0 + i for i, (a, p) in enumerate((a, p) for a in ALGORITHMS for p in PROTOCOLS)}
WARN = 2


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Log]:
    so, shim = build(tmp_path_factory.mktemp("plugin"))
    return so, Log(shim)


def _open(built: tuple[Path, Log], monkeypatch: pytest.MonkeyPatch, trials: str, version: int = 6) -> Plugin:
    so, log = built
    monkeypatch.setenv(TRIALS_ENV, trials)
    monkeypatch.delenv("CCLTUNE_TUNER_TABLE", raising=False)
    log.reset()
    return Plugin(so, log, version, 16, 2)


@pytest.mark.parametrize("version", (6, 5, 3))
def test_entries_follow_the_call_count(built, monkeypatch, version) -> None:
    # nccl-tests -w 2 -n 3 -c 0 over 2 sizes: 2w warm-up calls, then 2 x 2 x (1 + 3) calls per cycle.
    warmup, period = 4, 16
    entries = [("ring", "ll", 2), ("tree", "simple", 8), ("nvls", "simple", 32)]
    text = f"warmup={warmup};period={period};" + ",".join(f"{a}/{p}/{c}" for a, p, c in entries)
    ranks = [_open(built, monkeypatch, text, version) for _ in range(2)]  # two communicators, same calls
    for call in range(warmup + period * len(entries) + 3):
        got = [r.query("allreduce", 1 << 20, ALL) for r in ranks]
        assert got[0] == got[1]  # every rank picks the same entry for the same call
        k = 0 if call < warmup else (call - warmup) // period
        if k < len(entries):
            assert (got[0].algorithm, got[0].protocol, got[0].channels) == entries[k], call
        else:  # past the table: NCCL's own choice, nothing touched
            assert got[0].algorithm is None and got[0].table == cost_table(ALL)
    for r in ranks:
        r.close()


def test_an_entry_nccl_cannot_run_is_left_to_nccl_and_named_once_per_size(built, monkeypatch) -> None:
    plugin = _open(built, monkeypatch, "warmup=0;period=5;nvls/simple/16,ring/ll/4")
    offered = {k: v for k, v in ALL.items() if k[0] != "nvls"}  # NCCL marks NVLS unusable here
    for size in (4096, 4096, 4096, 8192, 8192):  # entry 0's cycle: two sizes, several calls each
        got = plugin.query("allreduce", size, offered)
        assert got.algorithm is None and got.table == cost_table(offered)
    warns = [line for level, line in built[1].lines() if level == WARN]
    assert warns == ["ccltune trial 0 unusable at 4096 bytes", "ccltune trial 0 unusable at 8192 bytes"]
    second = plugin.query("allreduce", 4096, offered)
    assert (second.algorithm, second.protocol, second.channels) == ("ring", "ll", 4)
    plugin.close()


@pytest.mark.parametrize("text", ["warmup=1", "warmup=1;period=0;ring/ll/2", "warmup=1;period=2;",
                                  "warmup=1;period=2;ring/ll", "warmup=1;period=2;spiral/ll/2",
                                  "warmup=1;period=2;ring/ll/65", "warmup=x;period=2;ring/ll/2"])
def test_a_bad_trial_list_disables_the_plugin(built, monkeypatch, text) -> None:
    plugin = _open(built, monkeypatch, text)
    got = plugin.query("allreduce", 4096, ALL)
    assert got.algorithm is None and got.table == cost_table(ALL)
    assert any(level == WARN and "CCLTUNE_TRIALS" in line for level, line in built[1].lines())
    plugin.close()
