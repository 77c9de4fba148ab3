"""`synthesize`: SyCCL's pipeline from a symmetric cluster to MSCCL files per size range.

1. sketch search with the three prunings (sketch.py);
2. coarse step: every distinct sub-demand of every sketch solved once with 1 piece (milp.py,
   shard.py); a bandwidth/latency estimate from the solved patterns ranks the sketches and an
   LP over the sketches' per-port loads gives split ratios (combine.py); the best K are kept;
3. fine step: the top K's sub-demands solved again with more pieces (shorter epochs);
4. evaluation: candidate schedules assembled (assemble.py) and simulated at every size with
   every protocol; at every 4th size (and next to one NCCL won) the engine's best two are
   timed as the files they would be (lowered with each of the writer's threadblock pairings,
   read back and simulated: model/evaluate.published_estimate), and the faster file or NCCL's default choice (simulated
   with the same simulator) wins; equal neighbours merge into size ranges;
5. output: one MSCCL XML per synthesized range, checked by model.check before it is written.

Every variant is fitted to msccl-executor-nccl (`_deals`): its channels are dealt so that each
GPU needs at most the SM budget's threadblocks; a variant is lowered exactly when it would be
used, and dropped (with a note) when a threadblock would need more steps than the executor holds
or a rank's part of the file more XML nodes. At each size only variants the executor would
select there are tried: chunks per rank must divide every size a framework calls
(model/msccl_limits.py).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..api.cluster import ClusterTopology, Dimension
from ..api.common import Collective, Source, format_size
from ..api.plan import Estimate
from ..model.cost.busbw import algbw_gbps, busbw_gbps
from ..model.cost.gpu import gpu_physics
from ..model.cost.protocols import protocol_cost
from ..model.formats.msccl.limits import MAX_CHANNELS, MAX_COUNT, MAX_STEPS, first_selected
from ..model.formats.msccl.slicing import iterations_to_simulate, slicing
from ..model.formats.msccl.stream import render_lowering, write_lowering, write_retitled
from ..model.formats.msccl.writer import MscclFormatError, MscclLowering, lower_msccl
from ..model.nccl.default import default_estimate, nccl_default, nccl_graph
from ..model.published_bound import FileShape, file_shape, published_lower_bound
from ..model.schedule.ir import Schedule, ScheduleArrays
from ..model.sim.routing import Router
from ..model.sim.simulate import simulate
from . import DEFAULT_WORK_BUDGET, mesh, side, tier_ring, timed
from . import alltoall as a2a
from . import assemble as asm
from . import rail_ring as rings
from . import rail_ring_reduce as rrr
from . import reduce_bundled as rb
from . import reduce_small as rsm
from .combine import Candidate, candidates, port_payload_gbps
from .grid import FILE_FINALISTS, AtLeast, as_protocol, evaluation_order, file_time
from .milp import SubSchedule
from .shard import solve_all
from .sketch import SearchStats, Sketch, search

Progress = Callable[[str, float], None]  # (message, fraction done 0..1)


MAX_CHUNKS = 32  # chunks per root in a pipelined variant (transfers grow with it)
# Above 64 ranks a 512-rank variant holds ~0.26M transfers per chunk of a root.
MAX_CHUNKS_LARGE = 48
MAX_CHUNKS_SMALL = 8
# ReduceScatter/AllReduce variants with reduces chained in rounds (assemble.reduce_rounds) run
# from this size up, screened apart from the others: below it their files lost to the emission
# order's (docs/synthesis.md, "syccl-a800-16 ReduceScatter (session 9)").
ROUNDS_FROM = 16 << 20
RING_SLACK = 1.05  # rail-ring files timed up to this much slower as schedules (below)
# Branch-and-bound nodes per sub-demand MILP. Work limits, not the time budget, bound the solves,
# so the same request gives the same patterns on any machine (the budget only cuts evaluation).
COARSE_NODES = 500
FINE_NODES = 2000


def _protocols(size: int) -> tuple[str, ...]:
    """Protocols that can win at `size` (LL's half-rate wire format loses above ~1 MiB)."""
    if size <= 256 << 10:
        return ("LL", "LL128")
    if size <= 64 << 20:
        return ("LL128", "Simple")
    return ("Simple",)


@dataclass
class SizeResult:
    size_bytes: int
    chosen: str  # candidate label or "nccl:<algo>/<proto>"
    protocol: str
    estimate: Estimate  # the chosen schedule's simulated time
    default: Estimate  # NCCL's default choice, simulated
    synthesized: Estimate | None  # best synthesized candidate, even when NCCL won
    bound_us: float
    reason: str


@dataclass
class RangeResult:
    min_bytes: int
    max_bytes: int  # inclusive; 0 = no upper limit (MSCCL's convention)
    kind: str  # "msccl" | "nccl"
    label: str
    protocol: str
    channels: int
    sizes: list[SizeResult]
    xml_file: str | None = None
    reason: str = ""
    file_min_bytes: int = 0  # the file's minBytes: from the range's smallest evaluated size
    threadblocks: int = 0  # per GPU, in the file


@dataclass
class SynthesisResult:
    cluster: str
    collective: Collective
    nranks: int
    sizes: list[SizeResult]
    ranges: list[RangeResult]
    notes: list[str] = field(default_factory=list)
    budget_exhausted: bool = False
    work: int = 0  # work units spent (transfers assembled or simulated; DEFAULT_WORK_BUDGET)
    symmetric: bool = True
    max_threadblocks: int = 0  # the SM budget the files were fitted to
    stats: SearchStats | None = None
    timings: dict[str, float] = field(default_factory=dict)
    subschedules: list[SubSchedule] = field(default_factory=list)
    schedules: dict[str, ScheduleArrays] = field(default_factory=dict)




class SynthesisDeadline(RuntimeError):
    """The wall-clock deadline passed: nothing is returned rather than a cut-short result."""


class _Work:
    """Counts work, so that where the budget cuts evaluation does not depend on the machine.
    The optional deadline never changes a result: past it synthesis stops with an error."""

    def __init__(self, budget: int, deadline_s: float | None) -> None:
        self.start = time.perf_counter()
        self.budget = budget
        self.spent = 0
        self.deadline_s = deadline_s
        self.on_deadline: Callable[[], None] = lambda: None

    def spend(self, units: int) -> None:
        self.spent += units
        if self.deadline_s is not None and time.perf_counter() - self.start > self.deadline_s:
            self.on_deadline()
            raise SynthesisDeadline(f"synthesis ran past its time budget of {self.deadline_s:g} s "
                                    f"({self.spent:,} work units spent)")  # fmt: skip

    def out(self) -> bool:
        return self.spent >= self.budget


def synthesize(
    topo: ClusterTopology,
    collective: Collective | str,
    sizes: list[int],
    *,
    work_budget: int = DEFAULT_WORK_BUDGET,
    time_budget_s: float | None = None,
    workers: int = 1,
    out_dir: Path | str | None = None,
    top_k: int = 2,
    progress: Progress | None = None,
    root: int = 0,
    max_threadblocks: int | None = None,
    milp_nodes: tuple[int, int] = (COARSE_NODES, FINE_NODES),
    evaluate: bool = True,
) -> SynthesisResult:
    """Synthesize `collective` on `topo` for `sizes` (nccl-tests' size convention), with at
    most `max_threadblocks` threadblocks per GPU (default: NCCL's channel count there).
    `milp_nodes`: branch-and-bound nodes per sub-demand MILP, coarse and fine; (0, 0) keeps
    the greedy patterns (benchmarks/milp_gain.py compares the two).
    `work_budget`: transfers assembled or simulated before evaluation is cut short (the same
    request gives the same result on any machine); `time_budget_s`: a wall-clock deadline that
    raises SynthesisDeadline instead of returning a result it shaped.
    `evaluate=False` stops once the variants are assembled (`result.schedules`; no sizes,
    ranges or files): the simulator's own tests need schedules, not a synthesis."""
    coll = Collective(collective)
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] <= 0:
        raise ValueError("sizes: give at least one positive size")
    if max_threadblocks is not None and max_threadblocks < 1:
        raise ValueError("max_threadblocks: give at least 1")
    if work_budget < 1:
        raise ValueError("work_budget: give at least 1")
    say = progress or (lambda _m, _f: None)
    clock = _Work(work_budget, time_budget_s)
    router = Router(topo)
    result = SynthesisResult(topo.name, coll, topo.world_size, [], [])
    result.max_threadblocks = max_threadblocks or default_threadblocks(coll, topo, sizes)
    if topo.dimensions is None or topo.world_size < 2:
        why = topo.asymmetry_reason or "a single GPU has nothing to synthesize"
        result.symmetric = False
        result.notes.append(f"no synthesis: {why}; NCCL's default choice is used at every size")
        say("asymmetric: NCCL baselines only", 0.1)
        for s in sizes:
            d = default_estimate(coll, s, topo, router=router)
            result.sizes.append(_nccl_size(coll, s, topo, d, f"asymmetric topology: {why}"))
        meshed: dict[str, MscclLowering] = {}
        at = len(result.notes) - 1
        if _mesh_sizes(result, topo, coll, router, milp_nodes[1], meshed):
            result.notes[at] = (f"no symmetric dimensions ({why}): synthesized on the server's "
                                "GPU mesh alone (synth/mesh.py); NCCL's default where faster")  # fmt: skip
        result.ranges = _ranges(result.sizes, result.schedules, coll, topo, out_dir, result,
                                meshed)  # fmt: skip
        result.timings["total_s"] = time.perf_counter() - clock.start
        return result

    dims = topo.dimensions
    fab = asm.Fabric(dims)
    # NCCL's reference per size starts now, in its own process when workers allow.
    refs = side.References(coll, topo, router, [sizes[i] for i in evaluation_order(len(sizes))[1]],
                           workers if evaluate else 1)  # fmt: skip
    clock.on_deadline = refs.close
    # AlltoAll: sizes where NCCL's p2p is at the bound are not searched (synth/alltoall.py).
    # Known before the search in one process; with a reference process, after assembly (the
    # references run beside it), which then only spares the evaluation.
    known: dict[int, side.Reference] = {}
    closed: dict[int, float] = {}

    def all_closed() -> bool:
        known.update({s: refs.at(s) for s in sizes})
        closed.update(a2a.at_bound(topo, sizes, result.max_threadblocks,
                                   {s: d for s, (d, _) in known.items()}))  # fmt: skip
        if len(closed) < len(sizes):
            return False
        refs.close()
        result.notes.append("NCCL's default is at the lower bound at every size, counting the "
                            "kernel launch the bound column leaves out: nothing to synthesize")  # fmt: skip
        result.sizes = [_pick(coll, s, topo, d, None, b, a2a.closed_reason(d.time_us, closed[s]))
                        for s, (d, b) in known.items()]  # fmt: skip
        result.ranges = _ranges(result.sizes, {}, coll, topo, out_dir, result)
        result.timings["total_s"] = time.perf_counter() - clock.start
        return True

    early = coll == Collective.ALLTOALL and evaluate and workers <= 1
    if early and all_closed():
        return result
    # One threadblock per peer at least: sketches with more peers than the budget cannot run.
    sketches, stats = search(dims, relays=True, max_peers=result.max_threadblocks)
    result.stats = stats
    say(stats.line(), 0.05)
    # Split sketches one cut leaner (sketch.leaner_splits), ranked apart: the best of them is
    # one more candidate and never displaces the coarsest splits'. Only where variants are
    # built aligned: a peer fewer pays there (docs/synthesis.md, "The 3-tier fabric (session 7)").
    leaner: list[Sketch] = []
    if stats.split and _aligns(coll):
        coarsest = set(sketches)
        leaner = [sk for sk in search(dims, relays=True, max_peers=result.max_threadblocks,
                                      leaner=True)[0] if sk not in coarsest]  # fmt: skip

    # Coarse step.
    t0 = time.perf_counter()
    symmetric = coll != Collective.BROADCAST
    coarse = _solve(dims, sketches + leaner, symmetric, 1, coll, workers, milp_nodes[0])
    result.timings["coarse_s"] = time.perf_counter() - t0
    say(f"coarse: {len(coarse)} distinct sub-demands solved", 0.2)
    phys = gpu_physics(topo.gpu_model)  # large sizes, where threadblocks bind, run Simple
    cands = candidates(fab, coll, sketches, asm.Patterns(coarse), sizes, root=root, top_k=top_k,
                       threadblocks=result.max_threadblocks,
                       tb_gbps=phys.tb("Simple") if phys else None,
                       port_gbps=port_payload_gbps(topo, dims))  # fmt: skip
    if leaner:
        cands += candidates(fab, coll, leaner, asm.Patterns(coarse), sizes, root=root, top_k=1,
                            threadblocks=result.max_threadblocks,
                            tb_gbps=phys.tb("Simple") if phys else None,
                            port_gbps=port_payload_gbps(topo, dims))[:1]  # fmt: skip
    result.timings["combine_s"] = time.perf_counter() - t0 - result.timings["coarse_s"]

    # Fine step for the kept candidates.
    t1 = time.perf_counter()
    fine_pieces = 4 if coll == Collective.BROADCAST else 2
    kept = sorted({c.sketch for cand in cands for c in cand.columns}, key=str)
    fine: dict[tuple[object, ...], SubSchedule] = {}
    if coll != Collective.ALLTOALL:
        fine = _solve(dims, kept, symmetric, fine_pieces, coll, workers, milp_nodes[1])
    result.timings["fine_s"] = time.perf_counter() - t1
    solved = {**coarse, **fine}
    result.subschedules = list(solved.values())
    patterns = asm.Patterns(solved)
    say(f"fine: {len(fine)} sub-demands with {fine_pieces} pieces", 0.35)

    # Assemble variants.
    t2 = time.perf_counter()
    variants: list[tuple[str, ScheduleArrays]] = []
    # Deeper pipelines (more chunks per root) trade step latency for stage overlap. The
    # symmetric engine makes a simulation cheap, so every depth up to MAX_CHUNKS chunks per root
    # is tried. Above 64 ranks (transfers per root grow with N) only the candidate the
    # combination predicts fastest at the largest size gets MAX_CHUNKS_LARGE, the others
    # MAX_CHUNKS_SMALL: deep pipelines pay only at large sizes. The simulator picks per size.
    lead = min(cands, key=lambda c: c.estimate_us(sizes[-1]))
    budget = result.max_threadblocks
    dropped: list[str] = []
    least = 0  # threadblocks per GPU the leanest variant needs
    deals_of: dict[str, list[ScheduleArrays]] = {}  # channel deals that may fit, best first
    in_rounds: set[str] = set()  # variants whose reduces chain in rounds (ROUNDS_FROM)

    def add_variant(label: str, built: ScheduleArrays, on: asm.Fabric = fab) -> None:
        nonlocal least
        clock.spend(len(built))
        deals, why, need = _deals(on, built, budget)
        least = min(least or need, need)
        if not deals:
            dropped.append(f"{label}: {why}")
            return
        deals_of[label] = deals
        variants.append((label, deals[0]))

    for cand in cands:
        nblocks = sum(c.blocks for c in cand.columns)
        if nblocks & (nblocks - 1):
            dropped.append(f"{cand.label}: {nblocks} blocks, not a power of two (chunks per "
                           "rank must divide power-of-two sizes)")  # fmt: skip
            continue
        limit = MAX_CHUNKS
        if fab.nranks > 64:
            limit = MAX_CHUNKS_LARGE if cand is lead else MAX_CHUNKS_SMALL
        shapes = [(p, d) for p in ((1, fine_pieces) if fine else (1,)) for d in (1, 2, 4, 8, 16)
                  if (p == 1 or d in (1, 4)) and (d == 1 or p * d * nblocks <= limit)]  # fmt: skip
        if coll == Collective.ALLTOALL:
            shapes = [(1, 1)]
        for pieces, depth in shapes:
            if clock.out() and variants:
                result.budget_exhausted = True
                break
            label = f"{cand.label}/p{pieces}x{depth}"
            deep = Candidate(cand.label, [asm.Column(c.sketch, c.blocks * depth)
                                          for c in cand.columns], 0.0, 0.0)  # fmt: skip
            on = asm.aligned_fabric(fab, deep.columns) if _aligns(coll) else fab
            add_variant(label, _build(fab, coll, deep, patterns, pieces, root, label), on)
            if coll in (Collective.REDUCESCATTER, Collective.ALLREDUCE) and label in deals_of:
                # Reduces also chained in rounds (assemble.reduce_rounds): neither order wins on
                # every schedule (docs/synthesis.md, "syccl-a800-16 ReduceScatter (session 9)").
                twin = f"{label}/rounds"
                add_variant(twin, _build(fab, coll, deep, patterns, pieces, root, twin, True), on)
                in_rounds.add(twin)
    if coll in rb.BUNDLED and stats.split and (not variants or coll == Collective.ALLREDUCE):
        # Nothing fits the step limit (h800-rail-512): split AllGathers bundled, several roots'
        # chunks per transfer (docs/synthesis.md, "Bundled AllGather on aligned splits"), and
        # ReduceScatter / AllReduce built from them ("ReduceScatter and AllReduce at scale").
        # Split AllReduces are bundled too: their two phases rarely lower within the steps.
        for sk in asm.bundled_picks(dims, sketches, phys.tb("Simple") if phys else None,
                                    port_payload_gbps(topo, dims), asm.BUNDLE_SHORTLIST,
                                    MAX_STEPS // rb.STREAMS_PER_THREADBLOCK[coll]):  # fmt: skip
            if clock.out():
                break
            label = f"{sk.label(dims)}/bundled"
            name = _schedule_name(coll, label)
            ag = asm.allgather_bundled(fab, [asm.Column(sk, 1)], patterns, 1, name)
            add_variant(label, rb.from_allgather(coll, ag, fab.sizes, name))
    result.timings["assemble_s"] = time.perf_counter() - t2
    arr_of = dict(variants)
    result.schedules = arr_of
    if not evaluate:
        result.work = clock.spent
        refs.close()
        return result
    if coll == Collective.ALLTOALL and not early and all_closed():
        result.work = clock.spent
        return result
    # The latency-lean AllReduce (reduce_small.py): not screened with the variants (its schedule
    # ties theirs at small sizes where its file does not); its file is timed beside them there.
    # Not a variant of the search's (evaluate=False returns those).
    lean: list[str] = []
    if coll == Collective.ALLREDUCE:
        for mode, radix in rsm.variants(dims, budget):
            label = rsm.label(dims, mode, radix)
            built = rsm.small_allreduce(dims, mode, _schedule_name(coll, label), radix)
            if built is None:
                continue
            clock.spend(len(built))
            deals, why, _ = _deals(fab, built, budget)
            if not deals:
                dropped.append(f"{label}: {why}")
                continue
            deals_of[label], arr_of[label] = deals, deals[0]
            lean.append(label)
    live = [s for s in sizes if s not in closed]
    verdict: dict[str, bool] = {}
    # The lowering that passed, per label: every range's file of that schedule renders from it
    # (lowering is the writer's costly part, and it does not depend on the protocol or range).
    lowered: dict[str, MscclLowering] = {}
    as_schedule = LastSchedule()  # each lowering of one variant reads the same transfers
    # Labels lowered by `verified` from arr_of[label]: check_schedule passed on that schedule,
    # so its other pairings' lowerings do not prove it again (1.65 s a time on rail-512).
    proven: set[str] = set()

    def verified(label: str) -> bool:
        """Lowered exactly (the writer's threadblocks, steps and nops) only when needed: the
        counts above are floors, and lowering every variant of a large fabric costs seconds."""
        if label not in verdict:
            verdict[label] = False
            why = ""
            tried: list[tuple[ScheduleArrays, int]] = []  # deals lowered, work spent on each
            for arr in deals_of[label]:
                again = next((w for t, w in tried if _same_schedule(arr, t)), None)
                if again is not None:  # the deals often coincide: it failed, and would again
                    clock.spend(again)  # counted as if lowered, so the budget cuts where it did
                    continue
                before = clock.spent
                low = None
                # "minmax" (no more pairs than the budget forces, lightest first) only where
                # "forwarding" breaks the step limit: its files wait more where both fit.
                for pairing in ("forwarding", "minmax"):
                    clock.spend(len(arr))
                    low = None
                    try:
                        # minmax only after forwarding's lowering of it, which proved it
                        low = lower_msccl(as_schedule(arr), max_threadblocks=budget,
                                          pairing=pairing, order="early",
                                          proven=pairing != "forwarding")  # fmt: skip
                        low.require(max_threadblocks=budget)
                        break
                    except MscclFormatError as exc:
                        why = why or str(exc)
                        over_steps = low is not None and low.max_steps > MAX_STEPS
                        low = None
                        if not over_steps or _minmax_steps(arr, budget) > MAX_STEPS:
                            break
                tried.append((arr, clock.spent - before))
                if low is not None:
                    arr_of[label], verdict[label], lowered[label] = arr, True, low
                    proven.add(label)
                    break
            if not verdict[label]:
                dropped.append(f"{label}: {why}")
        return verdict[label]

    paired: dict[str, list[str]] = {}

    def pairings(label: str, in_time_order: bool = True) -> list[str]:
        """The label and, where the writer's "balanced" pairing shares threadblocks otherwise
        and fits, that file's label (lowered once): which pairing's file is faster depends on
        the schedule, so both are timed. Each in the schedule's time order (timed.py) instead
        of "early" where that gives a file that fits (timed.ALSO_EARLY: not beside it), unless
        `in_time_order` is False (the lean files: LL, latency-bound)."""
        if label not in paired:
            paired[label] = [label]
            if label in lowered or label in rendered:
                try:
                    alt = lower_msccl(as_schedule(arr_of[label]), max_threadblocks=budget,
                                      pairing="balanced", order="early",
                                      proven=label in proven)  # fmt: skip
                    alt.require(max_threadblocks=budget)
                except MscclFormatError:
                    alt = None
                meta = lowered[label].tb_meta if label in lowered else rendered[label].tb_meta
                if alt is not None and alt.tb_meta != meta:
                    twin = f"{label} [balanced]"
                    arr_of[twin], lowered[twin], sel_from[twin] = arr_of[label], alt, sel_from[label]
                    paired[label].append(twin)
                if not in_time_order:
                    return paired[label]
                times = timed.key_times(arr_of[label], topo, router, sizes[-1])
                for lb in list(paired[label]):
                    pairing = timed.pairing_of(lb)
                    low = timed.timed_lowering(arr_of[label], budget, pairing, times,
                                               as_schedule(arr_of[label]))  # fmt: skip
                    if low is not None:
                        twin = timed.file_label(label, pairing, True)
                        arr_of[twin], lowered[twin], sel_from[twin] = arr_of[label], low, sel_from[label]
                        paired[label].append(twin)
                        if not timed.ALSO_EARLY:
                            paired[label].remove(lb)
        return paired[label]

    if not variants and least > budget:
        result.notes.append(
            f"no synthesized schedule fits {budget} threadblocks per GPU (NCCL's own channel "
            f"count here); the leanest needs {least}: set synthesis.maxThreadblocks to at least "
            f"{least} to allow it"
        )
    # The smallest minBytes from which the executor selects each variant at every callable size.
    sel_from = {lb: first_selected(coll, topo.world_size, _chunks_per_loop(arr), 1)
                for lb, arr in variants}  # fmt: skip
    for lb in in_rounds & sel_from.keys():
        start = sel_from[lb]
        sel_from[lb] = None if start is None else max(start, ROUNDS_FROM)
    sel_from.update({lb: first_selected(coll, topo.world_size, _chunks_per_loop(arr_of[lb]), 1)
                     for lb in lean})  # fmt: skip
    # Rail-ring AllGather files (rail_ring.py), built as lowerings: timed beside the finalists.
    ringed = []
    for lb, arr, low in rings.files(dims, budget, lambda x: _schedule_name(coll, x)) \
            if coll == Collective.ALLGATHER else ():  # fmt: skip
        arr_of[lb], lowered[lb], verdict[lb] = arr, low, True
        sel_from[lb] = first_selected(coll, topo.world_size, _chunks_per_loop(arr), 1)
        ringed.append(lb)
    # Rail-ring ReduceScatter/AllReduce (rail_ring_reduce.py): built as files, not searched;
    # timed as files at grid sizes from rrr.MIN_BYTES (between them, where one won a neighbour).
    rail_reduces: list[str] = []
    # Tier rings (tier_ring.py): the same, where the outer dimensions together are the rail.
    for v in [*rrr.variants(dims, coll, budget, _schedule_name(coll, "rail-ring")),
              *tier_ring.variants(dims, coll, budget, _schedule_name(coll, "tier-ring"))]:
        clock.spend(len(v.arrays))
        arr_of[v.label], lowered[v.label], verdict[v.label] = v.arrays, v.lowering, True
        sel_from[v.label] = first_selected(coll, topo.world_size, _chunks_per_loop(v.arrays), 1)
        rail_reduces.append(v.label)
    if ringed:  # the loops' last lowering is held by `lowered` alone, so dropping it frees it
        del low
    if rail_reduces:
        del v
    say(f"{len(variants)} candidate schedules assembled", 0.45)

    # Evaluate: screen every variant at the smallest and largest size, then simulate the few
    # survivors at every size with the protocols that can win there.
    t3 = time.perf_counter()
    g = nccl_graph(topo)

    simulated: dict[tuple[int, int, str], float] = {}  # screening's runs are not repeated
    charged: set[tuple[int, int, str]] = set()

    def run(arr: ScheduleArrays, size: int, proto: str, charge: bool = True,
            timed: bool = True) -> float:
        """`charge=False`: a look ahead; its work is counted when the loop first uses it, so
        the budget cuts evaluation where it would without looking ahead. `timed=False`: the
        work counted alone, nothing simulated (NaN: no caller reads the time)."""
        key = (id(arr), size, proto)
        if charge and key not in charged:
            charged.add(key)
            clock.spend(len(arr))
        if not timed:
            return math.nan
        if key not in simulated:
            cost = protocol_cost(proto, link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
            simulated[key] = simulate(arr, topo, size, cost, router, engine="symmetric").time_us
        return simulated[key]

    # One rendered text per label (its other protocols are rewritten from it); once rendered,
    # the label's lowering is dropped and its file written from the text (`rendered`): the
    # rail-512 ring's lowering held 338 MB to the end, its text is 58 MB.
    files: dict[str, str] = {}
    rendered: dict[str, RenderedFile] = {}
    apart: side.FilesApart | None = None  # files timed in a second process (workers > 1)
    # Each (file, protocol, size) timed once: between grid points a rail ring that won at a
    # neighbour is asked for twice (as that winner and as a ring). Its work is still counted
    # per ask, so the budget cuts where it did.
    file_times: dict[tuple[str, str, int], float | str] = {}
    # Files not read back yet: their lowering's shape, for a bound on their time that needs no
    # read-back (model/published_bound.py); dropped once the file is read.
    unread: dict[str, FileShape | None] = {}

    def cannot_win(label: str, proto: str, size: int, limit: float) -> AtLeast | None:
        """The file's time is at least `limit` by its lowering alone: that bound, else None.
        Only for files this process has not read (a read file is timed for less)."""
        if math.isinf(limit) or label in files or label not in lowered or (
                apart is not None and apart.handles(label, proto)):  # fmt: skip
            return None
        if label not in unread:
            unread[label] = file_shape(lowered[label])
        shape = unread[label]
        if shape is None:
            return None
        cost = protocol_cost(proto, link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
        at_least = published_lower_bound(shape, coll, size, router, cost)
        return AtLeast(at_least) if at_least >= limit else None

    def file_us(label: str, proto: str, size: int, beat: tuple[float, str, str] | None) -> float:
        """The variant's file with `proto`, read back and simulated as published (inf: the
        executor would deadlock on it). Where `beat` (the best file so far) is given, a lower
        bound (grid.AtLeast) once the time is known to be no less than beat's: the caller keeps
        only a faster file, so nothing it picks changes."""
        clock.spend(_file_work(coll, arr_of[label], proto, size))
        limit = math.inf if beat is None else beat[0]
        got = file_times.get((label, proto, size))
        if got is None or (isinstance(got, AtLeast) and got < limit):
            bound = cannot_win(label, proto, size, limit)
            if bound is not None:  # as the give-up below would say, without reading the file
                got = bound
            elif apart is not None and apart.handles(label, proto):
                got = apart.time(label, proto, size)
            else:
                if label not in files:
                    unread.pop(label, None)
                    low = lowered.get(label) or lower_msccl(as_schedule(arr_of[label]),
                                                            max_threadblocks=budget, order="early")  # fmt: skip
                    files[label] = render_lowering(low, name=label, proto=proto,
                                                   nchannels=arr_of[label].channels)  # fmt: skip
                    if label in lowered and _fits(low, budget):
                        rendered[label] = RenderedFile(files[label], low.threadblocks, low.tb_meta)
                        del lowered[label]  # a side process forked earlier keeps its own copy
                    del low  # not held while the file is timed
                text = files[label]
                got = file_time(coll, size, topo, router,
                                text if f' proto="{proto}"' in text[:text.index(">")]
                                else as_protocol(text, proto), limit)  # fmt: skip
            file_times[(label, proto, size)] = got
        if isinstance(got, str):
            dropped.append(f"{label}/{proto}: {got}")
            return math.inf
        return got

    keep: list[str] = []
    if len(variants) > 2:
        # Screen at the ends and near 64 MiB (where the pipeline depth matters most), keeping
        # the best two at each. At the smallest size schedules of different depths tie (latency
        # alone) while their files do not (each chunk is a step a threadblock runs in order):
        # rail-64 AllReduce at 1 KiB, p1x2 21.83 us / p1x1 21.84 as schedules, 30.0 / 21.9 as files.
        mid = min(live, key=lambda x: abs(math.log2(x) - 26))
        points = ((live[0], 2), (mid, 2), (live[-1], 2))
        # Variant-major, so each variant's symmetric structure is computed once (cached).
        times = [[math.inf if lb in in_rounds and at < ROUNDS_FROM else
                  run(arr, at, _protocols(at)[0 if at == live[0] else -1]) for at, _ in points]
                 for lb, arr in variants]  # fmt: skip
        # Only variants that make the cut are lowered exactly; one that does not fit gives its
        # place to the next in line. Variants chained in rounds add their best one, apart, where
        # its schedule beats the others' (a slower schedule only adds a file to time).
        for k, (at, top) in enumerate(points):
            ranked = sorted(range(len(variants)), key=lambda v: times[v][k])
            plain = min((times[v][k] for v in ranked if variants[v][0] not in in_rounds),
                        default=math.inf)  # fmt: skip
            for chained, n_keep in ((False, top), (True, 1 if at >= ROUNDS_FROM else 0)):
                keep += itertools.islice((variants[v][0] for v in ranked
                                          if (variants[v][0] in in_rounds) == chained
                                          and (not chained or times[v][k] < plain)
                                          and verified(variants[v][0])), n_keep)  # fmt: skip
    else:
        keep = [v[0] for v in variants if verified(v[0])]
    finalists = [(lb, arr_of[lb]) for lb, _ in variants if lb in keep]
    say(f"screened {len(variants)} variants -> {len(finalists)}", 0.5)
    ref_s = 0.0
    # Grid sizes (every GRID-th and the last) try every finalist; a size between two grid points
    # tries only the variants that won at either neighbour (a schedule's time is piecewise
    # linear in size, so a variant losing at both ends rarely wins in between).
    grid, order = evaluation_order(len(sizes))
    if workers > 1 and finalists:
        # The files each grid size surely times, looked ahead from the engine's times (which do
        # not depend on earlier sizes): a second process reads and times part of them. Only the
        # best (variant, protocol)'s: the loop times the next only if its schedule beats the
        # best file so far, which is not known here (a guess cost lowerings and timings in
        # vain: docs/synthesis-scale.md, "Session 10: CPU cuts").
        ahead: list[tuple[str, str, int]] = []
        for i in grid:
            s = sizes[i]
            if s in closed:
                continue
            # the finalists the executor selects here (the loop's `runs_at`)
            here = [(run(arr, s, pr, charge=False), lb, pr) for lb, arr in finalists
                    if sel_from.get(lb) is not None and (sel_from.get(lb) or 0) <= s
                    for pr in _protocols(s)]  # fmt: skip
            ahead += [(twin, pr, s) for t, lb, pr in sorted(here)[:1]
                      if s not in known or a2a.worth_timing(t, known[s][0].time_us)
                      for twin in pairings(lb)]  # fmt: skip
        apart = files_apart = side.FilesApart(coll, topo, router, lowered, arr_of, ahead)

        def stop_both() -> None:
            refs.close()
            files_apart.close()

        clock.on_deadline = stop_both
    winners: dict[int, str] = {}
    picks: dict[int, SizeResult] = {}
    skipped: list[int] = []
    for n_done, i in enumerate(order):
        s = sizes[i]
        if i not in grid and clock.out():
            skipped.append(s)  # grid sizes bracket it; no number is made up for it
            result.budget_exhausted = True
            continue
        clock.spend(0)  # the deadline, if any
        tr = time.perf_counter()
        default, bound = known.get(s) or refs.at(s)
        ref_s += time.perf_counter() - tr  # with a reference process: the time waited for it
        if s in closed:
            picks[i] = _pick(coll, s, topo, default, None, bound,
                             a2a.closed_reason(default.time_us, closed[s]))  # fmt: skip
            continue
        if i in grid:
            tried = finalists
        else:
            lo = max(j for j in grid if j < i)
            hi = min(j for j in grid if j > i)
            names = {winners.get(lo), winners.get(hi)}
            # next to a rail ring's win, the finalists as at a grid size (the ring is no
            # finalist: the other neighbour's winner alone lost up to 1.2x, rail-64 AllReduce)
            tried = [v for v in finalists if v[0] in names and not names & set(rail_reduces)] \
                or finalists  # fmt: skip

        def runs_at(v: tuple[str, ScheduleArrays], at: int = s) -> bool:
            start = sel_from[v[0]]
            return start is not None and start <= at

        tried = [v for v in tried if runs_at(v)] or [
            (lb, arr_of[lb]) for lb, _ in variants if runs_at((lb, arr_of[lb])) and verified(lb)
        ]
        edge = i in grid or any(picks[j].chosen.startswith("nccl:") or picks[j].chosen in rail_reduces
                                for j in (lo, hi))  # fmt: skip
        engine_times: list[tuple[float, str, str]] = []
        for label, arr in tried:
            for proto in _protocols(s):
                if clock.out() and engine_times:
                    result.budget_exhausted = True
                    break
                # Away from the edges the neighbours' winning files are timed and these times
                # rank nothing: their work is counted (the budget cuts where it did), not run.
                engine_times.append((run(arr, s, proto, timed=edge), label, proto))
        # At grid sizes the engine's best few are timed as the files they would be: a file's
        # threadblocks run their steps in order, once per slice, which the engine's schedule
        # does not charge. A file adds waits to its schedule, never removes one, so a candidate
        # whose schedule is already slower than the best file so far is not timed. Between
        # grid points the file(s) that won at either end are timed; where NCCL won at one end
        # the engine's best is timed too. Every synthesized time reported is a file's.
        best: tuple[float, str, str] | None = None
        if not edge:
            won = {(picks[j].chosen, picks[j].protocol) for j in (lo, hi)}
            if engine_times:
                # The file(s) that won at the two ends, timed here as published: the engine's
                # times rank schedules, not files (a file can be 10-30% off its schedule), and
                # the time reported is the file's.
                for lb, pr in sorted(won):
                    f = file_us(lb, pr, s, best)
                    if not math.isinf(f) and (best is None or f < best[0]):
                        best = (f, lb, pr)
        if edge and i not in grid:  # next to NCCL's or a ring's win: the other end's file too
            for lb, pr in sorted({(picks[j].chosen, picks[j].protocol) for j in (lo, hi)}):
                if lb in arr_of and lb not in rail_reduces and runs_at((lb, arr_of[lb])):
                    f = file_us(lb, pr, s, best)
                    if not math.isinf(f) and (best is None or f < best[0]):
                        best = (f, lb, pr)
        timed_here = FILE_FINALISTS if i in grid else 1
        slower = ""  # AlltoAll: the engine's best already loses to NCCL, so no file is timed
        for t, name, pr in sorted(engine_times)[:timed_here] if edge else ():
            if best is not None and t >= best[0]:
                break
            if coll == Collective.ALLTOALL and not a2a.worth_timing(t, default.time_us):
                slower = slower or a2a.slower_reason(name, pr, t / default.time_us)
                break
            for lb in pairings(name):
                f = file_us(lb, pr, s, best)
                if not math.isinf(f) and (best is None or f < best[0]):
                    best = (f, lb, pr)
        # The lean AllReduce's files where its schedule beats NCCL's default: every lean variant
        # where the finalists' files are timed, between them the one whose schedule is fastest
        # (and, above, any that won at a neighbour). Not against the best file so far: its
        # file can beat its own schedule (h800-rail-512 256 KiB: 75.7 us, schedule 81.4).
        lean_here = lean if s <= rsm.MAX_BYTES else []
        if not edge and lean_here:
            lean_here = [min(lean_here, key=lambda lb: run(arr_of[lb], s, rsm.PROTOCOLS[0]))]
        for name in lean_here:
            for pr in (p for p in _protocols(s) if p in rsm.PROTOCOLS and runs_at((name, arr_of[name]))):
                if run(arr_of[name], s, pr) >= default.time_us or not verified(name):
                    continue
                # without time-ordered twins: with them (timed.ALSO_EARLY False) the files
                # timed would be those twins, which cost ~2x the CPU at 512 GPUs
                for lb in pairings(name, in_time_order=False):
                    f = file_us(lb, pr, s, best)
                    if not math.isinf(f) and (best is None or f < best[0]):
                        best = (f, lb, pr)
        # Rail rings: every one at grid sizes, between them those that won at either end; none
        # whose schedule is RING_SLACK slower than the best file so far (its FIFOs let a ring
        # file beat its one-in-flight schedule, by 1.7% on h800-rail-64 at 1 GiB).
        for name in ringed if edge else [lb for lb in ringed if lb in (winners.get(lo), winners.get(hi))]:
            for pr in _protocols(s) if runs_at((name, arr_of[name])) else ():
                if best is None or run(arr_of[name], s, pr) < RING_SLACK * best[0]:
                    f = file_us(name, pr, s, best)
                    if not math.isinf(f) and (best is None or f < best[0]):
                        best = (f, name, pr)
        for name in rail_reduces if edge and s >= rrr.MIN_BYTES else []:
            for pr in (x for x in _protocols(s) if x in rrr.PROTOCOLS):
                f = file_us(name, pr, s, best) if runs_at((name, arr_of[name])) else math.inf
                if not math.isinf(f) and (best is None or f < best[0]):
                    best = (f, name, pr)
        if apart is not None:
            apart.done_with(s)
        if best is not None:
            winners[i] = timed.schedule_label(best[1])
        say(f"evaluated {format_size(s)}", 0.5 + 0.45 * (n_done + 1) / len(sizes))
        none = ("no synthesized schedule fits msccl-executor-nccl within the SM budget (see the "
                "notes)" if not finalists else
                "no synthesized candidate was evaluated (budget)" if tried else
                "no synthesized schedule is selected by msccl-executor-nccl at this size (its "
                "chunks per rank do not divide it)")  # fmt: skip
        picks[i] = _pick(coll, s, topo, default, best, bound, slower or none)
    refs.close()
    if apart is not None:
        apart.close()
    result.sizes = [picks[i] for i in range(len(sizes)) if i in picks]
    dropped = list(dict.fromkeys(dropped))  # a file is tried at several sizes: say it once
    if dropped:
        more = f"; and {len(dropped) - 3} more" if len(dropped) > 3 else ""
        result.notes.append(
            f"{len(dropped)} candidate schedule(s) msccl-executor-nccl could not run within "
            f"{budget} threadblocks per GPU were dropped: {'; '.join(dropped[:3])}{more}"
        )
    if skipped:
        result.notes.append(
            "not simulated within the budget (the neighbouring ranges cover them): "
            + ", ".join(format_size(x) for x in sorted(skipped))
        )
    result.timings["evaluate_s"] = time.perf_counter() - t3 - ref_s
    # NCCL's default and the bound are references, not synthesis work: reported apart.
    result.timings["reference_s"] = ref_s
    if result.budget_exhausted:
        result.notes.append(
            f"work budget of {work_budget:,} transfers simulated exhausted: the best schedules "
            "found so far are used (fewer variants or protocols were evaluated at some sizes)"
        )
    _mesh_sizes(result, topo, coll, router, milp_nodes[1], lowered)
    t4 = time.perf_counter()
    result.ranges = _ranges(result.sizes, result.schedules, coll, topo, out_dir, result,
                            lowered, rendered)  # fmt: skip
    result.timings["emit_s"] = time.perf_counter() - t4
    result.timings["total_s"] = time.perf_counter() - clock.start
    result.work = clock.spent
    say("done", 1.0)
    return result


def _same_schedule(a: ScheduleArrays, b: ScheduleArrays) -> bool:
    """Equal in every field a lowering reads: the same lowering, or the same failure."""
    fields = ("src", "dst", "chunk", "count", "reduce", "channel", "dep_ptr", "dep_idx")
    return ((a.name, a.collective, a.nranks, a.chunks_per_rank, a.root, a.protocol, a.channels)
            == (b.name, b.collective, b.nranks, b.chunks_per_rank, b.root, b.protocol, b.channels)
            and (a.tb is None) == (b.tb is None)
            and (a.tb is None or b.tb is None or np.array_equal(a.tb, b.tb))
            and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields))  # fmt: skip


class LastSchedule:
    """`arr.to_schedule()` of the last schedule asked for, built once: a variant's lowerings
    (each pairing, "early" and time-ordered) come one after another and read the same
    transfers, which the writer does not change (0.1 s per 100k transfers to build). One is
    held, so memory stays what a lowering holds anyway; keyed by identity with the arrays
    held, so another schedule (equal or not) never gets it."""

    def __init__(self) -> None:
        self._last: tuple[ScheduleArrays, Schedule] | None = None

    def __call__(self, arr: ScheduleArrays) -> Schedule:
        if self._last is None or self._last[0] is not arr:
            self._last = (arr, arr.to_schedule())
        return self._last[1]


def _mesh_sizes(result: SynthesisResult, topo: ClusterTopology, coll: Collective, router: Router,
                node_limit: int, lowered: dict[str, MscclLowering]) -> bool:  # fmt: skip
    """One server's GPU mesh as one sub-demand (synth/mesh.py): at each size where its best
    file beats the synthesized pick so far, `_pick` weighs it against NCCL's default. Whether
    the mesh applied (one server with GPU-to-GPU links; not broadcast)."""
    if coll == Collective.BROADCAST or not mesh.applies(topo):
        return False
    t0 = time.perf_counter()
    found = mesh.variants(topo, coll, result.max_threadblocks, node_limit)
    pick = mesh.evaluate(topo, coll, [sr.size_bytes for sr in result.sizes], found, _protocols,
                         _chunks_per_loop, router,
                         {sr.size_bytes: sr.estimate.time_us for sr in result.sizes})  # fmt: skip
    result.schedules = {**result.schedules, **found.schedules}
    lowered.update(found.lowered)
    for i, sr in enumerate(result.sizes):
        best = pick.best.get(sr.size_bytes)
        if best is not None and (sr.synthesized is None or best[0] < sr.synthesized.time_us):
            result.sizes[i] = _pick(coll, sr.size_bytes, topo, sr.default, best, sr.bound_us,
                                    sr.reason)  # fmt: skip
    if found.dropped:
        more = f"; and {len(found.dropped) - 3} more" if len(found.dropped) > 3 else ""
        result.notes.append(f"{len(found.dropped)} mesh schedule(s) dropped: "
                            f"{'; '.join(found.dropped[:3])}{more}")  # fmt: skip
    result.timings["mesh_s"] = time.perf_counter() - t0
    return True


def default_threadblocks(coll: Collective, topo: ClusterTopology, sizes: list[int]) -> int:
    """The SM budget by default: the most channels NCCL's own choice runs this collective on at
    any of `sizes` (one threadblock per channel; model/nccl_default restates NCCL's channel
    search and its per-size trimming in enqueue.cc)."""
    graph = nccl_graph(topo).run_channels
    return max(1, *((nccl_default(coll, s, topo).choice.channels or graph) for s in sizes))


def _file_work(coll: Collective, arr: ScheduleArrays, proto: str, size: int) -> int:
    """Work of timing the file at `size`: its transfers once per slice iteration simulated
    (published_estimate), counted on the schedule so that no file need be read to count it."""
    sl = slicing(proto, size, _chunks_per_loop(arr), coll)
    return len(arr) * sum(iterations_to_simulate(sl, len(arr)))


def _chunks_per_loop(arr: ScheduleArrays) -> int:
    """nchunksperloop of the file (model/msccl.py writes max(i_chunks, o_chunks))."""
    n, c = arr.nranks, arr.chunks_per_rank
    if arr.collective in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL):
        return n * c
    return c


@dataclass(frozen=True, slots=True)
class _Links:
    """Each distinct (src, dst, channel) of a schedule with its transfers: all `_streams` and
    `_apart` read (a 512-GPU variant: millions of transfers on 10-20x fewer links)."""

    n: int
    src: np.ndarray
    dst: np.ndarray
    channel: np.ndarray
    transfers: np.ndarray

    @classmethod
    def of(cls, arr: ScheduleArrays) -> _Links:
        n, c = arr.nranks, int(arr.channel.max(initial=0)) + 1
        keys, per = _counted((arr.src.astype(np.int64) * n + arr.dst) * c + arr.channel,
                             n * n * c)  # fmt: skip
        return cls(n, keys // c // n, keys // c % n, keys % c, per)


def _streams(links: _Links, chans: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (rank, channel) on `chans` channels (channel c -> c mod chans): threadblocks the
    writer makes there (one per peer it sends to or receives from, sends and receives paired),
    and steps it must hold."""
    n, src, dst, weight = links.n, links.src, links.dst, links.transfers
    chan = links.channel % chans
    tbs = np.zeros(n * chans, dtype=np.int64)
    steps = np.zeros(n * chans, dtype=np.int64)
    most = np.zeros(n * chans, dtype=np.int64)  # the busiest stream: one threadblock holds it
    for me, peer in ((src, dst), (dst, src)):
        slot = me * chans + chan
        keys, per_stream = _counted(slot * n + peer, n * chans * n, weight)
        peers = np.bincount(keys // n, minlength=n * chans)
        tbs = np.maximum(tbs, peers)
        steps += np.bincount(slot, weights=weight, minlength=n * chans).astype(np.int64)
        np.maximum.at(most, keys // n, per_stream)
    floor = np.maximum(most, -(-steps // np.maximum(tbs, 1)))
    return tbs.reshape(n, chans).sum(axis=1), floor


def _apart(links: _Links, chans: int) -> int:
    """Threadblocks per GPU on `chans` channels with one per stream (send or receive peer)."""
    n, src, dst = links.n, links.src, links.dst
    chan = links.channel % chans
    per_rank = np.zeros(n, dtype=np.int64)
    for me, peer in ((src, dst), (dst, src)):
        keys, _ = _counted((me * chans + chan) * n + peer, n * chans * n)
        per_rank += np.bincount(keys // (n * chans), minlength=n)
    return int(per_rank.max())


def _counted(keys: np.ndarray, span: int,
             weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """np.unique(keys, return_counts=True) for keys in [0, span), each key counted `weight`
    times (>= 1; default once): by a count per key where the span is small (a 512-GPU
    variant's millions of transfers: 10x faster than sorting)."""
    if span > 1 << 24:
        at, inv = np.unique(keys, return_inverse=True)
        return at, np.bincount(inv, weights=weight, minlength=len(at)).astype(np.int64)
    per = np.bincount(keys, weights=weight, minlength=span).astype(np.int64)
    at = np.flatnonzero(per)
    return at, per[at]


_ORDERED = (Collective.ALLGATHER, Collective.ALLREDUCE, Collective.BROADCAST)


def _fused_steps(arr: ScheduleArrays, at: np.ndarray, conn: np.ndarray) -> np.ndarray:
    """Per connection of transfers `at` (`conn`: their keys; connections in key order): the
    fewest steps its transfers can become once the writer fuses them (`_fuse`: consecutive
    slots at both ends, cnt <= MAX_COUNT, plain receives only). Where every chunk lands in the
    output (_ORDERED) consecutive slots hold consecutive chunks; elsewhere a receive may land
    in scratch, whose slots follow arrival order, so any plain transfers may fuse."""
    chunk = arr.chunk[at].astype(np.int64)
    order = np.lexsort((chunk, conn))
    conn, chunk, red = conn[order], chunk[order], arr.reduce[at][order]
    count = arr.count[at][order].astype(np.int64)
    new = np.ones(len(conn), dtype=bool)  # a transfer no fused step can share with the last
    new[1:] = (conn[1:] != conn[:-1]) | red[1:] | red[:-1]
    if arr.collective in _ORDERED:
        new[1:] |= chunk[1:] != chunk[:-1] + count[:-1]
    run = np.cumsum(new) - 1
    run_steps = -(-np.bincount(run, weights=np.minimum(count, MAX_COUNT)).astype(np.int64)
                  // MAX_COUNT)  # fmt: skip
    first = np.flatnonzero(np.r_[True, conn[1:] != conn[:-1]])
    return np.add.reduceat(run_steps, run[first])


def _minmax_steps(arr: ScheduleArrays, budget: int) -> int:
    """GPU 0's busiest threadblock, in steps without nops, were its streams paired as the
    writer's "minmax" pairs them: exactly as many pairs as `budget` forces, fewest steps
    together first (sends fused, `_fused_steps`; a paired receive one step per transfer, as
    `_shared_floor` counts). An estimate (the writer ranks pairs that may block last), used
    to skip minmax lowerings that cannot fit: each costs seconds on 128 GPUs."""
    n, chans = arr.nranks, max(arr.channels, 1)
    at = np.flatnonzero((arr.src == 0) | (arr.dst == 0))
    conn = (arr.src[at].astype(np.int64) * n + arr.dst[at]) * chans + arr.channel[at] % chans
    keys, transfers = np.unique(conn, return_counts=True)
    fused = _fused_steps(arr, at, conn)
    src, chan = keys // chans // n, keys % chans
    sends = np.flatnonzero(src == 0)
    recvs = np.flatnonzero(src != 0)
    need = len(keys) - budget
    if need <= 0:
        return int(fused.max(initial=0))
    pairs = sorted((int(fused[i] + transfers[j]), int(i), int(j)) for i in sends for j in recvs
                   if chan[i] == chan[j])  # fmt: skip
    used: set[int] = set()
    most = 0
    for steps, i, j in pairs:
        if need == 0:
            break
        if i in used or j in used:
            continue
        used |= {i, j}
        most, need = max(most, steps), need - 1
    if need:
        return MAX_STEPS + 1  # fewer pairs than the budget forces: it cannot fit
    alone = [int(fused[k]) for k in range(len(keys)) if k not in used]
    return max(most, *alone, 0)


def _shared_floor(arr: ScheduleArrays, chans: int, budget: int) -> int:
    """A floor on the steps of the writer's busiest threadblock, from GPU 0 and the root,
    where they have more streams (send or receive peers per channel) than `budget`
    threadblocks; 0 where they have not. Any GPU's floor is one for the file; in a schedule
    made of translates every GPU has GPU 0's, and looking at two keeps it cheap.

    Such a GPU pairs a send with a receive of one channel in at least `streams - budget`
    threadblocks, and when no pairing leaves a threadblock free the writer cannot deal its
    streams over more channels (`lower_msccl` splits a connection only where the budget holds
    the new streams at both ends). A paired receive has no threadblock of its own, so the
    writer does not fuse its transfers: it holds at least one step each; a send at least its
    fused steps (its receiver may drain). Relaxed to any send with any receive, the fewest
    pairs take the smallest sends and receives, the largest send with the smallest receive.
    First with the fused steps counted by weight alone; then, if that passes, by runs of
    consecutive chunks (`_fused_steps`)."""
    n = arr.nranks
    mine = np.unique([0, arr.root])
    at = np.flatnonzero(np.isin(arr.src, mine) | np.isin(arr.dst, mine))
    conn = (arr.src[at].astype(np.int64) * n + arr.dst[at]) * chans + arr.channel[at] % chans
    weight = np.minimum(arr.count[at], MAX_COUNT).astype(np.float64)
    keys, inv, transfers = np.unique(conn, return_inverse=True, return_counts=True)
    src, dst, ch = keys // chans // n, keys // chans % n, keys % chans
    sends = np.bincount(src, minlength=n)
    recvs = np.bincount(dst, minlength=n)
    s_c = np.bincount(src * chans + ch, minlength=n * chans).reshape(n, chans)
    r_c = np.bincount(dst * chans + ch, minlength=n * chans).reshape(n, chans)
    streams = sends + recvs
    need = streams - budget  # pairs the writer must make on each GPU
    full = (need > 0) & (streams - np.minimum(s_c, r_c).sum(axis=1) >= budget)
    full &= np.isin(np.arange(n), mine)  # other GPUs' streams are only partly in view
    if not full.any():
        return 0
    width = int(max(sends.max(), recvs.max()))
    big = np.iinfo(np.int64).max // 4  # pads a GPU's row; a pair with it cannot be made

    def table(rank: np.ndarray, value: np.ndarray, per: np.ndarray) -> np.ndarray:
        """Each GPU's values ascending in one row, padded with `big`."""
        order = np.lexsort((value, rank))
        start = np.concatenate(([0], np.cumsum(per)[:-1]))
        col = np.arange(len(rank)) - start[rank[order]]
        out = np.full((n, width), big, dtype=np.int64)
        out[rank[order], col] = value[order]
        return out

    in_tab = table(dst, transfers, recvs)
    j = np.arange(width)[None, :]
    k = np.where(full, need, 0)[:, None]
    back = np.clip(k - 1 - j, 0, width - 1)

    def floor(fused: np.ndarray) -> int:
        most = np.zeros(n, dtype=np.int64)  # unpaired streams: their fused steps
        np.maximum.at(most, src, fused)
        np.maximum.at(most, dst, fused)
        pair = np.where(j < k, table(src, fused, sends) + np.take_along_axis(in_tab, back, 1), 0)
        return int(np.maximum(most, pair.max(axis=1))[full].max())

    got = floor(-(-np.bincount(inv, weights=weight).astype(np.int64) // MAX_COUNT))
    if got > MAX_STEPS:
        return got
    return floor(_fused_steps(arr, at, conn))


def _deals(fab: asm.Fabric, arr: ScheduleArrays,
           budget: int) -> tuple[list[ScheduleArrays], str, int]:  # fmt: skip
    """Channel deals of `arr` that may fit `budget` threadblocks per GPU, best first (empty:
    why none can); and the threadblocks it needs with one channel per peer.

    First the most channels on which every stream keeps a threadblock of its own (no merged
    send and receive), then every peer on the most channels the budget allows with streams
    paired (a block keeps its channel modulo that, so a chunk's path stays on one channel id),
    then per-peer channel counts that follow the load (assemble.spread_channels). Threadblocks
    are counted exactly from the arrays, steps per threadblock as a floor (no nops; where
    sends and receives must share threadblocks, `_shared_floor`); the exact
    lowering comes later, for the variants that may be used.
    """
    links = _Links.of(arr)  # folding channels (c -> c mod chans) is `_streams`' own
    least = int(_streams(links, 1)[0].max())
    chans = min(arr.channels, MAX_CHANNELS)
    while chans > 1 and _streams(links, chans)[0].max() > budget:
        chans -= 1
    spread, need = asm.spread_channels(fab, arr, budget)
    if spread is None:
        return [], f"needs {need} threadblocks per GPU (one per peer)", least
    out: list[ScheduleArrays] = []
    why = ""
    # Best first: the most channels on which every stream keeps a threadblock of its own (the
    # writer merges streams only over budget, and a merged threadblock makes a send wait for
    # receives it does not need: dgx-h100-2's files ran 3-10x slower, benchmarks/msccl_file_gap).
    apart = next((c for c in range(chans, 0, -1) if _apart(links, c) <= budget), 0)
    if apart and apart != chans:
        _, floor = _streams(links, apart)
        if floor.max() <= MAX_STEPS:
            out.append(asm.fold_channels(arr, apart))
    for dealt in (asm.fold_channels(arr, chans), spread):
        tbs, floor = _streams(links if dealt is not spread else _Links.of(spread), dealt.channels)
        if tbs.max() > budget:
            why = why or f"needs {tbs.max()} threadblocks per GPU"
        elif (shared := _shared_floor(dealt, dealt.channels, budget)) > MAX_STEPS:
            why = why or (f"needs {shared}+ steps in a threadblock a send and a receive share "
                          f"(the limit: {MAX_STEPS})")  # fmt: skip
        elif floor.max() > MAX_STEPS and (
            tbs.max() * -(-floor.max() // MAX_STEPS) > budget
            or dealt.channels * -(-floor.max() // MAX_STEPS) > MAX_CHANNELS
        ):  # the writer splits a long stream over channels only where the budget holds it
            why = why or f"needs {floor.max()}+ steps per threadblock (the limit: {MAX_STEPS})"
        else:
            out.append(dealt)
    return out, why, least


def _solve(dims: list[Dimension], sketches: list[Sketch], symmetric: bool, pieces: int,
           coll: Collective, workers: int,
           node_limit: int) -> dict[tuple[object, ...], SubSchedule]:  # fmt: skip
    if coll == Collective.ALLTOALL:
        return {}  # scatters route along shortest paths; no sub-demand MILP (see docs)
    demands = [
        asm.stage_demand(dims, st, symmetric, pieces)
        for sk in sketches for cp in sk.copies(dims) for st in cp.stages
    ]  # fmt: skip
    return solve_all(demands, workers=workers, node_limit=node_limit)


def _schedule_name(coll: Collective, label: str) -> str:
    return f"ccltune-{coll.value}-{label}".replace(" ", "").replace(">", "-").replace(":", "")


def _build(fab: asm.Fabric, coll: Collective, cand: Candidate, patterns: asm.Patterns,
           pieces: int, root: int, label: str, in_rounds: bool = False) -> ScheduleArrays:  # fmt: skip
    cols = cand.columns
    name = _schedule_name(coll, label)
    if coll == Collective.BROADCAST:
        return asm.broadcast(fab, cols, patterns, pieces, root, name)
    if coll == Collective.ALLTOALL:
        return asm.alltoall(fab, cols, pieces, name)
    # Every root's part is root 0's translated (reduces and gates stay within one root's
    # data), so each phase is built for root 0 and translated. A split's sub-spreads act on
    # aligned blocks: in an AllReduce a cyclic span-2 part sends to +1 and receives from -1
    # (two peers), an aligned one sends to and receives from its partner (one).
    if _aligns(coll):
        fab = asm.aligned_fabric(fab, cols)
    ag = asm.allgather_root0(fab, cols, patterns, pieces, name)
    cpr = ag.chunks_per_rank
    if coll == Collective.ALLGATHER:
        return asm.translate_roots(fab, ag, cpr)
    rs = asm.reverse(ag, Collective.REDUCESCATTER, name, fab, in_rounds)
    if coll == Collective.REDUCESCATTER:
        return asm.translate_roots(fab, rs, cpr)
    return asm.translate_roots(fab, asm.allreduce(rs, ag, name), cpr)


def _aligns(coll: Collective) -> bool:
    """Whether `_build` builds `coll` on the aligned fabric of its split: the reducing
    collectives. The 3-tier AllGather's cyclic files were faster at 1 GiB (1.95x faster than
    NCCL, aligned 1.84x; docs/synthesis.md, "The 3-tier fabric (session 7)")."""
    return coll in (Collective.REDUCESCATTER, Collective.ALLREDUCE)


def _estimate(
    coll: Collective, size: int, topo: ClusterTopology, t: float, bound: float
) -> Estimate:
    return Estimate(
        size_bytes=size, time_us=t, algbw_gbps=algbw_gbps(size, t),
        busbw_gbps=busbw_gbps(coll, topo.world_size, size, t), source=Source.SIMULATED,
        bound_us=bound, pct_of_bound=100.0 * bound / t,
    )  # fmt: skip


def _nccl_size(
    coll: Collective, s: int, topo: ClusterTopology, d: Estimate, reason: str
) -> SizeResult:
    bound = side.bound_us(coll, s, topo)
    est = _estimate(coll, s, topo, d.time_us, bound)
    ch = nccl_default(coll, s, topo).choice
    return SizeResult(
        s, f"nccl:{ch.describe()}", ch.protocol or "Simple", est, est, None, bound, reason
    )


def _pick(coll: Collective, s: int, topo: ClusterTopology, default: Estimate,
          best: tuple[float, str, str] | None, bound: float, none: str) -> SizeResult:  # fmt: skip
    dflt = _estimate(coll, s, topo, default.time_us, bound)
    ch = nccl_default(coll, s, topo).choice
    if best is None:
        return SizeResult(s, f"nccl:{ch.describe()}", ch.protocol or "Simple", dflt, dflt, None,
                          bound, none)  # fmt: skip
    t, label, proto = best
    syn = _estimate(coll, s, topo, t, bound)
    if t < default.time_us:
        gain = default.time_us / t
        return SizeResult(s, label, proto, syn, dflt, syn, bound,
                          f"{gain:.2f}x faster than NCCL's default ({ch.describe()})")  # fmt: skip
    return SizeResult(s, f"nccl:{ch.describe()}", ch.protocol or "Simple", dflt, dflt, syn, bound,
                      f"NCCL's default is faster ({t / default.time_us:.2f}x the time of {label})")  # fmt: skip


def _ranges(sizes: list[SizeResult], schedules: dict[str, ScheduleArrays], coll: Collective,
            topo: ClusterTopology, out_dir: Path | str | None, result: SynthesisResult,
            lowered: dict[str, MscclLowering] | None = None,
            rendered: dict[str, RenderedFile] | None = None) -> list[RangeResult]:  # fmt: skip
    groups: list[list[SizeResult]] = []
    for sr in sizes:
        if groups and (groups[-1][-1].chosen, groups[-1][-1].protocol) == (sr.chosen, sr.protocol):
            groups[-1].append(sr)
        else:
            groups.append([sr])
    out: list[RangeResult] = []
    for i, grp in enumerate(groups):
        lo = 0 if i == 0 else grp[0].size_bytes
        hi = 0 if i == len(groups) - 1 else groups[i + 1][0].size_bytes - 1
        first = grp[0]
        msccl = not first.chosen.startswith("nccl:")
        arr = schedules.get(first.chosen) if msccl else None
        rr = RangeResult(lo, hi, "msccl" if msccl else "nccl", first.chosen, first.protocol,
                         arr.channels if arr is not None else 0, grp, reason=first.reason)  # fmt: skip
        if arr is not None and out_dir is not None:
            try:
                rr.xml_file = _write_xml(arr, coll, rr, Path(out_dir), topo,
                                         result.max_threadblocks,
                                         (lowered or {}).get(first.chosen)
                                         or (rendered or {}).get(first.chosen))  # fmt: skip
            except MscclFormatError as exc:
                # The executor cannot run it (its limits or the SM budget): NCCL instead.
                rr.kind, rr.xml_file = "nccl", None
                rr.reason = f"MSCCL cannot express {first.chosen}: {exc}; NCCL's default is used"
                result.notes.append(f"{format_size(max(lo, 1))}..: {rr.reason}")
                for sr in grp:
                    ch = nccl_default(coll, sr.size_bytes, topo).choice
                    sr.chosen, sr.protocol = f"nccl:{ch.describe()}", ch.protocol or "Simple"
                    sr.estimate, sr.reason = sr.default, rr.reason
                rr.label, rr.protocol = grp[0].chosen, grp[0].protocol
        out.append(rr)
    return out


@dataclass(frozen=True)
class RenderedFile:
    """A lowering's file as rendered for timing, kept instead of the lowering: the range's file
    is written from it (`write_retitled`), and `tb_meta` tells a balanced pairing apart."""

    text: str
    threadblocks: int
    tb_meta: list[list[tuple[int, int, int]]]


def _fits(low: MscclLowering, budget: int) -> bool:
    """`low.require` passes: its file can be written from the text alone."""
    try:
        low.require(max_threadblocks=budget)
    except MscclFormatError:
        return False
    return True


def _write_xml(arr: ScheduleArrays, coll: Collective, rr: RangeResult, out_dir: Path,
               topo: ClusterTopology, budget: int,
               low: MscclLowering | RenderedFile | None = None) -> str:  # fmt: skip
    """`low`: the schedule's lowering already made (and checked: lower_msccl proves the schedule
    with check_schedule first, so no file the checker rejects is written), or its rendering."""
    # From the smallest size simulated in the range (the first range's lower end, 0, was never
    # simulated); evaluation only picked sizes the executor selects, so nothing narrows here.
    lo = max(rr.min_bytes, rr.sizes[0].size_bytes)
    start = first_selected(coll, topo.world_size, _chunks_per_loop(arr), lo, rr.max_bytes)
    if start is None or start > rr.sizes[0].size_bytes:
        raise MscclFormatError(f"msccl-executor-nccl would not select it at "
                               f"{format_size(rr.sizes[0].size_bytes)}")  # fmt: skip
    rr.file_min_bytes = start
    hi = "inf" if rr.max_bytes == 0 else format_size(rr.max_bytes + 1)
    name = f"{coll.value}-{topo.world_size}r-{format_size(max(rr.min_bytes, 1))}-{hi}-{rr.protocol}"
    if low is None:
        low = lower_msccl(arr.to_schedule(), max_threadblocks=budget)
    if isinstance(low, MscclLowering):
        low.require(max_threadblocks=budget)
    rr.threadblocks = low.threadblocks
    # In place too (DDP's gradient all-reduce is): the writer never writes the input, so the
    # same steps are correct with input and output aliased (model/msccl.py), except alltoall.
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.xml"
    part = path.with_name(path.name + ".part")  # renamed when complete: never half a file
    try:
        with part.open("w", encoding="utf-8") as fh:
            if isinstance(low, RenderedFile):  # rendered with the same channels (file_us)
                write_retitled(low.text, fh, name=name, proto=rr.protocol, minBytes=start,
                               maxBytes=rr.max_bytes, inplace=int(coll != Collective.ALLTOALL))  # fmt: skip
            else:
                write_lowering(low, fh, name=name, proto=rr.protocol, nchannels=arr.channels,
                               min_bytes=start, max_bytes=rr.max_bytes or None,
                               inplace=coll != Collective.ALLTOALL)  # fmt: skip
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, path)
    return str(path)
