"""Rail-ring ReduceScatter and AllReduce as engine variants (issue 18; the lowering and its shape
are model/formats/msccl/rail_ring_reduce.py; decisions in docs/synthesis.md, "Rail rings
(session 9)"). Built directly as files, not searched: the engine times each as a file beside
its finalists and publishes it where it is fastest.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.cluster import Dimension
from ..api.common import Collective
from ..model.formats.msccl import rail_ring_reduce as lowering
from ..model.formats.msccl.limits import MAX_STEPS
from ..model.formats.msccl.writer import MscclFormatError, MscclLowering
from ..model.schedule.ir import ScheduleArrays
from .rail_ring import max_file_steps

COLLECTIVES = (Collective.REDUCESCATTER, Collective.ALLREDUCE)
# (pieces, rings, paired) tried, best first by their files on h800-rail-64 (simulated, 64 MiB
# to 1 GiB): ReduceScatter p4 on 4 rings with paired NVSwitch threadblocks, AllReduce p4 on 2
# rings, then p2 on 2 rings (AllReduce 4-32 MiB: 181.6 / 270.9 / 438.2 us against p4's 312.4 /
# 380.6 / 473.4; p1 never won on rail-64); one piece on one ring is what 64 servers' 64 steps
# leave (h800-rail-512). docs/synthesis.md, "Session 10: rail AllReduce".
# ReduceScatter: (pieces, rings, paired, taper). First p4r4 paired with the server reducing in
# the tapered order (formats/msccl/rail_ring_reduce.py `_tapered`; its files on rail-64, Simple:
# 64 MiB 405.4 against the Latin square's 422.8 us, 1 GiB 6,169.5 against 6,215.5, within 0.2
# us of it below 32 MiB), then the Latin square (on dgx-h100-2 the taper is slower from 64
# MiB: 413.1 against 402.3 us), then SHAPES' others where those do not fit
# (p4r2 never beat p4r4 paired on rail-64: 1 MiB 152.5 against 96.1). AllReduce keeps the Latin
# square (the taper's p4r2 at 64 MiB: 863.2 against 745.8). docs/synthesis.md, "Session 11:
# rail-64 ReduceScatter".
SHAPES = ((4, 4, True), (4, 2, False), (2, 2, False), (1, 1, False))
# AllReduce before SHAPES' one piece on one ring (where two others fit, as on rail-64, they are
# the two timed): the ring both ways round (formats/msccl/rail_ring_both.py), ~S hops a chunk
# where the one-way ring chains 2S - 2 and needs 2S - 1 steps on a threadblock; (pieces, rings),
# each in the smallest block of servers a step (`lower`'s `block`) that fits 64 steps and
# rail_ring.max_file_steps. 16 x 8 GPUs (simulated, files read back, Simple, 64 MiB / 1 GiB):
# p2r1 780.8 / 11,764.3 us against p2r2's 805.3 / 12,383.6; 32 x 8: p1r1 839.9 / 12,771.8
# against the one-way p1r1's 1,294.1 / 13,161.8; 64 x 8 (h800-rail-512): p1r1 in blocks of 4
# (1,177.3 / 13,846.4) or 8 servers, where no one-way shape fits. docs/synthesis.md, "Session 12:
# rail AllReduce within 64 steps".
BOTH_SHAPES = ((2, 1), (1, 1))
# ReduceScatter likewise (BothWaysScatter: both sums into the owner, ~S/2 chained hops a chunk
# where one way chains S - 1), one server a block (its layout is by rank). 16 x 8 GPUs
# (simulated, files read back, Simple, 16 MiB / 64 MiB / 1 GiB): p1r1 both 178.2 / 520.0 /
# 6,374.7 us against the one-way p1r1's 268.8 / 612.1 / 6,531.5; 32 x 8 beside p2r2, p1r1
# both (230.9 / 468.6 us at 16 / 64 MiB) beats p2r1 both (375.4 / 528.1); docs/synthesis.md,
# "Session 12: rail ReduceScatter both ways round". Where it is built the one-way p1r1 is not.
RS_BOTH_SHAPES = ((1, 1),)
RS_SHAPES = ((4, 4, True, True), (4, 4, True, False), (4, 2, False, False), (2, 2, False, False),
             (1, 1, False, False))  # fmt: skip
# Smallest size its files are timed at: below, each of the S-1 ring hops in sequence pays a
# network step (rail-64 ReduceScatter at 1 MiB: 84.5 us, NCCL 121.8; the lean and search
# variants are the latency-lean ones).
MIN_BYTES = 1 << 20
PROTOCOLS = ("Simple", "LL128")
MAX_VARIANTS = 2  # files timed per size: each 512-rank read-back costs ~15 s CPU
# Files offered up to rail_ring.max_file_steps(coll) steps (`file_steps`). h800-rail-512
# ReduceScatter's ring file wins (31.5% of the budget bound at >= 64 MiB against 16.8%, 3.64x
# NCCL at 1 GiB, simulated) and is offered since its row measured 1,569 MB peak RSS (2,032 before
# session 11; docs/synthesis-scale.md, "Session 11: the rail-512 rings"); both ways round since
# session 12: 57.7%, 3.76x, 1,414 MB peak RSS (one-way 31.5%, 1,452 MB in the same run).


@dataclass(frozen=True, slots=True)
class Variant:
    label: str
    arrays: ScheduleArrays
    lowering: MscclLowering


def applies(dims: list[Dimension], coll: Collective) -> bool:
    """Servers of GPUs on a switch, joined by one more dimension (its rails)."""
    return coll in COLLECTIVES and len(dims) == 2 and dims[0].kind == "switch" and \
        dims[0].size >= 2 and dims[1].size >= 2  # fmt: skip


def label(pieces: int, rings: int, paired: bool, taper: bool = False, block: int = 1,
          both: bool = False) -> str:  # fmt: skip
    return f"rail-ring/p{pieces}r{rings}" + ("/paired" if paired else "") + \
        ("/taper" if taper else "") + ("/both" if both else "") + \
        (f"/b{block}" if block > 1 else "")  # fmt: skip


def file_steps(coll: Collective, servers: int, gpus: int, pieces: int, block: int = 1,
               both: bool = False) -> int:  # fmt: skip
    """Steps of the whole file (any rings, paired or not): per GPU, each of its G-1 peers'
    sends and receives of S x pieces units (twice for AllReduce: its AllGather too; S / block
    units in blocks, both ways up to 2 more a piece in the AllGather), and the rings' S steps a
    piece (AllReduce 2S - 1, both ways 2S; ReduceScatter both ways S + 1)."""
    twice = coll == Collective.ALLREDUCE
    units = servers // block * pieces
    spread = (units + 2 * pieces * (both and block > 1)) if twice else 0
    ring = (2 * servers if both else 2 * servers - 1) if twice else servers + both
    per_gpu = 2 * (gpus - 1) * (units + spread) + pieces * ring
    return servers * gpus * per_gpu


def variants(dims: list[Dimension], coll: Collective, budget: int,
             name: str) -> list[Variant]:  # fmt: skip
    """The shapes that fit `budget` threadblocks and the executor's limits, best first."""
    if not applies(dims, coll):
        return []
    gpus, servers = dims[0].size, dims[1].size
    out: list[Variant] = []
    shapes = RS_SHAPES if coll == Collective.REDUCESCATTER else \
        tuple((*shape, False) for shape in SHAPES)  # fmt: skip
    for pieces, rings, paired, taper in shapes:
        if (pieces, rings) == (1, 1):  # both ways first
            both = _both_ways(coll, servers, gpus, budget, name, MAX_VARIANTS - len(out))
            out += both
            if both and coll == Collective.REDUCESCATTER:  # it beat the one-way p1r1 at every
                continue  # size and protocol measured (16, 32, 64 servers): not built
        tbs = rings + (gpus - 1) * (1 if paired else 2)
        steps = servers * pieces * (2 if coll == Collective.ALLREDUCE else 1) * (2 if paired else 1)
        if tbs > budget or steps > MAX_STEPS or len(out) == MAX_VARIANTS:
            continue
        if file_steps(coll, servers, gpus, pieces) > max_file_steps(coll):
            continue
        lb = label(pieces, rings, paired, taper)
        try:
            arr, low = lowering.lower(coll, servers, gpus, pieces, rings, f"{name}-{lb}", paired,
                                      taper)  # fmt: skip
        except MscclFormatError:
            continue
        out.append(Variant(lb, arr, low))
    return out


def _both_ways(coll: Collective, servers: int, gpus: int, budget: int, name: str,
               room: int) -> list[Variant]:  # fmt: skip
    """Rings both ways round (BOTH_SHAPES, ReduceScatter RS_BOTH_SHAPES), up to `room` of
    them; AllReduce's each in the smallest block of servers whose NVSwitch threadblocks fit 64
    steps, ReduceScatter's one server a block."""
    out: list[Variant] = []
    scatter = coll == Collective.REDUCESCATTER
    for pieces, rings in RS_BOTH_SHAPES if scatter else BOTH_SHAPES:
        way_steps = (servers // 2 + 1 if scatter else servers) * pieces // rings
        if len(out) >= room or servers < (3 if scatter else 4) or \
                2 * rings + 2 * (gpus - 1) > budget or way_steps > MAX_STEPS:  # fmt: skip
            continue
        for block in (b for b in range(1, 1 + (1 if scatter else servers)) if servers % b == 0):
            units = servers // block * pieces  # reduces, then as many spread runs (+2 a piece)
            if (units if scatter else 2 * units + 2 * pieces * (block > 1)) > MAX_STEPS:
                continue
            if file_steps(coll, servers, gpus, pieces, block, True) > max_file_steps(coll):
                break  # not a larger block instead: its ramp is longer (measured, docs)
            lb = label(pieces, rings, False, block=block, both=True)
            try:
                arr, low = lowering.lower(coll, servers, gpus, pieces, rings, f"{name}-{lb}",
                                          block=block, both=True)  # fmt: skip
            except MscclFormatError:  # its blocks split in two runs: a larger block
                continue
            out.append(Variant(lb, arr, low))
            break
    return out


__all__ = ["BOTH_SHAPES", "COLLECTIVES", "MIN_BYTES", "PROTOCOLS", "RS_BOTH_SHAPES", "RS_SHAPES",
           "SHAPES", "Variant", "applies", "file_steps", "label", "variants"]  # fmt: skip
