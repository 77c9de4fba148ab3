"""Virtual splits: sketches within the SM budget where every unsplit sketch needs more peers.

An MSCCL threadblock has one send and one receive peer, so a sketch whose GPUs talk to more
peer offsets than the budget cannot become a file. The search then cuts switch dimensions into
sub-groups (64 -> 4 x 4 x 4) and counts what it enumerates and what the peer bound removes."""

from __future__ import annotations

import itertools
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
from synth_helpers import make_cluster

from ccltune.api.cluster import Dimension
from ccltune.api.common import Collective
from ccltune.model.schedule.check import check_schedule
from ccltune.model.schedule.ir import ScheduleArrays
from ccltune.model.sim.translations import Translations
from ccltune.synth import assemble as asm
from ccltune.synth import engine
from ccltune.synth.milp import solve
from ccltune.synth.sketch import MAX_PARTS, Stage, coarsest_splits, peers, search
from ccltune.topology.load import load_cluster

REPO = Path(__file__).resolve().parents[2]
CHECK_PLAN = REPO.parent / "shared" / "conformance" / "check-plan"


def _dims(*spec: tuple[int, float]) -> list[Dimension]:
    return [Dimension(name=f"d{i}", kind="switch", size=n, bandwidth_gbps=bw)
            for i, (n, bw) in enumerate(spec)]  # fmt: skip


def _offsets(fab: asm.Fabric, arr: ScheduleArrays) -> set[int]:
    """Peer offsets (dst - src as a translation) the schedule's transfers use."""
    delta = Translations(fab.sizes).sub(arr.dst.astype(np.int64), arr.src.astype(np.int64))
    return set(delta.tolist())


def test_unsplit_fabrics_keep_their_sketches() -> None:
    """Where an unsplit sketch fits, the peer bound changes nothing (no split is searched)."""
    for name, budget in (("h800-rail-64", 16), ("syccl-a800-16", 8), ("dgx-h100-2", 16)):
        dims = load_cluster(name).dimensions
        assert dims is not None
        plain, st0 = search(dims)
        bounded, st = search(dims, max_peers=budget)
        assert bounded == plain and not st.split
        assert st.after_peer_bound == st0.after_relay_bound and st.kept == st0.kept


def test_coarsest_splits_of_the_issue_fabrics() -> None:
    """h800-rail-512 (8 x 64) at 16 and the 3-tier 8 x 4 x 4 at 12: the splits that fit, none
    of them refinable by merging two parts (that would fit too: one stage less, same ports)."""
    rail = _dims((8, 200.0), (64, 50.0))
    got = coarsest_splits(rail, frozenset({0, 1}), 16)
    perms = set(itertools.permutations((2, 4, 8)))
    assert set(got) == {((8,), (4, 4, 4))} | {(n, r) for n in ((2, 4), (4, 2)) for r in perms}
    tier = _dims((8, 150.0), (4, 50.0), (4, 25.0))
    assert set(coarsest_splits(tier, frozenset({0, 1, 2}), 12)) == {
        ((8,), (4,), (2, 2)), ((8,), (2, 2), (4,)), ((2, 4), (4,), (4,)), ((4, 2), (4,), (4,)),
    }  # fmt: skip
    for plan in got:
        assert sum(sum(a - 1 for a in f) for f in plan) <= 16
        assert all(len(f) <= MAX_PARTS for f in plan)


def test_split_search_counts_and_every_sketch_fits() -> None:
    dims = load_cluster("h800-rail-512").dimensions
    assert dims is not None
    sketches, st = search(dims, relays=True, max_peers=16)
    assert st.split == ("nvswitch", "rail") and not st.truncated
    assert (st.enumerated, st.after_consistency, st.after_peer_bound, st.kept) == (
        6084,
        337,
        337,
        124,
    )
    assert "no unsplit sketch fits" in st.line() and "within 16 peers" in st.line()
    assert len(sketches) == st.kept
    assert all(peers(sk.stages, dims) <= 16 for sk in sketches)
    assert all(s.kind == "spread" for sk in sketches for s in sk.stages)  # no relays when split
    lean = next(sk for sk in sketches if sk.split(dims) == ((8,), (4, 4, 4)))
    assert peers(lean.stages, dims) == 16
    # Interleavings of one split share their peer offsets (they mix within the budget).
    by_split = Counter(sk.split(dims) for sk in sketches)
    assert by_split[((8,), (4, 4, 4))] == 4  # nvswitch before, between or after the 3 rail parts


def test_nothing_fits_falls_back_to_the_unsplit_sketches() -> None:
    dims = _dims((8, 200.0), (2, 50.0))
    sketches, st = search(dims, max_peers=2)  # even 2 x 2 x 2 + 1 needs 4
    assert st.max_peers is None and not st.split and sketches == search(dims)[0]


def test_split_sketches_reach_every_gpu_once_with_the_peers_counted() -> None:
    """Broadcast trees of every split sketch (pieces 2) and the translated AllGather: each GPU
    gets each chunk once, and the peer offsets the arrays use are what `peers` counted."""
    topo = make_cluster(8, 4)  # switch 8 x switch 4; unsplit needs 7 + 3 peers
    dims = topo.dimensions
    assert dims is not None
    fab = asm.Fabric(dims)
    sketches, st = search(dims, max_peers=6)
    assert st.split and sketches
    for sk in sketches:
        solved = {}
        for stage in sk.stages:
            d = asm.stage_demand(dims, stage, True, 2)
            solved[d.key()] = solve(d.canonical())
        pats = asm.Patterns(solved)
        for root in (0, 13):
            b = asm.Builder()
            asm.broadcast_tree(fab, sk, pats, root, [0, 1], b, symmetric=True)
            got = Counter(zip(b.dst, b.chunk, strict=True))
            assert set(got) == {(r, c) for r in range(fab.nranks) if r != root for c in (0, 1)}
            assert set(got.values()) == {1}
        arr = asm.allgather(fab, [asm.Column(sk, 1)], pats, 2, "t")
        assert len(_offsets(fab, arr)) == peers(sk.stages, dims) <= 6


def test_sub_spread_targets_and_alltoall_routing() -> None:
    st = Stage(1, "spread", span=4, stride=16)
    assert st.targets(64) == (16, 32, 48)
    assert Stage(1, "spread").targets(4) == (1, 2, 3)
    topo = make_cluster(4, 4)
    dims = topo.dimensions
    assert dims is not None
    fab = asm.Fabric(dims)
    sketches, _ = search(dims, max_peers=4)
    assert sketches
    for sk in sketches:
        arr = asm.alltoall(fab, [asm.Column(sk, 1)], 1, "t")
        check_schedule(arr.to_schedule())  # every block reaches its destination


def test_split_schedules_fit_the_budget_end_to_end(tmp_path: Path) -> None:
    """16 GPUs (4 x 4) at 4 threadblocks: unsplit sketches need 6; the 2 x 2 splits need 4,
    win over NCCL's default at small sizes and are written as files within the budget, which
    msccl-executor-nccl's own parser loads and its selection rule picks (conformance kit)."""
    topo = make_cluster(4, 4)
    res = engine.synthesize(topo, Collective.ALLGATHER, [1 << k for k in range(10, 31, 2)],
                            out_dir=tmp_path / "msccl", max_threadblocks=4)  # fmt: skip
    assert res.stats is not None and res.stats.split
    files = [r for r in res.ranges if r.kind == "msccl"]
    assert files, res.notes
    assert all(0 < r.threadblocks <= 4 for r in files)
    assert all("/" in r.label for r in files)  # a split sketch
    assert CHECK_PLAN.exists(), f"conformance kit missing at {CHECK_PLAN}"
    for dtype_bytes in (2, 4):
        p = subprocess.run([str(CHECK_PLAN), str(tmp_path), "--dtype-bytes", str(dtype_bytes)],
                           capture_output=True, text=True, timeout=900)  # fmt: skip
        assert p.returncode != 2, p.stdout + p.stderr  # the kit could not run
        assert p.returncode == 0, p.stdout
        for r in files:
            name = Path(r.xml_file or "").name
            assert f"PASS msccl/{name} load" in p.stdout
            assert "up to 4 thread blocks" in p.stdout


def test_bundled_allgather_merges_roots_into_fewer_steps() -> None:
    """A split AllGather's transfers from one GPU to one peer in one stage that move
    consecutive chunks become one transfer: NVSwitch first on 8 x 4, a GPU forwards its node's
    8 chunks over the rail as one. The schedule still computes the AllGather (checker)."""
    topo = make_cluster(8, 4)
    dims = topo.dimensions
    assert dims is not None
    fab = asm.Fabric(dims)
    sketches, _ = search(dims, max_peers=6)
    sk = next(s for s in sketches if s.split(dims) == ((2, 2, 2), (4,))
              and s.stages[-1].dim == 1)  # fmt: skip
    pats = asm.Patterns({asm.stage_demand(dims, st, True, 1).key():
                         solve(asm.stage_demand(dims, st, True, 1).canonical())
                         for st in sk.stages})  # fmt: skip
    plain = asm.allgather(fab, [asm.Column(sk, 1)], pats, 1, "t")
    bundled = asm.allgather_bundled(fab, [asm.Column(sk, 1)], pats, 1, "t")
    check_schedule(bundled.to_schedule())
    assert int(bundled.count.sum()) == len(plain) == 32 * 31
    # The rail stage: each GPU sends its node's 8 chunks to 3 peers, one transfer each.
    rail = bundled.count[(bundled.src // 8) != (bundled.dst // 8)]
    assert len(rail) == 32 * 3 and set(rail.tolist()) == {8}
    # Sub-spreads act on aligned blocks: offsets differ per GPU, their number does not.
    aligned = asm.AlignedFabric(dims, sk.split(dims))
    assert len(_offsets(asm.Fabric(dims), bundled)) > peers(sk.stages, dims)
    assert len(set(zip(bundled.src.tolist(), Translations(aligned.refined).sub(
        bundled.dst.astype(np.int64), bundled.src.astype(np.int64)).tolist(),
        strict=True))) == 32 * peers(sk.stages, dims)
    capped = asm.allgather_bundled(fab, [asm.Column(sk, 1)], pats, 1, "t", max_count=4)
    assert int(capped.count.max()) == 4 and int(capped.count.sum()) == 32 * 31
