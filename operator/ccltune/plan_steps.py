"""Synthesis and tuning as steps of the planning pipeline (pipeline.build_plan).

Tuning runs first (NCCL's knobs per task key, simulated profiler offline); synthesis then
offers an MSCCL schedule per size range, which replaces the task's choice at a size only where
its simulated time beats the choice made so far. Both keep every estimate's source.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path

from .api.ccltuning import CCLTuningSpec
from .api.cluster import ClusterTopology
from .api.common import format_size
from .api.plan import Choice, Estimate, PlanFile, PlanTask, TaskKey
from .model.evaluate import EVALUATOR, NotEvaluable, faster, nccl_estimate, published_estimate
from .model.formats.msccl.limits import first_selected
from .model.formats.msccl.writer import MscclFormatError
from .publish.files import MSCCL_DIR, TUNER_CSV, plan_file
from .publish.runtime import (
    AlgoMeta,
    algo_meta,
    publishable_protocol,
    runs_msccl,
    selected_everywhere,
    selected_file,
)
from .synth.units import SynthesisUnit, Synthesized, synthesize_unit
from .tune.profilers.base import ProfilerError
from .tune.profilers.replay import ReplayProfiler
from .tune.space import MSCCL_PREFIX, Config
from .tune.table import TABLE_FILE
from .tune.tuner import TUNER_FILE, VariantFile, tune_tasks

Progress = Callable[[str], None]


class Judge:
    """Times tuned picks with the common evaluator (model/evaluate.py) against NCCL's default
    there: the surface may pick, but a pick the evaluator times no faster is not published."""

    def __init__(self, baseline: list[PlanTask], subs: list[ClusterTopology]) -> None:
        self.of = {t.key.label(): (t, sub) for t, sub in zip(baseline, subs, strict=True)}
        self.timed: dict[tuple[str, int], Estimate] = {}

    def default_at(self, key: TaskKey, size: int) -> Estimate:
        task, sub = self.of[key.label()]
        for e in task.default_estimates:
            if e.size_bytes == size:
                return e
        return nccl_estimate(key.collective, size, sub)

    def __call__(self, key: TaskKey, size: int, config: Config) -> str | None:
        _, sub = self.of[key.label()]
        choice = Choice(kind="nccl", algorithm=config.impl.algorithm, protocol=config.impl.protocol,
                        channels=config.channels)  # fmt: skip
        default = self.default_at(key, size)
        try:
            est = nccl_estimate(key.collective, size, sub, choice)
        except NotEvaluable as exc:
            return f"tuned {choice.describe()} not published: {exc}; NCCL's default is kept"
        if not faster(est.time_us, default.time_us):
            return (f"tuned {choice.describe()} not published: the {EVALUATOR} times it at "
                    f"{est.time_us:.2f} us, no faster than NCCL's default ({default.time_us:.2f} us)")  # fmt: skip
        self.timed[(key.label(), size)] = est
        return None

    def retime(self, task: PlanTask) -> PlanTask:
        """The tuned task with both sides of every row from the evaluator: NCCL's default from
        the baseline, each published pick as `__call__` timed it."""
        label = task.key.label()
        defaults = [self.default_at(task.key, e.size_bytes) for e in task.chosen_estimates]
        chosen = []
        for c, d in zip(task.chosen_estimates, defaults, strict=True):
            choice = c.choice or task.chosen
            est = self.timed.get((label, c.size_bytes))
            if choice.kind == "nccl" and choice.realized_by not in (None, "NCCL default") and est:
                chosen.append(est.model_copy(update={"choice": choice}))
            else:  # NCCL's own choice runs (a tuner-side MSCCL variant has no file to time)
                chosen.append(d.model_copy(update={"choice": (d.choice or task.default).model_copy(
                    update={"realized_by": "NCCL default"})}))  # fmt: skip
        return task.model_copy(update={"default_estimates": defaults, "chosen_estimates": chosen})


def tune_step(spec: CCLTuningSpec, cluster: ClusterTopology, tasks: list[PlanTask], say: Progress,
              version: str, profiles: Path | None = None,
              judge: Judge | None = None) -> tuple[list[PlanTask], dict[str, str], list[PlanFile], list[str]]:  # fmt: skip
    """Tuned tasks, env, files (tuner CSV) and notes; the tasks unchanged when it cannot run.
    `version`: the NCCL under the runtime (publish/runtime.nccl_version). `profiles`: a directory
    of measured profiles (sweep CSVs, nccl-tests logs) to tune on instead of the simulator."""
    opts = spec.tuning
    if profiles is not None:
        return _tune_on_profiles(spec, cluster, tasks, say, version, profiles)
    if opts.profiler != "simulated":
        why = ("needs the replay ConfigMap, which only the operator reads"
               if opts.profiler == "replay" else "runs nccl-tests on GPU nodes (operator Jobs)")  # fmt: skip
        return tasks, {}, [], [f"tuning: profiler {opts.profiler} {why}; NCCL defaults are used"]
    say(f"tuning {len(tasks)} task(s): {opts.searcher}, simulated profiler, budget {opts.budget}")
    result = tune_tasks([t.key for t in tasks], cluster, searcher=opts.searcher,
                        profiler="simulated", budget=opts.budget, seed=opts.seed,
                        nccl_version=version, keep=judge)  # fmt: skip
    files = [plan_file(TUNER_CSV, result.files[TUNER_FILE])] if TUNER_FILE in result.files else []
    if TABLE_FILE in result.files:  # read by ccltune's tuner plugin (nccl-plugin/)
        files.append(plan_file(TABLE_FILE, result.files[TABLE_FILE]))
    tuned = result.plan_tasks_by_key()
    if judge is not None:
        tuned = [judge.retime(t) for t in tuned]
    return tuned, dict(result.env), files, [
        f"tuning: {n}" for n in result.notes
    ]


def _tune_on_profiles(spec: CCLTuningSpec, cluster: ClusterTopology, tasks: list[PlanTask], say: Progress,
                      version: str, profiles: Path) -> tuple[list[PlanTask], dict[str, str], list[PlanFile], list[str]]:  # fmt: skip
    """Tuning on measured data: tasks the profiles have no sizes for keep NCCL's defaults."""
    opts = spec.tuning
    runtime = spec.publish.runtime
    # Gaps between measured sizes of one configuration are interpolated (labelled); nothing else.
    # MSCCL variant rows (msccl:<name>) join the search where the runtime runs MSCCL files.
    profiler = ReplayProfiler.from_dir(profiles, fallback="interpolate", runtime=runtime)
    say(f"tuning {len(tasks)} task(s): {opts.searcher}, measured profiles from {profiles}, budget {opts.budget}")
    # A winning variant is matched to the plan's synthesized file of its name (synth_step).
    synthesizes = spec.synthesis.enabled and runs_msccl(runtime)
    pending: VariantFile = (lambda _k, _c: None) if synthesizes else variant_resolver(
        {}, "the plan's synthesized files (synthesis is off)")
    try:
        result = tune_tasks([t.key for t in tasks], cluster, searcher=opts.searcher, profiler=profiler,
                            budget=opts.budget, seed=opts.seed, nccl_version=version,
                            variant_file=pending)  # fmt: skip
    except ProfilerError as exc:
        return tasks, {}, [], [f"tuning: the measured profiles in {profiles} cannot tune these tasks ({exc}); "
                               "NCCL defaults are used"]
    except ValueError as exc:
        if "no sizes for any task" not in str(exc):
            raise
        return tasks, {}, [], [f"tuning: the measured profiles in {profiles} hold no size of these tasks; "
                               "NCCL defaults are used"]
    tuned = {t.key.label(): t for t in result.plan_tasks_by_key()}
    files = [plan_file(TUNER_CSV, result.files[TUNER_FILE])] if TUNER_FILE in result.files else []
    if TABLE_FILE in result.files:
        files.append(plan_file(TABLE_FILE, result.files[TABLE_FILE]))
    notes = [f"tuning: {n}" for n in [*profiler.notes, *result.notes]]
    return [tuned.get(t.key.label(), t) for t in tasks], dict(result.env), files, notes


def schedule_files(directory: Path) -> dict[str, str]:
    """MSCCL schedule files beside measured profiles (DIR/*.xml, DIR/msccl/*): name -> XML."""
    found = sorted(directory.glob("*.xml")) + sorted(p for p in (directory / "msccl").glob("*") if p.is_file())
    return {p.name: p.read_text(encoding="utf-8") for p in found}


def _file_named(schedule: str, names: Mapping[str, str]) -> str | None:
    """The file a variant `msccl:<schedule>` names: `<schedule>` or `<schedule>.xml`, or a plan's
    published `t<i>-<schedule>[.xml]` (names maps a name the variant may use to the file's key)."""
    for candidate in (schedule, f"{schedule}.xml"):
        if candidate in names:
            return names[candidate]
    return None


def variant_mismatch(name: str, text: str, key: TaskKey, protocol: str | None, nchannels: int | None) -> str | None:
    """Why file `name` is not the schedule the variant measured, or None. The executor reads
    coll, ngpus, proto and nchannels from the <algo> tag (msccl-executor-nccl msccl_parser.cc);
    a variant's channels x instances is the file's nchannels."""
    try:
        algo = ET.fromstring(text)
    except ET.ParseError as exc:
        return f"{name} is not XML ({exc})"
    a = algo.attrib
    want = {"coll": str(key.collective), "ngpus": str(key.ranks), "proto": str(protocol), "nchannels": str(nchannels)}
    wrong = [f"{k}={a.get(k)!r}, the variant {v!r}" for k, v in want.items() if a.get(k) != v]
    if algo.tag != "algo" or wrong:
        return f"{name} is another schedule ({'; '.join(wrong) or 'root is not <algo>'})"
    return None


def variant_resolver(files: Mapping[str, str], where: str) -> VariantFile:
    """Matches a winning variant `msccl:<name>` to the file of that name in `files`."""
    def resolve(key: TaskKey, config: Config) -> tuple[str, str] | str:
        schedule = config.impl.algorithm.removeprefix(MSCCL_PREFIX)
        name = _file_named(schedule, {n: n for n in files})
        if name is None:
            return f"no schedule file named {schedule} (or {schedule}.xml) in {where}"
        why = variant_mismatch(name, files[name], key, config.impl.protocol, config.channels * config.instances)
        return why or (f"{MSCCL_DIR}/{name}", files[name])
    return resolve


def _revert(task: PlanTask, before: list[Estimate], sizes: set[int],
            before_defaults: list[Estimate] | None = None) -> PlanTask:  # fmt: skip
    """The task with its estimates at `sizes` back to what ran before synthesis (and its
    defaults, which synthesis may have re-timed with the common evaluator)."""
    old = {e.size_bytes: e for e in before_defaults or task.default_estimates}
    prior = {**old, **{e.size_bytes: e for e in before}}
    # Synthesis only offers sizes of the default estimates, so every size has a prior.
    estimates = [prior[e.size_bytes] if e.size_bytes in sizes else e for e in task.chosen_estimates]
    defaults = [old.get(e.size_bytes, e) if e.size_bytes in sizes else e for e in task.default_estimates]
    return task.model_copy(update={"chosen_estimates": estimates, "default_estimates": defaults})


def _why_not(metas: list[AlgoMeta], claim: AlgoMeta, size: int) -> str:
    for place in claim.placements():
        other = selected_file(metas, claim.collective, claim.ranks, size, place)
        if other and other != claim.path:
            return f"{other} comes first"
    return (f"count x {claim.multiplier} is not a multiple of nchunksperloop "
            f"{claim.chunks_per_loop}, or the size is outside [minBytes, maxBytes]")  # fmt: skip


def msccl_step(runtime: str, tasks: list[PlanTask], before: list[list[Estimate]], files: list[PlanFile],
               before_defaults: list[list[Estimate]] | None = None) -> tuple[list[PlanTask], list[PlanFile], list[str]]:  # fmt: skip
    """MSCCL rows only where the runtime's scheduler selects their file; unclaimed files dropped.

    `before[i]`: task i's chosen estimates before synthesis, restored where a file is not run.
    Removing a file changes what the others win against, so this repeats until nothing changes.
    """
    metas = {f.path: algo_meta(f.path, f.content) for f in files}
    notes = [f"{p}: not published, runtime {runtime} does not run {m.protocol} MSCCL files"
             for p, m in sorted(metas.items()) if not publishable_protocol(runtime, m.protocol)]  # fmt: skip
    metas = {p: m for p, m in metas.items() if publishable_protocol(runtime, m.protocol)}
    while True:
        present = list(metas.values())
        claimed: set[str] = set()
        reverted = False
        for i, task in enumerate(tasks):
            lost: dict[str, list[int]] = {}
            for e in task.chosen_estimates:
                path = e.choice.msccl_file if e.choice and e.choice.kind == "msccl" else None
                if path is None:
                    continue
                if path in metas and selected_everywhere(present, metas[path], e.size_bytes):
                    claimed.add(path)
                else:
                    lost.setdefault(path, []).append(e.size_bytes)
            for path, sizes in lost.items():
                why = _why_not(present, metas[path], sizes[0]) if path in metas else "not published"
                notes.append(f"{path}: not selected by the {runtime} scheduler at "
                             f"{', '.join(format_size(s) for s in sizes)} ({why}); the choice "
                             "made before synthesis is reported there")  # fmt: skip
                tasks[i] = _revert(tasks[i], before[i], set(sizes),
                                   before_defaults[i] if before_defaults else None)  # fmt: skip
                reverted = True
        unused = set(metas) - claimed
        if not unused and not reverted:
            break
        for path in unused:
            del metas[path]
    tasks = [_label_msccl(t) for t in tasks]
    notes += _shadowing_notes(tasks, list(metas.values()))
    return tasks, [f for f in files if f.path in metas], notes


def _label_msccl(task: PlanTask) -> PlanTask:
    estimates = []
    for e in task.chosen_estimates:
        if e.choice is not None and e.choice.kind == "msccl":
            e = e.model_copy(update={"choice": e.choice.model_copy(
                update={"realized_by": e.choice.msccl_file})})  # fmt: skip
        estimates.append(e)
    top = estimates[-1].choice if estimates and estimates[-1].choice else task.chosen
    return task.model_copy(update={"chosen_estimates": estimates, "chosen": top})


def _shadowing_notes(tasks: list[PlanTask], metas: list[AlgoMeta]) -> list[str]:
    """Sizes a task leaves to NCCL where a file published for another task of the same
    collective and rank count is selected: the scheduler cannot tell communicators apart."""
    notes = []
    for task in tasks:
        key = task.key
        runs: dict[str, list[int]] = {}
        for e in task.chosen_estimates:
            if e.choice is not None and e.choice.kind == "msccl":
                continue
            for place in (True, False):
                path = selected_file(metas, str(key.collective), key.ranks, e.size_bytes, place)
                if path and e.size_bytes not in runs.get(path, []):
                    runs.setdefault(path, []).append(e.size_bytes)
        notes += [f"{key.label()}: at {', '.join(format_size(s) for s in sizes)} the scheduler runs "
                  f"{path}, published for another task of the same collective and rank count "
                  "(it cannot tell communicators apart)" for path, sizes in sorted(runs.items())]  # fmt: skip
    return notes


def realize_step(task: PlanTask) -> PlanTask:
    """Every chosen estimate names what makes the runtime do it; a per-call NCCL choice that
    nothing carries (no tuner row) is replaced by NCCL's default, which is what runs."""
    rows, lost = [], []
    for d, c in zip(task.default_estimates, task.chosen_estimates, strict=True):
        choice = c.choice or task.chosen
        if choice.realized_by:  # a tuner row, or an MSCCL file msccl_step checked
            rows.append(c)
        elif choice.kind != "msccl" and _same_call(choice, d.choice or task.default):
            by = "NCCL default" if c.time_us == d.time_us else "nccl.conf"
            rows.append(c.model_copy(update={"choice": choice.model_copy(update={"realized_by": by})}))
        else:
            lost.append(format_size(c.size_bytes))
            dflt = (d.choice or task.default).model_copy(update={"realized_by": "NCCL default"})
            rows.append(d.model_copy(update={"choice": dflt}))
    notes = list(task.notes)
    if lost:
        notes.append(f"choices at {', '.join(lost)} have nothing to carry them on this runtime (no "
                     "tuner-table row or MSCCL file): NCCL's default is reported there")  # fmt: skip
    top = rows[-1].choice if rows and rows[-1].choice else task.chosen
    return task.model_copy(update={"chosen_estimates": rows, "chosen": top, "notes": notes})


def _same_call(a: Choice, b: Choice) -> bool:
    return (a.kind, a.algorithm, a.protocol, a.channels) == (b.kind, b.algorithm, b.protocol, b.channels)


def _reference(here: Estimate | None, default: Estimate, sub: ClusterTopology, task: PlanTask) -> Estimate:
    """What runs at a size so far, timed by the common evaluator (a replayed tuned pick is
    re-timed; one the evaluator cannot time is compared as NCCL's default)."""
    if here is None or here.evaluator == EVALUATOR:
        return here or default
    choice = here.choice
    if choice is not None and choice.kind == "nccl" and choice.realized_by != "NCCL default":
        try:
            return nccl_estimate(task.key.collective, here.size_bytes, sub, choice)
        except NotEvaluable:
            pass
    return default


def synthesis_unit(spec: CCLTuningSpec, sub: ClusterTopology, task: PlanTask,
                   index: int) -> SynthesisUnit:  # fmt: skip
    """The synthesis synth_step needs for this task (run here, in a pool or in a shard)."""
    return SynthesisUnit(index, sub, task.key.collective,
                         tuple(e.size_bytes for e in task.default_estimates),
                         spec.synthesis.max_threadblocks)  # fmt: skip


def synth_step(spec: CCLTuningSpec, sub: ClusterTopology, task: PlanTask, index: int,
               say: Progress, baseline: PlanTask | None = None,
               done: Synthesized | None = None) -> tuple[PlanTask, list[PlanFile]]:  # fmt: skip
    """The task with MSCCL where a synthesized schedule is faster; its XML files. Both sides are
    timed by the common evaluator: `baseline` holds its NCCL-default estimates. `done`: this
    task's synthesis run elsewhere (a pool, a shard), used when it was run for the same sizes."""
    key = task.key
    unit = synthesis_unit(spec, sub, task, index)
    if done is None or done.sizes != unit.sizes:
        say(f"synthesizing {key.collective} on {key.ranks} ranks ({len(unit.sizes)} sizes)")
        done = synthesize_unit(unit)
    xml = dict(done.files)
    # Files over the ConfigMap limit are published packed (publish/configmaps.py).
    notes = [*task.notes, *(f"synthesis: {n}" for n in done.notes)]
    path_of = {name: f"{MSCCL_DIR}/t{index}-{name}" for name in xml}
    file_at: dict[int, tuple[str, str]] = {}  # size -> (published path, file name)
    sizes_of: dict[str, list[int]] = {}  # file name -> the sizes its range was built for
    for name, range_sizes in done.ranges:
        if name in path_of:
            sizes_of[name] = list(range_sizes)
            for size in range_sizes:
                file_at[size] = (path_of[name], name)
    # What the task runs so far at each size: tuning's buckets, else NCCL's default.
    current = {e.size_bytes: e for e in [*task.default_estimates, *task.chosen_estimates]}
    defaults = {e.size_bytes: e for e in task.default_estimates}
    common = {e.size_bytes: e for e in (baseline or task).default_estimates}
    used: set[str] = set()
    claimed: dict[str, list[int]] = {}
    measured = _measured_variants(task, xml, path_of, current, defaults, notes)
    for size, (name, path) in measured.items():
        used.add(path)
        claimed.setdefault(name, []).append(size)
    unrunnable: set[str] = set()
    for size, chosen, protocol in done.picks:
        if size not in file_at or size not in common or size in measured or file_at[size][1] in unrunnable:
            continue
        path, name = file_at[size]
        choice = Choice(kind="msccl", algorithm=chosen, protocol=protocol, msccl_file=path)
        # The file as written decides (its threadblocks serialize what the engine's schedule
        # overlaps): a row, and its file, only where that beats the reference.
        try:
            est = published_estimate(key.collective, size, sub, xml[name], choice)
        except MscclFormatError as exc:  # e.g. merged threadblocks the executor would block on
            unrunnable.add(name)
            notes.append(f"synthesis: {name} not published: read back as the executor runs it, {exc}")
            continue
        ref = _reference(current.get(size), common[size], sub, task)
        if faster(est.time_us, ref.time_us):
            current[size] = est
            defaults[size] = common[size]  # its default from the same evaluator
            used.add(path)
            claimed.setdefault(name, []).append(size)
    estimates = [current[size] for size in sorted(current)]
    if not done.symmetric:
        notes.append("synthesis: asymmetric communicator, NCCL kept (see the note above)")
    top = estimates[-1].choice if estimates and estimates[-1].choice else task.chosen
    renamed: dict[str, str] = {}  # old published path -> the path naming the narrowed range
    for name, got in claimed.items():
        if name in sizes_of and set(got) <= set(sizes_of[name]):
            text = _narrowed(xml[name], sizes_of[name], sorted(got))
            if text != xml[name] and (new := _range_named(name, text)) != name:
                renamed[path_of[name]] = f"{MSCCL_DIR}/t{index}-{new}"
            xml[name] = text
    if renamed:
        estimates = [_repointed(e, renamed) for e in estimates]
        top = estimates[-1].choice if estimates and estimates[-1].choice else top
        used = {renamed.get(p, p) for p in used}
        path_of = {n: renamed.get(p, p) for n, p in path_of.items()}
    files = [plan_file(p, xml[name]) for name, p in path_of.items() if p in used]
    return task.model_copy(update={
        "chosen_estimates": estimates, "chosen": top, "notes": notes,
        "default_estimates": [defaults[size] for size in sorted(defaults)],
    }), files  # fmt: skip


def _measured_variants(task: PlanTask, xml: dict[str, str], path_of: dict[str, str], current: dict[int, Estimate],
                       defaults: dict[int, Estimate], notes: list[str]) -> dict[int, tuple[str, str]]:
    """Measured MSCCL variants (plan --profiles) matched to this task's synthesized file of their
    name: size -> (file name, published path). Unmatched sizes get NCCL's default, with a note."""
    names = {**{n: n for n in xml}, **{Path(p).name: n for n, p in path_of.items()}}
    found: dict[int, tuple[str, str]] = {}
    lost: dict[str, list[int]] = {}
    for size, est in sorted(current.items()):
        ch = est.choice
        if ch is None or ch.kind != "msccl" or ch.msccl_file is not None or not ch.algorithm:
            continue
        schedule = ch.algorithm.rsplit("/", 1)[0]  # "<schedule>/<protocol> <c>ch x<i>" (tune/tuner.py)
        name = _file_named(schedule, names)
        why = (f"no synthesized file is named {schedule}" if name is None
               else variant_mismatch(name, xml[name], task.key, ch.protocol, ch.channels))
        if why is None and name is not None:
            path = path_of[name]
            current[size] = est.model_copy(update={"choice": ch.model_copy(update={"msccl_file": path})})
            found[size] = (name, path)
        else:
            current[size] = defaults.get(size, est)  # no default here: realize_step reverts it
            lost.setdefault(f"{ch.algorithm}: {why}", []).append(size)
    notes += [f"measured MSCCL variant {what} at {', '.join(format_size(s) for s in sizes)}; NCCL's default is "
              "reported there (the tuner row for the range still applies)" for what, sizes in lost.items()]
    return found


_RANGE_NAME = re.compile(r"^(?P<head>[a-z]+-\d+r)-[^-]+-[^-]+-(?P<proto>[A-Za-z0-9]+)\.xml$")


def _range_named(name: str, text: str) -> str:
    """A synthesized file's name with the range it is selected for after narrowing (names the
    engine gave: `<coll>-<n>r-<lo>-<end>-<proto>.xml`; any other name is kept)."""
    m = _RANGE_NAME.match(name)
    if m is None:
        return name
    meta = algo_meta("", text)
    end = "inf" if meta.max_bytes == 0 else format_size(meta.max_bytes + 1)
    return f"{m['head']}-{format_size(max(meta.min_bytes, 1))}-{end}-{m['proto']}.xml"


def _repointed(e: Estimate, renamed: dict[str, str]) -> Estimate:
    ch = e.choice
    if ch is None or ch.msccl_file not in renamed:
        return e
    return e.model_copy(update={"choice": ch.model_copy(update={"msccl_file": renamed[ch.msccl_file]})})


def _narrowed(text: str, sizes: list[int], claimed: list[int]) -> str:
    """The file with [minBytes, maxBytes] cut to the sizes its file time won, where those are
    one run of its range (else msccl_step reports the sizes the scheduler still gives it)."""
    i = sizes.index(claimed[0])
    if claimed == sizes or sizes[i:i + len(claimed)] != claimed:
        return text
    meta = algo_meta("", text)
    hi = sizes[i + len(claimed)] - 1 if i + len(claimed) < len(sizes) else meta.max_bytes
    lo = meta.min_bytes
    if i > 0:
        start = first_selected(meta.collective, meta.ranks, meta.chunks_per_loop, claimed[0], hi)
        if start is None or start > claimed[0]:
            return text
        lo = start
    head = text[:text.index(">")]  # the <algo ...> tag: the executor selects by these two
    head = re.sub(r'minBytes="\d+"', f'minBytes="{lo}"', head)
    head = re.sub(r'maxBytes="\d+"', f'maxBytes="{hi}"', head)
    return head + text[text.index(">"):]


__all__ = ["msccl_step", "realize_step", "schedule_files", "synth_step", "synthesis_unit", "tune_step",
           "variant_mismatch", "variant_resolver"]
