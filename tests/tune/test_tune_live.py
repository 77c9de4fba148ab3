"""live: command line and environment of a trial, parsed on real nccl-tests output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from tune_helpers import DATA

from ccltune.api.common import Source
from ccltune.api.plan import TaskKey
from ccltune.tune.profilers.base import ProfilerError
from ccltune.tune.profilers.live import LiveProfiler
from ccltune.tune.profilers.nccltests import command, trial_env
from ccltune.tune.space import Config, Impl

LOG = (Path(DATA) / "ndv4-1x8-allreduce-nccl.txt").read_text()
KEY = TaskKey(collective="allreduce", min_bytes=1 << 20, max_bytes=(2 << 20) - 1, ranks=8, nodes=1)


def test_command_line() -> None:
    argv = command(KEY.collective, 1 << 20, launcher=["mpirun", "-np", "8"], bindir="/opt/nccl-tests/build/")
    assert argv == ["mpirun", "-np", "8", "/opt/nccl-tests/build/all_reduce_perf", "-b", "1048576", "-e",
                    "1048576", "-f", "2", "-g", "1", "-n", "20", "-w", "5", "-c", "0", "-d", "float", "-o", "sum"]
    assert command("allgather", 4096)[0] == "all_gather_perf" and "-o" not in command("allgather", 4096)


def test_trial_env_pins_the_configuration() -> None:
    env = trial_env(Config(Impl("nvls_tree", "Simple"), 16, 256, 1 << 21), {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "NCCL_ALGO": "nvlstree", "NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": "16",
                   "NCCL_MAX_NCHANNELS": "16", "NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "2097152",
                   "NCCL_P2P_LEVEL": "SYS"}
    ll128 = trial_env(Config(Impl("ring", "LL128", "shm"), 4, 640, 4 << 20))
    assert ll128["NCCL_LL128_NTHREADS"] == "640" and "NCCL_NTHREADS" not in ll128
    assert ll128["NCCL_P2P_DISABLE"] == "1" and "NCCL_BUFFSIZE" not in ll128


def test_live_measure_parses_real_output() -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []

    def runner(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
        calls.append((list(argv), dict(env)))
        return 0, LOG, ""

    prof = LiveProfiler(launcher=["srun", "-n", "8"], base_env={}, runner=runner)
    m = prof.measure(KEY, 1 << 20, Config(Impl("ring", "LL"), 8, 512, 4 << 20), reps=2)
    assert m.time_us == 71.85 and m.source == Source.MEASURED and m.reps == 2
    assert len(calls) == 2 and calls[0][1]["NCCL_ALGO"] == "ring" and calls[0][0][:3] == ["srun", "-n", "8"]
    inplace = LiveProfiler(base_env={}, runner=runner, inplace=True).measure(KEY, 1 << 20, Config(Impl("ring", "LL"), 8, 512, 4 << 20))
    assert inplace.time_us == 71.80


def test_live_failures_are_clear() -> None:
    cfg = Config(Impl("ring", "Simple"), 8, 512, 4 << 20)
    bad = LiveProfiler(base_env={}, runner=lambda a, e, t: (1, "", "NCCL WARN bad\nsegfault"))
    with pytest.raises(ProfilerError, match="exited with 1: segfault"):
        bad.measure(KEY, 1 << 20, cfg)
    missing = LiveProfiler(base_env={}, runner=lambda a, e, t: (0, LOG, ""))
    with pytest.raises(ProfilerError, match="no row for 3000 bytes"):
        missing.measure(KEY, 3000, cfg)
    garbled = LiveProfiler(base_env={}, runner=lambda a, e, t: (0, "1024 256 float\n", ""))
    with pytest.raises(ValueError, match="all_reduce_perf:1: malformed"):
        garbled.measure(KEY, 1024, cfg)
