"""ReduceScatter's reduces chained in rounds (assemble.reduce_rounds, docs/synthesis.md
"syccl-a800-16 ReduceScatter (session 9)"): in AllGather emission order a GPU's peers reduced
into one chunk at a time; in rounds each connection class and each chunk take one reduce at a
time, and the reverse of syccl-a800-16's AllGather mix runs as fast as the mix itself. The
engine offers such variants beside the emission order's from engine.ROUNDS_FROM up."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from synth_helpers import check_plan

from ccltune.api.common import Collective
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.cost.sm_bound import budget_bound_us
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.schedule.check import check_schedule
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth import assemble as asm
from ccltune.synth import engine
from ccltune.synth.sketch import search
from ccltune.topology.presets import load_preset

MIB = 1 << 20
MIX = "mix(2 columns: spread:leaf > spread:nvswitch | spread:nvswitch > spread:leaf)/p1x1"


def _leaf_first_root0(depth: int) -> tuple[asm.Fabric, ScheduleArrays]:
    """Root 0's AllGather of "spread:leaf > spread:nvswitch" on syccl-a800-16, `depth` blocks."""
    dims = load_preset("syccl-a800-16").dimensions
    assert dims is not None
    sk = next(s for s in search(dims, relays=True)[0]
              if s.label(dims) == "spread:leaf > spread:nvswitch")  # fmt: skip
    pats = asm.Patterns(engine._solve(dims, [sk], True, 1, Collective.REDUCESCATTER, 1,
                                      engine.COARSE_NODES))  # fmt: skip
    fab = asm.Fabric(dims)
    return fab, asm.allgather_root0(fab, [asm.Column(sk, depth)], pats, 1, "t")


def test_rounds_keep_every_connection_class_busy() -> None:
    """Leaf-first with 8 blocks per root: each connection class carries 16 of root 0's reduces,
    and the rounds take exactly 16 (one per class and per chunk in each round, every reduce
    after the reduces into the chunk it sends); the result is race-free."""
    fab, ag = _leaf_first_root0(8)
    n = len(ag)
    succ: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for d in ag.dep_idx[ag.dep_ptr[i] : ag.dep_ptr[i + 1]].tolist():
            succ[d].append(i)
    rnd = asm.reduce_rounds(ag, succ, fab)
    grp = asm.fabric_translations(fab)
    cls = grp.sub(ag.src, ag.dst).tolist()
    load = max(Counter(cls).values())
    assert load == 16 and max(rnd) + 1 == load
    assert max(Counter(zip(rnd, cls, strict=True)).values()) == 1
    into = zip(rnd, ag.src.tolist(), ag.chunk.tolist(), strict=True)
    assert max(Counter(into).values()) == 1
    assert all(rnd[c] < rnd[i] for i in range(n) for c in succ[i])
    rs = asm.reverse(ag, Collective.REDUCESCATTER, "t", fab, in_rounds=True)
    check_schedule(asm.translate_roots(fab, rs, rs.chunks_per_rank).to_schedule())


def test_the_reversed_mix_runs_as_fast_as_the_allgather_mix() -> None:
    """The engine's schedules at 64 MiB (simulated): the ReduceScatter mix chained in emission
    order took 2,402.6 us, in rounds 650.7; the AllGather mix it reverses 647.3."""
    topo = load_preset("syccl-a800-16")
    router = Router(topo)
    cost = protocol_cost("Simple", link_kind=nccl_graph(topo).intra_kind,
                         gpu=gpu_physics(topo.gpu_model))  # fmt: skip
    rs = engine.synthesize(topo, "reducescatter", [64 * MIB], evaluate=False).schedules
    ag = engine.synthesize(topo, "allgather", [64 * MIB], evaluate=False).schedules
    t = {k: simulate(a, topo, 64 * MIB, cost, router, engine="symmetric").time_us
         for k, a in (("emission", rs[MIX]), ("rounds", rs[f"{MIX}/rounds"]), ("ag", ag[MIX]))}  # fmt: skip
    assert t["rounds"] <= 1.02 * t["ag"]
    assert t["rounds"] < 0.5 * t["emission"]


def test_reducescatter_from_64m_is_within_90_percent_of_the_budget_bound(tmp_path: Path) -> None:
    """The files published from 64 MiB up (read back and simulated as published) are within 90%
    of the bound at the 8-threadblock budget (NCCL's ring: 86.2% at 64 MiB), and
    msccl-executor-nccl's own parser loads and selects them (the conformance kit)."""
    topo = load_preset("syccl-a800-16")
    sizes = [64 * MIB, 1024 * MIB]
    res = engine.synthesize(topo, "reducescatter", sizes, workers=1, out_dir=tmp_path / "msccl")
    for sr in res.sizes:
        assert not sr.chosen.startswith("nccl:"), sr.reason
        bound = budget_bound_us(Collective.REDUCESCATTER, sr.size_bytes, topo,
                                res.max_threadblocks, sr.bound_us)  # fmt: skip
        assert bound / sr.estimate.time_us >= 0.90, (sr.size_bytes, sr.chosen)
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert files and all(0 < r.threadblocks <= 8 for r in files)
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    for r in files:
        name = Path(r.xml_file or "").name
        assert f"PASS msccl/{name} load" in out
        assert f"PASS msccl/{name} selection: selected by the executor at all" in out


def test_twins_in_rounds_leave_small_sizes_to_the_emission_order() -> None:
    """syccl-a800-16 AllReduce: at 1 KiB the emission-order p1x2 file is kept (23.7 us; with
    the twins screened at every size, engine.ROUNDS_FROM = 0, their schedules took its place
    and NCCL's tree ran, 32.9 us), and at 64 MiB a twin in rounds wins (1,337.3 us against
    NCCL's ring 1,478.3; simulated)."""
    topo = load_preset("syccl-a800-16")
    res = engine.synthesize(topo, "allreduce", [1 << 10, 64 * MIB], workers=1)
    small, large = res.sizes
    assert not small.chosen.startswith("nccl:") and "/rounds" not in small.chosen, small.chosen
    assert "/rounds" in large.chosen and large.estimate.time_us < large.default.time_us
