"""A plan's syntheses as units of work: one per task (collective on its communicator).

Units are independent, so they run in any order and anywhere: one after another in
`ccltune plan`, in a process pool (`ccltune plan --workers N`), or one shard of units per pod of a
Kubernetes Indexed Job (controller/shardjob.py). Each unit's result is keyed by its task index,
so merging is the same whatever order the shards finish in.

Why whole syntheses and not sub-demand MILPs (shard.py): evaluation is where synthesis spends its
time; the sub-demand solves took under 1% of it on every preset measured (docs/synthesis.md).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..api.cluster import ClusterTopology
from ..api.common import Collective
from .engine import synthesize

WIRE_FORMAT = 1  # bumped when Synthesized's JSON changes


@dataclass(frozen=True)
class SynthesisUnit:
    index: int  # the task's position in the plan
    cluster: ClusterTopology  # the task's communicator as a cluster of its own
    collective: Collective
    sizes: tuple[int, ...]
    max_threadblocks: int | None

    @property
    def weight(self) -> int:
        """Relative work, as workload.py charges synthesis: ranks x size points."""
        return self.cluster.world_size * len(self.sizes)


@dataclass(frozen=True)
class Synthesized:
    """What a plan takes from one synthesis (plan_steps.synth_step)."""

    index: int
    sizes: tuple[int, ...]  # the unit's sizes: a result is used only for the same sizes
    files: tuple[tuple[str, str], ...]  # (file name, MSCCL XML), in range order
    ranges: tuple[tuple[str, tuple[int, ...]], ...]  # (file name, sizes its range was built for)
    picks: tuple[tuple[int, str, str], ...]  # (size, chosen label, protocol) per size
    notes: tuple[str, ...]
    symmetric: bool


def synthesize_unit(unit: SynthesisUnit) -> Synthesized:
    files: list[tuple[str, str]] = []
    ranges: list[tuple[str, tuple[int, ...]]] = []
    with tempfile.TemporaryDirectory(prefix="ccltune-synth-") as tmp:
        # No wall-clock limit here: the work budget bounds it, so a plan is the same on any
        # machine (spec.synthesis.timeBudgetSeconds bounds the plan Job, controller/).
        res = synthesize(unit.cluster, unit.collective, list(unit.sizes), out_dir=tmp,
                         max_threadblocks=unit.max_threadblocks)  # fmt: skip
        for r in res.ranges:
            if r.xml_file:
                path = Path(r.xml_file)
                files.append((path.name, path.read_text(encoding="utf-8")))
                ranges.append((path.name, tuple(s.size_bytes for s in r.sizes)))
    return Synthesized(
        index=unit.index,
        sizes=unit.sizes,
        files=tuple(files),
        ranges=tuple(ranges),
        picks=tuple((s.size_bytes, s.chosen, s.protocol) for s in res.sizes),
        notes=tuple(res.notes),
        symmetric=res.symmetric,
    )


def run_units(units: list[SynthesisUnit], *, workers: int = 1,
              progress: Callable[[str], None] | None = None) -> dict[int, Synthesized]:  # fmt: skip
    """Every unit synthesized; `workers` > 1 runs them in a process pool."""
    say = progress or (lambda _m: None)
    if workers <= 1 or len(units) <= 1:
        out = {}
        for u in units:
            say(f"synthesizing {u.collective} on {u.cluster.world_size} ranks "
                f"({len(u.sizes)} sizes)")  # fmt: skip
            out[u.index] = synthesize_unit(u)
        return out
    say(f"synthesizing {len(units)} tasks in {min(workers, len(units))} processes")
    with ProcessPoolExecutor(max_workers=min(workers, len(units))) as pool:
        return merge([r] for r in pool.map(synthesize_unit, units))


def assign(units: Iterable[SynthesisUnit], shards: int) -> tuple[tuple[int, ...], ...]:
    """Task indices per shard: heaviest unit first onto the least loaded shard (ties: lowest
    index), so the result depends only on the units. No shard is left empty."""
    ordered = sorted(units, key=lambda u: (-u.weight, u.index))
    n = max(1, min(shards, len(ordered)))
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for u in ordered:
        j = load.index(min(load))
        bins[j].append(u.index)
        load[j] += u.weight
    return tuple(tuple(sorted(b)) for b in bins)


def merge(shards: Iterable[Iterable[Synthesized]]) -> dict[int, Synthesized]:
    """One result per task index, in index order, whatever order the shards came in."""
    out: dict[int, Synthesized] = {}
    for shard in shards:
        for s in shard:
            if s.index in out and out[s.index] != s:
                raise ValueError(f"two different results for task {s.index}")
            out[s.index] = s
    return dict(sorted(out.items()))


# ---- wire format: what a shard pod writes -----------------------------------------------------


def to_json(results: Iterable[Synthesized]) -> str:
    return json.dumps({"format": WIRE_FORMAT, "results": [
        {"index": r.index, "sizes": list(r.sizes), "files": [list(f) for f in r.files],
         "ranges": [[name, list(sizes)] for name, sizes in r.ranges],
         "picks": [list(p) for p in r.picks], "notes": list(r.notes), "symmetric": r.symmetric}
        for r in results
    ]}, separators=(",", ":"))  # fmt: skip


def from_json(text: str) -> list[Synthesized]:
    doc = json.loads(text)
    if doc.get("format") != WIRE_FORMAT:
        raise ValueError(f"synthesis results in format {doc.get('format')}, expected {WIRE_FORMAT}")
    return [
        Synthesized(
            index=int(x["index"]),
            sizes=tuple(int(s) for s in x["sizes"]),
            files=tuple((str(n), str(t)) for n, t in x["files"]),
            ranges=tuple((str(n), tuple(int(s) for s in sz)) for n, sz in x["ranges"]),
            picks=tuple((int(s), str(c), str(p)) for s, c, p in x["picks"]),
            notes=tuple(str(n) for n in x["notes"]),
            symmetric=bool(x["symmetric"]),
        )
        for x in doc["results"]
    ]
