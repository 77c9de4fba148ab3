"""Configuration tuning: AutoCCL / TuCCL-style search over NCCL's knobs per task key.

Entry point: `tune_tasks(tasks, topo, *, searcher, profiler, budget, seed, nccl_version)`.
"""

from .keys import make_keys, parse_collective, parse_size_range
from .tuner import SynthCandidate, TaskOutcome, TuningResult, make_profiler, tune_tasks

__all__ = [
    "SynthCandidate",
    "TaskOutcome",
    "TuningResult",
    "make_keys",
    "make_profiler",
    "parse_collective",
    "parse_size_range",
    "tune_tasks",
]
