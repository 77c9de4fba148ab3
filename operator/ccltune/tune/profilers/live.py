"""`live`: run nccl-tests with the trial's NCCL environment and read its result table.

This is what tuning Jobs run on GPU nodes. `launcher` is the prefix that starts one process per GPU
of the communicator (e.g. `mpirun -np 16 --hostfile h -x NCCL_ALGO ...` or `srun -n 16`); the
trial's variables are passed in the child environment, so a launcher must forward them (mpirun:
`-x VAR`; srun forwards the environment by default). `runner` is injectable for tests.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ...api.common import Collective, Source
from ...api.plan import TaskKey
from ..fabric import FabricFacts
from ..space import Config, TaskSpace
from .base import Measurement, ProfilerError
from .nccltests import command, parse_log, trial_env

# (argv, env, timeout seconds) -> (exit code, stdout, stderr)
Runner = Callable[[Sequence[str], Mapping[str, str], float], tuple[int, str, str]]


def subprocess_runner(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
    try:
        done = subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise ProfilerError(f"live: {argv[0]!r} not found (install nccl-tests or set the binary directory)") from None
    except subprocess.TimeoutExpired:
        raise ProfilerError(f"live: {' '.join(argv)} did not finish within {timeout:.0f} s") from None
    return done.returncode, done.stdout, done.stderr


@dataclass
class LiveProfiler:
    launcher: list[str] = field(default_factory=list)
    bindir: str = ""
    iters: int = 20
    warmup: int = 5
    timeout_s: float = 600.0
    inplace: bool = False
    base_env: dict[str, str] | None = None
    runner: Runner = subprocess_runner
    name: str = "live"
    source: Source = Source.MEASURED

    def space(self, key: TaskKey, facts: FabricFacts, full: TaskSpace) -> TaskSpace:
        return full

    def plan(self, key: TaskKey, size: int, config: Config) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of one trial run."""
        base = dict(os.environ) if self.base_env is None else dict(self.base_env)
        env = trial_env(config, base)
        argv = command(Collective(key.collective), size, launcher=self.launcher, bindir=self.bindir,
                       iters=self.iters, warmup=self.warmup)
        return argv, env

    def measure(self, key: TaskKey, size: int, config: Config, reps: int = 1) -> Measurement:
        argv, env = self.plan(key, size, config)
        times = []
        for _ in range(reps):
            code, out, err = self.runner(argv, env, self.timeout_s)
            if code != 0:
                tail = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
                raise ProfilerError(f"live: {' '.join(argv)} exited with {code}: {tail}")
            rows = [r for rows in parse_log(out, argv[len(self.launcher)]).sections.values() for r in rows]
            row = next((r for r in rows if r.size == size), None)
            if row is None:
                raise ProfilerError(f"live: the run printed no row for {size} bytes")
            times.append(row.inplace_time_us if self.inplace else row.time_us)
        return Measurement(sum(times) / len(times), self.source, reps)


__all__ = ["LiveProfiler", "Runner", "subprocess_runner"]
