"""`replay`: measurements from a table instead of a machine.

Inputs:
- NCCL's sweep CSV (`collective,size_bytes,algorithm,protocol,channels,nodes,ranks,pipeOps,
  regBuff,cost_metric,bandwidth_gbps,latency_us`, the input of the example tuner plugin's
  scripts/optimize_config.py). `latency_us` is taken as the time of one call; rows repeating a
  (configuration, size) are averaged. Threads/buffer size are NCCL's defaults in such a sweep.
- nccl-tests logs. A log carries no configuration: its `NCCL:` (or unnamed) section is NCCL's
  own choice, every other section (e.g. `MSCCL:`) a synthesized schedule to choose against.

A point not in the table is an error unless a fallback is chosen:
- `nearest`: the same configuration at the nearest measured size (in log2 distance), scaled
  linearly in size when the nearer neighbour is smaller (bandwidth-bound extrapolation is not
  attempted: the time is kept, which under-states large sizes' time only if the table stops early);
- `interpolate`: log-log interpolation in size between the two measured neighbours of the same
  configuration; outside the measured range it behaves like `nearest`.
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
from ...api.plan import TaskKey
from ...model.cost import canonical_algorithm, canonical_protocol
from ..fabric import FabricFacts
from ..keys import parse_collective
from ..space import (
    DEFAULT_BUFFSIZE,
    DEFAULT_THREADS,
    LL128_THREADS,
    Config,
    Impl,
    Subspace,
    TaskSpace,
    invalid_reason,
)
from .base import Measurement, ProfilerError
from .nccltests import parse_log

Fallback = Literal["error", "nearest", "interpolate"]
FALLBACKS: tuple[str, ...] = ("error", "nearest", "interpolate")
SWEEP_COLUMNS = ("collective", "size_bytes", "algorithm", "protocol", "channels", "nodes", "ranks",
                 "cost_metric", "bandwidth_gbps", "latency_us")  # fmt: skip
Group = tuple[Collective, int, int]  # collective, nodes, ranks
Series = dict[int, float]  # size -> time_us


def _group(key: TaskKey) -> Group:
    return (Collective(key.collective), key.nodes, key.ranks)


def _lookup(series: Series, size: int, fallback: str, what: str) -> tuple[float, str]:
    if size in series:
        return series[size], ""
    if fallback == "error" or not series:
        known = ", ".join(str(s) for s in sorted(series)[:8])
        raise ProfilerError(
            f"replay table has no point for {what} at {size} bytes (measured sizes: {known or 'none'}); "
            "choose a fallback (nearest or interpolate) to fill gaps"
        )
    sizes = sorted(series)
    i = bisect.bisect_left(sizes, size)
    if fallback == "interpolate" and 0 < i < len(sizes):
        lo, hi = sizes[i - 1], sizes[i]
        w = (math.log(size) - math.log(lo)) / (math.log(hi) - math.log(lo))
        t = math.exp((1 - w) * math.log(series[lo]) + w * math.log(series[hi]))
        return t, f"interpolated between {lo} and {hi} bytes"
    near = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(size)), s))
    return series[near], f"nearest measured size {near} bytes"


@dataclass
class ReplayProfiler:
    fallback: str = "error"
    inplace: bool = False
    name: str = "replay"
    source: Source = Source.REPLAYED
    table: dict[Group, dict[Config, Series]] = field(default_factory=dict)
    defaults: dict[Group, Series] = field(default_factory=dict)
    synthesized: dict[Group, dict[str, Series]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback: {self.fallback!r} is not one of {', '.join(FALLBACKS)}")

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
    ) -> ReplayProfiler:
        p = Path(path)
        if not p.exists():
            raise ValueError(f"replay: {p}: no such file")
        text = p.read_text()
        prof = cls(fallback=fallback, inplace=inplace)
        head = next((ln for ln in text.splitlines() if ln.strip()), "")
        if head.replace(" ", "").lower().startswith("collective,"):
            prof.add_sweep_csv(text, str(p))
        else:
            if collective is None or ranks is None or nodes is None:
                raise ValueError(f"replay: {p} is an nccl-tests log; it needs the collective, ranks and nodes it was run with")
            prof.add_nccl_tests_log(text, str(p), collective, ranks, nodes)
        return prof

    def add_sweep_csv(self, text: str, name: str = "<csv>") -> None:
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in SWEEP_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{name}:1: sweep CSV header lacks column(s) {', '.join(missing)}")
        sums: dict[tuple[Group, Config, int], list[float]] = defaultdict(list)
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
                algo = canonical_algorithm(rec["algorithm"]) if rec["algorithm"].lower() != "pat" else "pat"
                proto = canonical_protocol(rec["protocol"])
                size = self._int(rec, "size_bytes", 1)
                channels = self._int(rec, "channels", 1)
                nodes = self._int(rec, "nodes", 1)
                ranks = self._int(rec, "ranks", 1)
                time_us = float(rec["latency_us"])
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if not time_us > 0:
                raise ValueError(f"{where}: latency_us must be positive, got {rec['latency_us']!r}")
            threads = LL128_THREADS if proto == "LL128" else DEFAULT_THREADS
            config = Config(Impl(algo, proto, "p2p"), channels, threads, DEFAULT_BUFFSIZE)
            sums[((coll, nodes, ranks), config, size)].append(time_us)
            rows += 1
        if rows == 0:
            raise ValueError(f"{name}: empty table (no data rows after the header)")
        for (group, config, size), times in sums.items():
            self.table.setdefault(group, {}).setdefault(config, {})[size] = sum(times) / len(times)

    @staticmethod
    def _int(rec: dict[str, str], column: str, minimum: int) -> int:
        text = rec.get(column, "")
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{column} {text!r} is not an integer") from None
        if value < minimum:
            raise ValueError(f"{column} must be >= {minimum}, got {value}")
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
        by_impl: dict[Impl, set[tuple[int, int, int]]] = defaultdict(set)
        notes: list[str] = []
        for config, series in sorted(self.table.get(group, {}).items()):
            reason = invalid_reason(group[0], config.impl, facts)
            if reason is not None:
                notes.append(f"replayed {config.impl.label()} ignored: {reason}")
                continue
            if self.fallback == "error" and size not in series:
                continue
            by_impl[config.impl].add(config.point)
        subs = []
        for impl, points in sorted(by_impl.items()):
            values = tuple(tuple(sorted({p[d] for p in points})) for d in range(3))
            subs.append(Subspace(impl, (values[0], values[1], values[2]), frozenset(points)))
        return TaskSpace(group[0], tuple(subs), tuple(notes))

    def measure(self, key: TaskKey, size: int, config: Config, reps: int = 1) -> Measurement:
        group = _group(key)
        series = self.table.get(group, {}).get(config)
        if series is None:
            raise ProfilerError(f"replay table has no rows for {key.collective} {config.label()} "
                                f"on {key.ranks} ranks/{key.nodes} nodes")
        t, note = _lookup(series, size, self.fallback, f"{key.collective} {config.label()}")
        return Measurement(t, self.source, reps, note)

    def default_measure(self, key: TaskKey, size: int) -> Measurement | None:
        """NCCL's own choice as logged (nccl-tests run without overrides), when the table has it."""
        series = self.defaults.get(_group(key))
        if not series:
            return None
        t, note = _lookup(series, size, self.fallback, f"{key.collective} NCCL default")
        return Measurement(t, self.source, 1, note)

    def synthesized_measures(self, key: TaskKey, size: int) -> dict[str, Measurement]:
        out = {}
        for name, series in sorted(self.synthesized.get(_group(key), {}).items()):
            t, note = _lookup(series, size, self.fallback, f"{key.collective} {name}")
            out[name] = Measurement(t, self.source, 1, note)
        return out


__all__ = ["FALLBACKS", "SWEEP_COLUMNS", "ReplayProfiler"]
