"""tune_tasks: search every task key, reconcile the process-wide knobs, render what to publish.

Per task key (one size bucket of one collective on one communicator shape):
1. the valid space for the fabric (space.py), restricted to what the profiler can measure;
2. NCCL's default choice, measured by the same profiler (the baseline);
3. the searcher's best configuration within `budget` trials, started at NCCL's default with NCCL's
   static model as the prior (default.nccl_prior);
4. synthesized schedules (MSCCL), when given, compete with the tuned NCCL configuration; MSCCL
   variants the profiler measures (a replay table keyed by variant, runtime msccl/rccl) are in
   the searched space itself, and a variant the search picks competes the same way.
Then the knobs NCCL only takes per process (threads, buffer size, transport) are reconciled: every
combination the tasks' winners asked for (plus NCCL's defaults) is measured on every task, each
task running the better of its tuned per-call choice and NCCL's own choice under those knobs. Only
combinations under which no task is slower than NCCL's default (same profiler, same repetitions)
are eligible; among them the best geometric-mean time wins. NCCL's defaults are always eligible;
when they win over a faster-on-average combination, the tasks that combination would slow down
are named in the notes. Per-call choices go into the tuner table (table.py) for ccltune's plugin;
a task that keeps NCCL's own choice gets no row.
Reported times are re-measured with `verify_reps` repetitions under the deployed settings.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..api.cluster import ClusterTopology
from ..api.common import Collective, Source, format_size
from ..api.errors import InputError
from ..api.plan import Choice, Estimate, PlanTask, TaskKey
from ..model.cost.busbw import algbw_gbps, busbw_gbps
from ..topology.subgroup import subcluster
from .default import (
    default_channels,
    nccl_default_config,
    nccl_prior,
    nearest_replayed,
    shrink_resources,
)
from .emit import render_nccl_conf, render_tuner_csv, tuner_rows
from .fabric import FabricFacts, facts_for
from .keys import bucket_keys, check_keys
from .profilers.base import Measurement, Profiler, ProfilerError, stable_seed
from .profilers.live import LiveProfiler
from .profilers.nccltests import transport_env
from .profilers.replay import ReplayProfiler
from .profilers.simulated import SimulatedProfiler
from .searchers import Searcher, SearchResult, make_searcher
from .searchers.base import point_at, start_index
from .space import (
    DEFAULT_BUFFSIZE,
    DEFAULT_THREADS,
    MSCCL_PREFIX,
    Config,
    Impl,
    TaskSpace,
    build_space,
    check_config,
    is_msccl,
    parse_version,
)
from .table import TABLE_FILE, nvls_channels, render_table, table_rows

TUNER_FILE = "nccl_tuner.conf"
NCCL_CONF_FILE = "nccl.conf"
Progress = Callable[[str, int, int], None]  # (message, done, total)


@dataclass(frozen=True)
class SynthCandidate:
    """A synthesized schedule that may replace NCCL for a task (TuCCL's joint optimization)."""

    name: str
    measurement: Measurement
    msccl_file: str | None = None
    config: Config | None = None  # a joint-search variant: msccl:<schedule> x protocol x channels x instances


# (task key, size) -> candidates measured/simulated at that size
SynthSource = Callable[[TaskKey, int], Sequence[SynthCandidate]]
# A winning MSCCL variant's schedule file: (published path, XML), why it cannot be published, or
# None to leave it unresolved for the caller (a plan matches it to its synthesized files later).
VariantFile = Callable[[TaskKey, Config], tuple[str, str] | str | None]


@dataclass
class TaskOutcome:
    key: TaskKey
    size: int  # the size the bucket was measured at
    default: Config | None  # None when the baseline is a logged NCCL run (no known config)
    default_source: str
    default_measure: Measurement
    searched: SearchResult | None
    deployed: Config | None  # the NCCL settings published for this key
    chosen_measure: Measurement
    synthesized: SynthCandidate | None = None
    notes: list[str] = field(default_factory=list)
    parent: TaskKey | None = None  # the caller's key this bucket was cut from
    variant: SynthCandidate | None = None  # the best MSCCL variant of the joint search, if it won
    kept_default: bool = False  # NCCL's own per-call choice runs (no tuner row)
    table_row: int | None = None  # the tuner-table row realizing `deployed`

    @property
    def trials(self) -> int:
        return self.searched.n_trials if self.searched else 0

    @property
    def speedup(self) -> float:
        return self.default_measure.time_us / self.chosen_measure.time_us

    def _estimate(self, m: Measurement, choice: Choice | None = None) -> Estimate:
        coll = Collective(self.key.collective)
        return Estimate(
            size_bytes=self.size,
            time_us=m.time_us,
            algbw_gbps=algbw_gbps(self.size, m.time_us),
            busbw_gbps=busbw_gbps(coll, self.key.ranks, self.size, m.time_us),
            source=m.source,
            choice=choice,
        )

    def default_choice(self) -> Choice:
        c = _choice(self.default) if self.default else Choice(kind="nccl")
        return c.model_copy(update={"realized_by": "NCCL default"})

    @property
    def default_busbw(self) -> float:
        return self._estimate(self.default_measure).busbw_gbps

    @property
    def chosen_busbw(self) -> float:
        return self._estimate(self.chosen_measure).busbw_gbps

    def choice(self) -> Choice:
        if self.synthesized is not None:
            v = self.synthesized.config  # a variant: the protocol and channels it was measured with
            return Choice(kind="msccl", algorithm=self.synthesized.name, msccl_file=self.synthesized.msccl_file,
                          protocol=v.impl.protocol if v else None, channels=v.channels * v.instances if v else None,
                          realized_by=self.synthesized.msccl_file)
        by = ("NCCL default" if self.kept_default or self.deployed is None
              else f"tuner row {self.table_row}" if self.table_row is not None else None)
        return _choice(self.deployed).model_copy(update={"realized_by": by})

    def notes_text(self) -> list[str]:
        notes = list(self.notes)
        if self.searched:
            notes.append(f"{self.trials} trials ({self.searched.n_measurements} measurements): {self.searched.reason}")
        return notes

    def plan_task(self) -> PlanTask:
        default, chosen = self.default_choice(), self.choice()
        return PlanTask(
            key=self.key,
            default=default,
            chosen=chosen,
            default_estimates=[self._estimate(self.default_measure, default)],
            chosen_estimates=[self._estimate(self.chosen_measure, chosen)],
            trials=self.trials,
            notes=self.notes_text(),
        )


def _choice(config: Config | None) -> Choice:
    if config is None:
        return Choice(kind="nccl")
    return Choice(kind="nccl", algorithm=config.impl.algorithm, protocol=config.impl.protocol,
                  channels=config.channels, threads=config.threads,
                  chunk_bytes=config.buffsize // 2 if config.impl.protocol == "Simple" else None)


@dataclass
class TuningResult:
    tasks: list[TaskOutcome]
    env: dict[str, str]
    files: dict[str, str]  # path -> content (nccl_tuner.conf, nccl.conf)
    notes: list[str]
    source: Source
    searcher: str
    profiler: str
    budget: int
    seed: int

    @property
    def tuner_csv(self) -> str:
        return self.files[TUNER_FILE]

    @property
    def nccl_conf(self) -> str:
        return self.files[NCCL_CONF_FILE]

    def plan_tasks(self) -> list[PlanTask]:
        """One PlanTask per size bucket (the unit that was tuned)."""
        return [t.plan_task() for t in self.tasks]

    def plan_tasks_by_key(self) -> list[PlanTask]:
        """One PlanTask per key given to tune_tasks, with one estimate per bucket (each carrying
        its choice); `chosen`/`default` are those of the largest bucket, trials are summed."""
        groups: dict[str, list[TaskOutcome]] = {}
        keys: dict[str, TaskKey] = {}
        for t in self.tasks:
            parent = t.parent or t.key
            keys.setdefault(parent.label(), parent)
            groups.setdefault(parent.label(), []).append(t)
        out = []
        for label, outcomes in groups.items():
            last = outcomes[-1]
            notes = [f"{format_size(o.key.min_bytes)}: {n}" for o in outcomes for n in o.notes_text()]
            out.append(PlanTask(
                key=keys[label],
                default=last.default_choice(),
                chosen=last.choice(),
                default_estimates=[o._estimate(o.default_measure, o.default_choice()) for o in outcomes],
                chosen_estimates=[o._estimate(o.chosen_measure, o.choice()) for o in outcomes],
                trials=sum(o.trials for o in outcomes),
                notes=notes,
            ))
        return out


def make_profiler(spec: str | Profiler, topo: ClusterTopology, *, seed: int = 0, **options: Any) -> Profiler:
    """'simulated' | 'replay:FILE' | 'live' (or a ready profiler) -> a profiler."""
    if not isinstance(spec, str):
        return spec
    if spec == "simulated":
        return SimulatedProfiler(topo, interference=options.get("interference", 0.0),
                                 noise=options.get("noise", 0.02), seed=seed, sharp=options.get("sharp"))
    if spec.startswith("replay:"):
        path = spec.split(":", 1)[1]
        if not path:
            raise InputError("profiler: replay needs a file, as replay:FILE")
        return ReplayProfiler.from_file(
            path, collective=options.get("collective"), ranks=options.get("ranks"), nodes=options.get("nodes"),
            fallback=options.get("fallback", "error"), inplace=options.get("inplace", False),
            runtime=options.get("runtime", "nccl"),
        )
    if spec == "live":
        return LiveProfiler(launcher=list(options.get("launcher") or []), bindir=options.get("bindir", ""))
    raise InputError(f"profiler: unknown {spec!r} (simulated, replay:FILE or live)")


def _buckets(key: TaskKey, profiler: Profiler, factor: int) -> list[TaskKey]:
    sizes_of = getattr(profiler, "sizes", None)
    if sizes_of is None:
        return bucket_keys(key, factor)
    points = sizes_of(key)
    if not points:
        return []
    out = []
    for i, lo in enumerate(points):
        hi = points[i + 1] - 1 if i + 1 < len(points) else max(lo, key.max_bytes)
        out.append(key.model_copy(update={"min_bytes": lo, "max_bytes": hi}))
    return out


def _measure_default(
    profiler: Profiler, key: TaskKey, size: int, config: Config, space: TaskSpace, reps: int, facts: FabricFacts
) -> tuple[Measurement, Config | None, str]:
    logged = getattr(profiler, "default_measure", None)
    if logged is not None:
        m = logged(key, size)
        if m is not None:
            return m, None, "NCCL run without overrides (logged)"
    try:
        return profiler.measure(key, size, config, reps), config, ""
    except ProfilerError:
        if getattr(profiler, "fallback", "error") == "error":
            raise
    # Documented fallback (default.nearest_replayed).
    near = nearest_replayed(Collective(key.collective), size, config, space, facts)
    if near is None:
        raise ProfilerError(f"{key.label()}: NCCL's default {config.label()} is not in the replay table")
    return profiler.measure(key, size, near, reps), near, f"NCCL default {config.label()} approximated by replayed {near.label()}"


def _globals_of(c: Config) -> tuple[str, int | None, int | None]:
    threads = c.threads if c.impl.protocol != "LL128" else None
    buff = c.buffsize if c.impl.protocol == "Simple" else None
    return c.impl.transport, threads, buff


def _apply(c: Config, g: tuple[str, int, int]) -> Config:
    transport, threads, buff = g
    impl = Impl(c.impl.algorithm, c.impl.protocol, transport)
    return Config(impl, c.channels, c.threads if c.impl.protocol == "LL128" else threads,
                  buff if c.impl.protocol == "Simple" else c.buffsize)


def tune_tasks(
    tasks: list[TaskKey],
    topo: ClusterTopology,
    *,
    searcher: str | Searcher = "autoccl",
    profiler: str | Profiler = "simulated",
    budget: int = 200,
    seed: int = 0,
    nccl_version: str = "2.24",
    size_factor: int = 2,
    verify_reps: int = 5,
    synthesized: SynthSource | None = None,
    sharp: bool | None = None,
    progress: Progress | None = None,
    keep: Callable[[TaskKey, int, Config], str | None] | None = None,
    variant_file: VariantFile | None = None,
    **profiler_options: Any,
) -> TuningResult:
    """Tune every task key (split into size buckets); `budget` is in trials per bucket.
    `keep(parent key, size, config)`: None to publish a pick, else why NCCL's default is kept
    instead (the plan's common evaluator vetoes picks it times no faster; model/evaluate.py).
    `variant_file`: the schedule file of a winning MSCCL variant, published with the result."""
    if budget < 1:
        raise InputError(f"budget must be at least 1 trial, got {budget}")
    if not tasks:
        raise InputError("no tasks to tune")
    version = parse_version(nccl_version)
    search = make_searcher(searcher) if isinstance(searcher, str) else searcher
    prof = make_profiler(profiler, topo, seed=seed, sharp=sharp, **profiler_options)
    buckets: list[TaskKey] = []
    parents: list[TaskKey] = []
    notes: list[str] = []
    for key in tasks:
        found = _buckets(key, prof, size_factor)
        if not found:
            notes.append(f"{key.label()}: the replayed data has no size in this range; not tuned")
        buckets += found
        parents += [key] * len(found)
    if not buckets:
        raise InputError("replay: the table has no sizes for any task (check collective, ranks, nodes and --sizes)")
    check_keys(buckets)
    outcomes: list[tuple[TaskOutcome, FabricFacts, TaskSpace]] = []
    say = progress or (lambda _m, _d, _t: None)
    subs: dict[tuple[int, int], ClusterTopology | None] = {}
    for i, key in enumerate(buckets):
        say(f"{key.label()} ({search.name} on {prof.name})", i, len(buckets))
        outcomes.append(_tune_one(key, topo, prof, search, budget, seed, version, sharp, verify_reps, subs))
        outcomes[-1][0].parent = parents[i]
    say("reconciling process-wide knobs", len(buckets), len(buckets))
    runs = _Runs(prof, verify_reps, outcomes[0][1].arch)
    g = _reconcile(outcomes, runs, notes)
    variant_files: dict[str, str] = {}
    for outcome, _facts, _space in outcomes:
        _finish(outcome, runs, g, synthesized, variant_file, variant_files)
        o = outcome
        why = (keep(o.parent or o.key, o.size, o.deployed)
               if keep is not None and o.deployed is not None and not o.kept_default else None)  # fmt: skip
        if why is not None:
            o.deployed, o.chosen_measure, o.kept_default = o.default, o.default_measure, True
            o.notes.append(why)
    for outcome, facts, _ in outcomes:
        if outcome.deployed is not None:
            check_config(Collective(outcome.key.collective), outcome.deployed, facts, version)
    choices = [(o.key, o.deployed) for o, _, _ in outcomes if o.deployed is not None]
    pinned = [(o.key, o.deployed) for o, _, _ in outcomes if o.deployed is not None and not o.kept_default]
    fallbacks = {o.key.label(): fb for o, facts, space in outcomes
                 if (fb := _fallback(o, runs, g, space, facts, version)) is not None}  # fmt: skip
    built = table_rows(pinned, outcomes[0][1].arch, fallbacks)
    for o, _, _ in outcomes:
        o.table_row = None if o.kept_default else built.row_of.get(o.key.label())
    notes += built.notes
    rows, row_notes = tuner_rows(choices)
    notes += row_notes
    env: dict[str, str] = {}  # per-call choices go in the tuner table, never NCCL_ALGO/PROTO
    env.update(_global_env(g, [o for o, _, _ in outcomes], [f for _, f, _ in outcomes]))
    header = (f"ccltune tune: {len(buckets)} task keys on {topo.name}, searcher {search.name}, "
              f"profiler {prof.name} ({prof.source}), budget {budget}/key, seed {seed}")
    files = {TUNER_FILE: render_tuner_csv(rows, header), NCCL_CONF_FILE: render_nccl_conf(env, header),
             **variant_files}
    if built.rows:  # no rows: nothing for the plugin to do, so it is not loaded at all
        files[TABLE_FILE] = render_table(built.rows, nvls=built.nvls, comments=[header])
    if rows:
        notes.append(f"{TUNER_FILE} is for NCCL's example tuner plugin, which gives 1 channel to calls no "
                     f"row matches; ccltune's plugin reads {TABLE_FILE} and leaves such calls to NCCL")
    return TuningResult([o for o, _, _ in outcomes], env, files, notes, prof.source, search.name,
                        prof.name, budget, seed)


def _tune_one(
    key: TaskKey, topo: ClusterTopology, prof: Profiler, search: Searcher, budget: int, seed: int,
    version: tuple[int, int], sharp: bool | None, verify_reps: int,
    subs: dict[tuple[int, int], ClusterTopology | None],
) -> tuple[TaskOutcome, FabricFacts, TaskSpace]:
    coll = Collective(key.collective)
    facts = facts_for(topo, key.ranks, key.nodes, sharp=sharp)
    full = build_space(coll, facts, version)
    space = prof.space(key, facts, full)
    size = key.min_bytes
    notes = list(space.notes)
    dflt = nccl_default_config(coll, size, facts, full, _sub_topology(topo, key, subs))
    d_measure, d_config, d_note = _measure_default(prof, key, size, dflt.config, space, verify_reps, facts)
    if d_note:
        notes.append(d_note)
    result: SearchResult | None = None
    variant: SynthCandidate | None = None
    if len(space) > 0:
        # Start from what was measured as NCCL's default (a replayed stand-in when the table lacks it).
        start = _project(space, d_config or dflt.config)
        prior = nccl_prior(coll, size, facts, space)

        def evaluate(config: Config, reps: int) -> float:
            return prof.measure(key, size, config, reps).time_us

        result = search.search(space, evaluate, budget, stable_seed(seed, key.label()) % (2**31), start, prior)
        result, variant = _split_variant(result, prof)
    else:
        notes.append("no NCCL configuration to search in the replayed data")
    source = dflt.source if d_config is not None else "logged NCCL run"
    outcome = TaskOutcome(key, size, d_config, source, d_measure, result, result.best if result else d_config,
                          d_measure, notes=notes, variant=variant)
    return outcome, facts, space


def _split_variant(result: SearchResult, prof: Profiler) -> tuple[SearchResult | None, SynthCandidate | None]:
    """A joint search's pick, split: the best NCCL configuration stays the tuned settings (the
    tuner table needs one; None when no NCCL configuration was measured), the best MSCCL variant
    competes like a synthesized schedule."""
    if not is_msccl(result.best.impl.algorithm):
        return result, None
    c = result.best
    name = f"{c.impl.algorithm.removeprefix(MSCCL_PREFIX)}/{c.impl.protocol} {c.channels}ch x{c.instances}"
    variant = SynthCandidate(name, Measurement(result.value, prof.source, 1, "picked by the joint search"), config=c)
    nccl = [t for t in result.trials if not is_msccl(t.config.impl.algorithm) and not t.pruned]
    if not nccl:
        return None, variant
    best = min(nccl, key=lambda t: (t.value, t.config))
    return replace(result, best=best.config, value=best.value), variant


def _project(space: TaskSpace, config: Config) -> Config | None:
    for sub in space.subspaces:
        if sub.impl == config.impl:
            return sub.config(point_at(sub, start_index(sub, config)))
    return None


def _sub_topology(topo: ClusterTopology, key: TaskKey, cache: dict[tuple[int, int], ClusterTopology | None]) -> ClusterTopology | None:
    """The communicator's sub-cluster (first nodes, first GPUs of each), for model.nccl_default."""
    shape = (key.ranks, key.nodes)
    if shape not in cache:
        cache[shape] = communicator_topology(topo, key)
    return cache[shape]


def communicator_topology(topo: ClusterTopology, key: TaskKey) -> ClusterTopology | None:
    """The sub-cluster of a key's communicator: its first nodes, the first GPUs of each."""
    per = key.ranks // key.nodes
    ranks = [n * topo.gpus_per_node + i for n in range(key.nodes) for i in range(per)]
    try:
        return subcluster(topo, ranks)
    except ValueError:
        return None


Knobs = tuple[str, int, int]  # (transport, NCCL_NTHREADS, NCCL_BUFFSIZE)
BASE: Knobs = ("p2p", DEFAULT_THREADS, DEFAULT_BUFFSIZE)


class _Runs:
    """Measurements under candidate process-wide knobs, each (task, config) measured once."""

    def __init__(self, prof: Profiler, reps: int, arch: str) -> None:
        self.prof, self.reps, self.arch = prof, reps, arch
        self._seen: dict[tuple[str, Config], Measurement] = {}

    def measure(self, o: TaskOutcome, cfg: Config) -> Measurement:
        if o.default is not None and cfg == o.default:
            return o.default_measure  # the same run as NCCL's default: one number for both
        key = (o.key.label(), cfg)
        if key not in self._seen:
            self._seen[key] = self.prof.measure(o.key, o.size, cfg, self.reps)
        return self._seen[key]

    def best(self, o: TaskOutcome, space: TaskSpace | None, g: Knobs) -> tuple[Config | None, Measurement, bool] | None:
        """The task's faster run under knobs g: its tuned per-call choice, or NCCL's own choice
        (no tuner row; NCCL's default itself under NCCL's default knobs). None: neither measurable."""
        assert o.deployed is not None
        runs: list[tuple[Config | None, Measurement, bool]] = []
        tuned = _as_nccl_builds(_apply(o.deployed, g), self.arch, o.key.nodes)
        if space is None or _measurable(space, tuned, self.prof):
            runs.append((tuned, self.measure(o, tuned), False))
        if g == BASE:
            runs.append((o.default, o.default_measure, True))
        elif o.default is not None:
            keep = _as_nccl_runs(o.default, g, o.size)
            if space is None or _measurable(space, keep, self.prof):
                runs.append((keep, self.measure(o, keep), True))
        if not runs:
            return None
        return min(runs, key=lambda r: (r[1].time_us, not r[2]))  # a tie: NCCL's own run, no row


def _as_nccl_builds(c: Config, arch: str, nodes: int) -> Config:
    """NVLS channels cut to what NCCL builds on the GPU (table.nvls_channels), so the estimate is
    for the run NCCL really does."""
    cap = nvls_channels(arch, nodes)
    if c.impl.algorithm in ("nvls", "nvls_tree") and cap is not None and c.channels > cap:
        return Config(c.impl, cap, c.threads, c.buffsize)
    return c


def _reconcile(outcomes: list[tuple[TaskOutcome, FabricFacts, TaskSpace]], runs: _Runs, notes: list[str]) -> Knobs:
    """One (transport, threads, buffsize) for the process: the best geometric mean among the
    combinations under which no task is slower than NCCL's default."""
    tuned = [(o, space) for o, _, space in outcomes if o.deployed is not None and o.searched is not None]
    wanted: Counter[tuple[str, int | None, int | None]] = Counter(
        _globals_of(o.deployed) for o, _ in tuned if o.deployed is not None)
    if not wanted:
        return BASE
    transports = {t for (t, _, _) in wanted} | {"p2p"}
    threads = {n for (_, n, _) in wanted if n is not None} | {DEFAULT_THREADS}
    buffs = {b for (_, _, b) in wanted if b is not None} | {DEFAULT_BUFFSIZE}
    cands = {BASE}
    for t, n, b in (w for w, _ in wanted.most_common(4)):
        cands.add((t, n or DEFAULT_THREADS, b or DEFAULT_BUFFSIZE))
    if len(transports) * len(threads) * len(buffs) <= 8:
        cands |= {(t, n, b) for t in transports for n in threads for b in buffs}
    scored: list[tuple[float, Knobs, list[tuple[TaskOutcome, float]]]] = []
    for g in sorted(cands):
        total, losers, ok = 0.0, [], True
        for o, space in tuned:
            best = runs.best(o, space, g)
            if best is None:
                ok = False
                break
            total += math.log(best[1].time_us)
            if best[1].time_us > o.default_measure.time_us:
                losers.append((o, o.default_measure.time_us / best[1].time_us))
        if ok:
            scored.append((total, g, losers))
    if not scored:
        return BASE
    chosen = min((t, g) for t, g, losers in scored if not losers)[1] if any(not x[2] for x in scored) else BASE
    _total, top, top_losers = min(scored, key=lambda x: (x[0], x[1]))
    if top != chosen:
        lost = ", ".join(f"{o.key.label()} {r:.4f}x" for o, r in top_losers)
        notes.append(f"process-wide knobs: {_knobs_text(top)} has the best geometric mean but would run "
                     f"{lost} of NCCL's default; {_knobs_text(chosen)} is published instead")
        for o, r in top_losers:
            o.notes.append(f"process-wide knobs left at {_knobs_text(chosen)}: {_knobs_text(top)} "
                           f"would run this at {r:.4f}x of NCCL's default")
    elif len(cands) > 1:
        notes.append(f"process-wide knobs: {_knobs_text(chosen)} (best geometric mean over {len(scored)} "
                     "candidates, no task slower than NCCL's default)")
    return chosen


def _knobs_text(g: Knobs) -> str:
    return f"transport {g[0]}, NCCL_NTHREADS {g[1]}, NCCL_BUFFSIZE {g[2]}"


def _measurable(space: TaskSpace, cfg: Config, prof: Profiler) -> bool:
    if isinstance(prof, ReplayProfiler):
        try:
            sub = space.subspace(cfg.impl)
        except KeyError:
            return False
        return sub.contains(cfg.point)
    return True


def _as_nccl_runs(default: Config, g: tuple[str, int, int], size: int) -> Config:
    """NCCL's own per-call choice under the process-wide knobs: NCCL still shrinks channels and
    threads for small messages from NCCL_NTHREADS (see default.shrink_resources)."""
    transport, threads, buff = g
    proto = default.impl.protocol
    nt = default.threads if proto == "LL128" else threads
    nc, nt = shrink_resources(size, proto, default.channels, nt) if default.impl.algorithm != "p2p" else (default.channels, nt)
    return Config(Impl(default.impl.algorithm, proto, transport), nc, nt, buff if proto == "Simple" else default.buffsize)


def _finish(outcome: TaskOutcome, runs: _Runs, g: Knobs, synthesized: SynthSource | None,
            variant_file: VariantFile | None = None, files: dict[str, str] | None = None) -> None:
    o, prof = outcome, runs.prof
    if o.searched is not None and o.deployed is not None:
        best = runs.best(o, None, g)
        assert best is not None
        cfg, m, kept = best
        if kept and o.deployed != o.default:
            o.notes.append("tuned settings lost under the process-wide knobs: NCCL's choice kept")
        o.deployed, o.chosen_measure, o.kept_default = cfg, m, kept
    cands: list[SynthCandidate] = [o.variant] if o.variant is not None else []
    replay_synth = getattr(prof, "synthesized_measures", None)
    if replay_synth is not None:
        cands += [SynthCandidate(n, m) for n, m in replay_synth(o.key, o.size).items()]
    if synthesized is not None:
        cands += list(synthesized(o.key, o.size))
    nccl_measure = o.chosen_measure
    for cand in cands:
        if cand.measurement.time_us < o.chosen_measure.time_us:
            o.synthesized, o.chosen_measure = cand, cand.measurement
    if variant_file is not None and o.variant is not None and o.synthesized is o.variant:
        _variant_file(o, variant_file, [c for c in cands if c is not o.variant], nccl_measure, files)
    for what, m in (("NCCL's default", o.default_measure), ("the chosen time", o.chosen_measure)):
        if m.note.startswith("interpolated"):  # replay: not a measured point, say so
            o.notes.append(f"{what} is {m.note} (not measured at {o.size} bytes)")
    if o.synthesized is not None and o.synthesized is o.variant and variant_file is None:
        o.notes.append(f"MSCCL variant {o.variant.name} won the joint search; publish the schedule file it was "
                       "measured with (runtime msccl/rccl); the tuner row is the best NCCL setting, for other calls")
    if o.deployed is None and o.default is None:
        o.notes.append("NCCL keeps its own choice here (no configuration known to pin)")


def _variant_file(o: TaskOutcome, variant_file: VariantFile, others: list[SynthCandidate],
                  nccl_measure: Measurement, files: dict[str, str] | None) -> None:
    """The winning variant with its schedule file, or (no such file) the next best candidate."""
    assert o.variant is not None and o.variant.config is not None
    found = variant_file(o.key, o.variant.config)
    if found is None:
        return
    if isinstance(found, tuple):
        path, xml = found
        o.synthesized = replace(o.variant, msccl_file=path)
        if files is not None:
            files[path] = xml
        o.notes.append(f"MSCCL variant {o.variant.name} won the joint search: {path} is the file it was measured "
                       "with; the tuner row is the best NCCL setting, for other calls")
        return
    o.notes.append(f"MSCCL variant {o.variant.name} won the joint search ({o.variant.measurement.time_us:.2f} us) "
                   f"but is not published: {found}; the next best choice runs")
    o.synthesized, o.chosen_measure = None, nccl_measure
    for cand in others:
        if cand.measurement.time_us < o.chosen_measure.time_us:
            o.synthesized, o.chosen_measure = cand, cand.measurement


_MAY_BE_REFUSED = ("nvls", "nvls_tree", "collnet_direct", "collnet_chain")


def _fallback(o: TaskOutcome, runs: _Runs, g: Knobs, space: TaskSpace, facts: FabricFacts,
              version: tuple[int, int]) -> Config | None:  # fmt: skip
    """For a pinned choice NCCL may refuse at a call (NVLS: data type or driver; CollNet: SHARP),
    the best searched ring/tree configuration, if it is no slower than NCCL's default either."""
    if o.kept_default or o.deployed is None or o.searched is None or o.deployed.impl.algorithm not in _MAY_BE_REFUSED:
        return None
    trials = [t for t in o.searched.trials if t.config.impl.algorithm in ("ring", "tree") and not t.pruned]
    if not trials:
        return None
    cfg = _apply(min(trials, key=lambda t: (t.value, t.config)).config, g)
    try:
        check_config(Collective(o.key.collective), cfg, facts, version)
    except ValueError:
        return None
    if not _measurable(space, cfg, runs.prof):
        return None
    m = runs.measure(o, cfg)
    if m.time_us > o.default_measure.time_us:
        return None
    o.notes.append(f"fallback row when NCCL does not offer {o.deployed.impl.algorithm}: {cfg.label()}, "
                   f"{o.default_measure.time_us / m.time_us:.2f}x of NCCL's default ({m.source})")
    return cfg


def _global_env(g: tuple[str, int, int], outcomes: list[TaskOutcome], facts: list[FabricFacts]) -> dict[str, str]:
    env: dict[str, str] = {}
    deployed = [o.deployed for o in outcomes if o.deployed is not None and o.searched is not None]
    if not deployed:
        return env
    transport, threads, buff = g
    if any(c.impl.protocol != "LL128" for c in deployed) and threads != DEFAULT_THREADS:
        env["NCCL_NTHREADS"] = str(threads)
    if any(c.impl.protocol == "Simple" for c in deployed) and buff != DEFAULT_BUFFSIZE:
        env["NCCL_BUFFSIZE"] = str(buff)
    if transport != "p2p":
        env.update(transport_env(transport))
    most = max(c.channels for c in deployed)
    if most > min(default_channels(f) for f in facts):
        # The communicator must build enough channels for the tuner to hand out (NCCL caps the
        # tuner's count at the channels it set up; NCCL_MIN_NCHANNELS, NCCL env docs).
        env["NCCL_MIN_NCHANNELS"] = str(most)
    return env


__all__ = [
    "NCCL_CONF_FILE",
    "TUNER_FILE",
    "SynthCandidate",
    "TaskOutcome",
    "TuningResult",
    "VariantFile",
    "communicator_topology",
    "make_profiler",
    "tune_tasks",
]
