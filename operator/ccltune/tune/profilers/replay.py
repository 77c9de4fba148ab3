"""`replay`: measurements from a table instead of a machine.

Inputs:
- NCCL's sweep CSV (`collective,size_bytes,algorithm,protocol,channels,nodes,ranks,pipeOps,
  regBuff,cost_metric,bandwidth_gbps,latency_us`, the input of the example tuner plugin's
  scripts/optimize_config.py). `latency_us` is taken as the time of one call; rows repeating a
  (configuration, size) are averaged. Threads/buffer size are NCCL's defaults in such a sweep.
- nccl-tests logs. A log carries no configuration: its `NCCL:` (or unnamed) section is NCCL's
  own choice, every other section (e.g. `MSCCL:`) a synthesized schedule to choose against.

Schema extension (docs/tuning.md, "Replay tables"): optional columns `instances` (default 1),
`threads` and `buffsize` (default NCCL's); an `algorithm` of `msccl:<schedule>` keys an MSCCL
schedule variant (schedule x protocol x channels x instances). Such rows join the search space
only for runtimes that run MSCCL (`runtime`); otherwise they are left out with a note.

Missing points stay missing. A `latency_us` of "", nan, inf, timeout, failed, n/a or "-" records a
point that was tried and did not finish (a timed-out trial): it is never replaced by any number.
A point not in the table is an error (and the configuration is not offered to the searchers at
that size) unless `interpolate` is chosen: log-log interpolation in size between the two measured
neighbours of the same configuration that bracket the size, with no timed-out point between them;
the measurement then says so in its note. Nothing is extrapolated and no other size's time is
ever used as is.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...api.common import Collective, Source
from ...api.errors import InputError
from ...api.plan import TaskKey
from ...model.cost.protocols import canonical_algorithm, canonical_protocol
from ..fabric import FabricFacts
from ..keys import parse_collective
from ..space import (
    DEFAULT_BUFFSIZE,
    DEFAULT_THREADS,
    LL128_THREADS,
    MSCCL_RUNTIMES,
    Config,
    Impl,
    Subspace,
    TaskSpace,
    check_config,
    invalid_reason,
    is_msccl,
    msccl_algorithm,
)
from .base import Measurement, ProfilerError
from .nccltests import log_collective, log_shape, parse_log

Fallback = Literal["error", "interpolate"]
FALLBACKS: tuple[str, ...] = ("error", "interpolate")
MISSING_MARKS = frozenset({"", "nan", "inf", "timeout", "timed-out", "timedout", "failed", "n/a", "-"})
OPTIONAL_COLUMNS = ("instances", "threads", "buffsize")
SWEEP_COLUMNS = ("collective", "size_bytes", "algorithm", "protocol", "channels", "nodes", "ranks",
                 "cost_metric", "bandwidth_gbps", "latency_us")  # fmt: skip
Group = tuple[Collective, int, int]  # collective, nodes, ranks
Series = dict[int, float]  # size -> time_us


def _group(key: TaskKey) -> Group:
    return (Collective(key.collective), key.nodes, key.ranks)


def _lookup(series: Series, size: int, fallback: str, what: str, missing: frozenset[int] = frozenset()) -> tuple[float, str]:
    """The time at `size`, measured or interpolated between measured neighbours; ProfilerError
    when the point is missing (timed out, or not measured and not bracketed)."""
    if size in missing:
        raise ProfilerError(f"replay table: {what} at {size} bytes timed out or failed; the point is missing")
    if size in series:
        return series[size], ""
    known = ", ".join(str(s) for s in sorted(series)[:8])
    if fallback == "error" or not series:
        raise ProfilerError(
            f"replay table has no point for {what} at {size} bytes (measured sizes: {known or 'none'}); "
            "--fallback interpolate fills gaps between measured neighbours"
        )
    sizes = sorted(series)
    i = bisect.bisect_left(sizes, size)
    if not 0 < i < len(sizes):
        raise ProfilerError(f"replay table: {what} at {size} bytes is outside the measured sizes "
                            f"({sizes[0]}..{sizes[-1]}); nothing is extrapolated")
    lo, hi = sizes[i - 1], sizes[i]
    if any(lo < m < hi for m in missing):
        raise ProfilerError(f"replay table: {what} timed out between {lo} and {hi} bytes; "
                            f"{size} bytes is not interpolated across it")
    w = (math.log(size) - math.log(lo)) / (math.log(hi) - math.log(lo))
    t = math.exp((1 - w) * math.log(series[lo]) + w * math.log(series[hi]))
    return t, f"interpolated between measured {lo} and {hi} bytes"


@dataclass
class ReplayProfiler:
    fallback: str = "error"
    inplace: bool = False
    name: str = "replay"
    source: Source = Source.REPLAYED
    runtime: str = "nccl"  # MSCCL variant rows join the space only for runtimes that run MSCCL
    table: dict[Group, dict[Config, Series]] = field(default_factory=dict)
    missing: dict[Group, dict[Config, set[int]]] = field(default_factory=dict)  # timed-out points
    defaults: dict[Group, Series] = field(default_factory=dict)
    synthesized: dict[Group, dict[str, Series]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise InputError(f"fallback: {self.fallback!r} is not one of {', '.join(FALLBACKS)}")

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def from_file(
        cls,
        path: str | Path,
        *,
        collective: Collective | str | None = None,
        ranks: int | None = None,
        nodes: int | None = None,
        fallback: str = "error",
        inplace: bool = False,
        runtime: str = "nccl",
    ) -> ReplayProfiler:
        p = Path(path)
        if not p.exists():
            raise InputError(f"replay: {p}: no such file")
        prof = cls(fallback=fallback, inplace=inplace, runtime=runtime)
        prof.add_file(p, collective=collective, ranks=ranks, nodes=nodes)
        return prof

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        collective: Collective | str | None = None,
        ranks: int | None = None,
        nodes: int | None = None,
        fallback: str = "error",
        inplace: bool = False,
        runtime: str = "nccl",
    ) -> ReplayProfiler:
        """Measured profiles: every *.csv (sweep schema) and *.log / *.txt (nccl-tests) in a
        directory. Their numbers are labelled measured (they come from real runs)."""
        d = Path(path)
        if not d.is_dir():
            raise InputError(f"--profiles: {d} is not a directory")
        files = sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in (".csv", ".log", ".txt"))
        if not files:
            raise InputError(f"--profiles: {d} holds no .csv, .log or .txt profile")
        prof = cls(fallback=fallback, inplace=inplace, runtime=runtime, name="profiles", source=Source.MEASURED)
        for f in files:
            prof.add_file(f, collective=collective, ranks=ranks, nodes=nodes)
        return prof

    def add_file(self, p: Path, *, collective: Collective | str | None = None, ranks: int | None = None,
                 nodes: int | None = None) -> None:  # fmt: skip
        text = p.read_text()
        head = next((ln for ln in text.splitlines() if ln.strip()), "")
        if head.replace(" ", "").lower().startswith("collective,"):
            self.add_sweep_csv(text, str(p))
            return
        # A log names its collective by file name (all_reduce_perf-..., allreduce-...) and its
        # shape by its "#  Rank N ... on HOST" lines; the caller's values fill what it lacks.
        coll = log_collective(p.name) or collective
        shape = log_shape(text)
        n_ranks, n_nodes = shape if shape is not None else (ranks, nodes)
        if coll is None or n_ranks is None or n_nodes is None:
            raise InputError(f"replay: {p} is an nccl-tests log; it needs the collective, ranks and nodes it was run with "
                             "(name the file after the binary, e.g. all_reduce_perf.log, and keep its '# Rank' lines)")
        self.add_nccl_tests_log(text, str(p), coll, n_ranks, n_nodes)

    def add_sweep_csv(self, text: str, name: str = "<csv>") -> None:
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in SWEEP_COLUMNS if c not in header]
        if missing:
            raise InputError(f"{name}:1: sweep CSV header lacks column(s) {', '.join(missing)}")
        sums: dict[tuple[Group, Config, int], list[float]] = defaultdict(list)
        timed_out: set[tuple[Group, Config, int]] = set()
        optional = [c for c in OPTIONAL_COLUMNS if c in header]
        rows = 0
        for rec in reader:
            line = reader.line_num
            rec = {(k or "").strip(): (v or "").strip() for k, v in rec.items()}
            where = f"{name}:{line}"
            if not any(rec.values()):
                continue
            coll_text = rec["collective"]
            if coll_text.lower() == "reduce":
                self.notes.append(f"{where}: reduce rows are skipped (ccltune does not tune reduce)")
                continue
            try:
                coll = parse_collective(coll_text, "collective")
                algo = self._algorithm(rec["algorithm"])
                proto = canonical_protocol(rec["protocol"])
                size = self._int(rec, "size_bytes", 1)
                channels = self._int(rec, "channels", 1)
                nodes = self._int(rec, "nodes", 1)
                ranks = self._int(rec, "ranks", 1)
                default_threads = LL128_THREADS if proto == "LL128" else DEFAULT_THREADS
                extra = {c: self._int(rec, c, 1) for c in optional if rec.get(c, "")}
                config = Config(Impl(algo, proto, "p2p"), channels, extra.get("threads", default_threads),
                                extra.get("buffsize", DEFAULT_BUFFSIZE), extra.get("instances", 1))
                if config.instances != 1 and not is_msccl(algo):
                    raise ValueError(f"instances {config.instances}: only MSCCL rows (msccl:<schedule>) have instances")
                timed = rec["latency_us"].lower() in MISSING_MARKS
                time_us = 0.0 if timed else float(rec["latency_us"])
            except ValueError as exc:
                raise InputError(f"{where}: {exc}") from None
            rows += 1
            cell = ((coll, nodes, ranks), config, size)
            if timed:
                timed_out.add(cell)
                continue
            if not (time_us > 0 and math.isfinite(time_us)):
                raise InputError(f"{where}: latency_us must be positive, got {rec['latency_us']!r}")
            sums[cell].append(time_us)
        if rows == 0:
            raise InputError(f"{name}: empty table (no data rows after the header)")
        for (group, config, size), times in sums.items():
            self.table.setdefault(group, {}).setdefault(config, {})[size] = sum(times) / len(times)
        kept_missing = timed_out - set(sums)  # a repeat that finished keeps the point
        for group, config, size in kept_missing:
            self.table.setdefault(group, {}).setdefault(config, {})
            self.missing.setdefault(group, {}).setdefault(config, set()).add(size)
        if kept_missing:
            self.notes.append(f"{name}: {len(kept_missing)} timed-out or failed points kept missing")

    @staticmethod
    def _algorithm(text: str) -> str:
        if is_msccl(text.strip().lower()):
            schedule = text.strip()[len("msccl:"):].strip()
            if not schedule:
                raise ValueError("algorithm 'msccl:' names no schedule (msccl:<schedule>)")
            return msccl_algorithm(schedule)
        return canonical_algorithm(text) if text.lower() != "pat" else "pat"

    @staticmethod
    def _int(rec: dict[str, str], column: str, minimum: int) -> int:
        text = rec.get(column, "")
        try:
            value = int(text)
        except ValueError:
            raise InputError(f"{column} {text!r} is not an integer") from None
        if value < minimum:
            raise InputError(f"{column} must be >= {minimum}, got {value}")
        return value

    def add_nccl_tests_log(
        self, text: str, name: str, collective: Collective | str, ranks: int, nodes: int
    ) -> None:
        coll = collective if isinstance(collective, Collective) else parse_collective(collective)
        log = parse_log(text, name)
        group = (coll, nodes, ranks)
        for section, rows in log.sections.items():
            series = {r.size: (r.inplace_time_us if self.inplace else r.time_us) for r in rows}
            if section.strip().upper() in ("", "NCCL"):
                self.defaults.setdefault(group, {}).update(series)
            else:
                self.synthesized.setdefault(group, {}).setdefault(section.strip().lower(), {}).update(series)

    # -- the profiler interface -----------------------------------------------------------------
    def sizes(self, key: TaskKey) -> list[int]:
        group = _group(key)
        found: set[int] = set()
        for series in self.table.get(group, {}).values():
            found |= set(series)
        found |= set(self.defaults.get(group, {}))
        for series in self.synthesized.get(group, {}).values():
            found |= set(series)
        return sorted(s for s in found if key.min_bytes <= s <= key.max_bytes)

    def space(self, key: TaskKey, facts: FabricFacts, full: TaskSpace) -> TaskSpace:
        group = _group(key)
        size = key.min_bytes
        by_impl: dict[Impl, set[tuple[int, ...]]] = defaultdict(set)
        notes: list[str] = []
        left_out: set[str] = set()
        for config in sorted(self.table.get(group, {})):
            if is_msccl(config.impl.algorithm) and self.runtime not in MSCCL_RUNTIMES:
                left_out.add(config.impl.algorithm)
                continue
            reason = invalid_reason(group[0], config.impl, facts)
            if reason is None:
                try:
                    check_config(group[0], config, facts)
                except ValueError as exc:
                    reason = str(exc)
            if reason is not None:
                notes.append(f"replayed {config.label()} ignored: {reason}")
                continue
            if not self._has(group, config, size):
                continue  # missing at this size (timed out, or not measured and not bracketed)
            by_impl[config.impl].add(config.point)
        if left_out:
            notes.append(f"{len(left_out)} MSCCL schedules in the table left out: runtime {self.runtime} does not run MSCCL")
        subs = []
        for impl, points in sorted(by_impl.items()):
            values = tuple(tuple(sorted({p[d] for p in points})) for d in range(len(next(iter(points)))))
            subs.append(Subspace(impl, values, frozenset(points)))
        return TaskSpace(group[0], tuple(subs), tuple(notes))

    def _has(self, group: Group, config: Config, size: int) -> bool:
        try:
            _lookup(self.table[group][config], size, self.fallback, "", self._missing(group, config))
        except ProfilerError:
            return False
        return True

    def _missing(self, group: Group, config: Config) -> frozenset[int]:
        return frozenset(self.missing.get(group, {}).get(config, ()))

    def measure(self, key: TaskKey, size: int, config: Config, reps: int = 1) -> Measurement:
        group = _group(key)
        series = self.table.get(group, {}).get(config)
        if series is None:
            raise ProfilerError(f"replay table has no rows for {key.collective} {config.label()} "
                                f"on {key.ranks} ranks/{key.nodes} nodes")
        t, note = _lookup(series, size, self.fallback, f"{key.collective} {config.label()}", self._missing(group, config))
        return Measurement(t, self.source, reps, note)

    def default_measure(self, key: TaskKey, size: int) -> Measurement | None:
        """NCCL's own choice as logged (nccl-tests run without overrides), when the table has it."""
        series = self.defaults.get(_group(key))
        if not series:
            return None
        try:
            t, note = _lookup(series, size, self.fallback, f"{key.collective} NCCL default")
        except ProfilerError:
            return None  # not logged at this size: NCCL's default is measured as a configuration
        return Measurement(t, self.source, 1, note)

    def synthesized_measures(self, key: TaskKey, size: int) -> dict[str, Measurement]:
        out = {}
        for name, series in sorted(self.synthesized.get(_group(key), {}).items()):
            try:
                t, note = _lookup(series, size, self.fallback, f"{key.collective} {name}")
            except ProfilerError:
                continue  # not run at this size: not a candidate here
            out[name] = Measurement(t, self.source, 1, note)
        return out


__all__ = ["FALLBACKS", "MISSING_MARKS", "OPTIONAL_COLUMNS", "SWEEP_COLUMNS", "ReplayProfiler"]
