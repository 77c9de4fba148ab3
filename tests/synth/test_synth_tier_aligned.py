"""Split AllReduce within the SM budget (the 3-tier fabric's fix, docs/synthesis.md "The 3-tier
fabric (session 7)"): unbundled variants built on aligned blocks (one peer per span-2 part,
both ways), a split one cut leaner on the outermost dimension, and the writer's "minmax"
pairing where "forwarding" breaks the executor's 64 steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth_helpers import check_plan, make_cluster

from ccltune.api.cluster import Dimension
from ccltune.api.common import Collective
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.formats.msccl.limits import MAX_STEPS, first_selected
from ccltune.model.formats.msccl.stream import write_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError, MscclLowering, lower_msccl
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.model.sim.translations import Translations
from ccltune.synth import assemble as asm
from ccltune.synth import engine
from ccltune.synth.combine import Candidate
from ccltune.synth.sketch import Sketch, coarsest_splits, leaner_splits, search
from ccltune.topology.load import load_cluster

SIMPLE = protocol_cost("Simple")
TIER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "astra-3tier-128.yaml"


def _dims(*sizes: int) -> list[Dimension]:
    return [Dimension(name=f"d{i}", kind="switch", size=g, bandwidth_gbps=100.0 / (i + 1),
                      latency_us=1.0) for i, g in enumerate(sizes)]  # fmt: skip


def _build(dims: list[Dimension], sk: Sketch, coll: Collective, fab: asm.Fabric) -> ScheduleArrays:
    """One block per root of `sk`, every root's part root 0's translated on `fab`."""
    pats = asm.Patterns(engine._solve(dims, [sk], True, 1, coll, 1, engine.COARSE_NODES))
    cols = [asm.Column(sk, 1)]
    ag = asm.allgather_root0(fab, cols, pats, 1, "t")
    rs = asm.reverse(ag, Collective.REDUCESCATTER, "t", fab)
    return asm.translate_roots(fab, asm.allreduce(rs, ag, "t"), ag.chunks_per_rank)


def _peers(arr: ScheduleArrays, rank: int) -> tuple[set[int], set[int]]:
    return set(arr.dst[arr.src == rank].tolist()), set(arr.src[arr.dst == rank].tolist())


def _paired(low: MscclLowering, rank: int) -> int:
    return sum(p >= 0 and q >= 0 for p, q, _ in low.tb_meta[rank])


def test_leaner_splits_cut_the_outermost_whole_dimension() -> None:
    """3-tier 8 x 4 x 4 at 12 peers: each coarsest split whose spine is whole gets it cut 2 x 2
    (one peer fewer); a split whose outermost dimension is already cut (h800-rail-512's rail)
    or prime gets nothing; the search adds them only when asked (`leaner`)."""
    tier = _dims(8, 4, 4)
    coarse = coarsest_splits(tier, frozenset({0, 1, 2}), 12)
    assert set(leaner_splits(tier, frozenset({0, 1, 2}), coarse)) == {
        ((8,), (2, 2), (2, 2)), ((2, 4), (4,), (2, 2)), ((4, 2), (4,), (2, 2)),
    }  # fmt: skip
    rail = _dims(8, 64)
    assert (
        leaner_splits(rail, frozenset({0, 1}), coarsest_splits(rail, frozenset({0, 1}), 16)) == []
    )
    assert leaner_splits(_dims(8, 3), frozenset({0, 1}), [((2, 4), (3,))]) == []
    plain = {sk.split(tier) for sk in search(tier, relays=True, max_peers=12)[0]}
    both = {sk.split(tier) for sk in search(tier, relays=True, max_peers=12, leaner=True)[0]}
    assert ((2, 4), (4,), (2, 2)) in both - plain and ((2, 4), (4,), (4,)) in both & plain


def test_aligned_allreduce_has_one_peer_per_part_and_fits_where_cyclic_does_not() -> None:
    """8 x 8 within 8 threadblocks: a split AllReduce built on aligned blocks sends to and
    receives from the same peers (a span-2 part is one peer, not +1 and -1), is invariant under
    the refined fabric's translations, times alike on the symmetric and heap engines, and
    some lower within 8 threadblocks and 64 steps; the cyclic build of the same sketch never
    fits (more threadblocks than the budget, or steps, on every channel deal)."""
    topo = make_cluster(8, 8)
    dims = topo.dimensions
    assert dims is not None
    router = Router(topo)
    sketches, _ = search(dims, relays=True, max_peers=8)
    two = [sk for sk in sketches if any(st.span == 2 for st in sk.stages)]
    assert two
    fits = 0
    for sk in two[:4]:
        fab = asm.aligned_fabric(asm.Fabric(dims), [asm.Column(sk, 1)])
        assert isinstance(fab, asm.AlignedFabric)
        arr = _build(dims, sk, Collective.ALLREDUCE, fab)
        cyclic = _build(dims, sk, Collective.ALLREDUCE, asm.Fabric(dims))
        sends, recvs = _peers(arr, 0)
        assert sends == recvs
        assert len(sends) == sum(a - 1 for sp in sk.split(dims) for a in sp)
        assert len(_peers(cyclic, 0)[0]) > len(sends)  # cyclic: +1 in one phase, -1 in the other
        # invariant: every refined translation maps the transfer set onto itself
        grp = Translations(fab.refined)
        key = set(zip(arr.src.tolist(), arr.dst.tolist(), arr.chunk.tolist(), strict=True))
        cpr = arr.chunks_per_rank // arr.nranks  # AllReduce's chunks: every owner's, in order
        for g in (1, 2, 9, 63):
            moved = zip(grp.add(np.full(len(arr), g), arr.src.astype(np.int64)).tolist(),
                        grp.add(np.full(len(arr), g), arr.dst.astype(np.int64)).tolist(),
                        (grp.add(np.full(len(arr), g), arr.chunk // cpr) * cpr
                         + arr.chunk % cpr).tolist(), strict=True)  # fmt: skip
            assert set(moved) == key
        heap = simulate(arr, topo, 1 << 24, SIMPLE, router, engine="heap").time_us
        sym = simulate(arr, topo, 1 << 24, SIMPLE, router, engine="symmetric", fallback="heap")
        assert sym.note == "" and sym.time_us == pytest.approx(heap, rel=1e-9)
        assert not engine._deals(asm.Fabric(dims), cyclic, 8)[0]
        deals, _, _ = engine._deals(fab, arr, 8)
        if deals:
            low = lower_msccl(deals[0].to_schedule(), max_threadblocks=8, order="early")
            low.require(max_threadblocks=8)
            fits += 1
    assert fits


def test_minmax_pairs_only_what_the_budget_forces_lightest_first() -> None:
    """On every GPU "minmax" shares exactly streams - budget threadblocks (none where all
    streams fit apart): the split AllReduces of 8 x 8 within 8 threadblocks."""
    topo = make_cluster(8, 8)
    res = engine.synthesize(topo, Collective.ALLREDUCE, [1 << 10, 1 << 26], max_threadblocks=8,
                            evaluate=False)  # fmt: skip
    unbundled = [arr for lb, arr in res.schedules.items()
                 if lb.startswith("spread:") and not lb.endswith("/bundled")]  # fmt: skip
    assert unbundled
    for arr in unbundled:
        s = arr.to_schedule()
        low = lower_msccl(s, max_threadblocks=8, pairing="minmax")
        wide = lower_msccl(s, pairing="minmax")  # the executor's limit: nothing forced
        for r in range(arr.nranks):
            streams = len(wide.tb_meta[r])
            assert _paired(wide, r) == 0
            assert _paired(low, r) == max(0, streams - 8)
            assert _paired(low, r) > 0  # a split AllReduce has more streams than 8


@pytest.fixture(scope="module")
def tier_allreduce() -> tuple[ScheduleArrays, Candidate]:
    """The 3-tier fabric's 9-peer AllReduce (spine cut 2 x 2), as the engine builds it."""
    topo = load_cluster(str(TIER))
    dims = topo.dimensions
    assert dims is not None
    sketches, _ = search(dims, relays=True, max_peers=12, leaner=True)
    sk = next(s for s in sketches if s.label(dims) == "spread:nvswitch/2@1 > spread:spine/2@1 "
              "> spread:spine/2@2 > spread:leaf > spread:nvswitch/4@2")  # fmt: skip
    cand = Candidate(sk.label(dims), [asm.Column(sk, 1)], 0.0, 0.0)
    pats = asm.Patterns(engine._solve(dims, [sk], True, 1, Collective.ALLREDUCE, 1,
                                      engine.COARSE_NODES))  # fmt: skip
    arr = engine._build(asm.Fabric(dims), Collective.ALLREDUCE, cand, pats, 1, 0, "t")
    deals, why, _ = engine._deals(asm.aligned_fabric(asm.Fabric(dims), cand.columns), arr, 12)
    assert deals, why
    return deals[0], cand


def test_tier_allreduce_needs_minmax_and_passes_the_executors_own_code(
    tier_allreduce: tuple[ScheduleArrays, Candidate], tmp_path: Path
) -> None:
    """128 GPUs, 12 threadblocks: "forwarding" and "balanced" pair a 32-step stream with
    another past 64 steps; "minmax" fits (9 peers, 18 streams, 6 pairs of light ones), does
    not deadlock in the executor's FIFO model (lower_msccl checks), and msccl-executor-nccl
    loads all 128 ranks (conformance kit)."""
    arr, _ = tier_allreduce
    s = arr.to_schedule()
    for pairing in ("forwarding", "balanced"):
        with pytest.raises(MscclFormatError, match="steps"):
            lower_msccl(s, max_threadblocks=12, pairing=pairing, order="early").require(
                max_threadblocks=12)  # fmt: skip
    assert engine._minmax_steps(arr, 12) <= MAX_STEPS  # so the engine tries minmax here
    low = lower_msccl(s, max_threadblocks=12, pairing="minmax", order="early")
    low.require(max_threadblocks=12)
    assert low.max_steps <= MAX_STEPS and low.threadblocks <= 12
    name = "allreduce-128r-tier-Simple"
    xml = tmp_path / "msccl" / f"{name}.xml"
    xml.parent.mkdir()
    start = first_selected(Collective.ALLREDUCE, 128, engine._chunks_per_loop(arr), 1)
    assert start is not None
    with xml.open("w", encoding="utf-8") as fh:
        write_lowering(low, fh, name=name, proto="Simple", nchannels=arr.channels,
                       min_bytes=start, max_bytes=None, inplace=True)  # fmt: skip
    out = check_plan(tmp_path, "--dtype-bytes", "2")
    assert f"PASS msccl/{name}.xml load" in out
