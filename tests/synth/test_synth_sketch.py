"""Sketch search: enumerated counts against a hand count, each pruning on a constructed case,
and every sketch reaches every GPU exactly once."""

from __future__ import annotations

from collections import Counter

from synth_helpers import make_cluster

from ccltune.api.cluster import Dimension
from ccltune.synth import assemble as asm
from ccltune.synth.milp import solve
from ccltune.synth.sketch import Stage, canonical, consistent, relays_bounded, search


def _dims(*spec: tuple[str, int]) -> list[Dimension]:
    return [Dimension(name=f"d{i}", kind=k, size=n, bandwidth_gbps=10.0 * (i + 1))
            for i, (k, n) in enumerate(spec)]  # fmt: skip


def _spread(d: int) -> Stage:
    return Stage(d, "spread")


def _relay(d: int, o: int) -> Stage:
    return Stage(d, "relay", o)


def test_counts_equal_a_hand_count() -> None:
    """Switch of 3 (A) x switch of 2 (B), counted by hand, node by node of the search:
    root: spread A, relay A+1, relay A+2, spread B, relay B+1                      5 generated
      iso removes relay A+2 (a switch's positions are interchangeable)            4 / 4 / 4
    spread A: B-stages (spread, relay+1) x 3 holder groups taking part 3, 2, 1    6 -> 6 / 2 / 1
    spread B: A-stages (3 kinds) x 2 groups taking part 2, 1                      6 -> 4 / 2 / 1
    relay A+1: spread A, relay A+1, spread B, relay B+1 (relay A+2 reaches only
      the root, so it is no stage)                                                4 -> 4 / 4 / 2
    relay A+1 > spread A: B-stages x 3 groups                                     6 -> 6 / 2 / 1
    relay A+1 > spread B: A-stages x 2 groups (relay A+2 back to A=0 now reaches
      B=1 there; it is canonical, its own class)                                  6 -> 6 / 3 / 1
    relay B+1: spread A, relay A+1, relay A+2 (B-stages reach no new GPU)         3 -> 2 / 2 / 1
    relay B+1 > spread A: B-stages x 3 groups                                     6 -> 6 / 2 / 1
    totals                                                    42 -> 38 -> 21 -> 12; 5 complete
    """
    dims = _dims(("switch", 3), ("switch", 2))
    sketches, st = search(dims)
    assert (st.enumerated, st.after_isomorphism, st.after_consistency,
            st.after_relay_bound, st.kept) == (42, 38, 21, 12, 5)  # fmt: skip
    assert not st.truncated
    assert [s.label(dims) for s in sketches] == [
        "spread:d0 > spread:d1", "spread:d1 > spread:d0",
        "relay:d0+1 > spread:d0 > spread:d1", "relay:d0+1 > spread:d1 > spread:d0",
        "relay:d1+1 > spread:d0 > spread:d1",
    ]  # fmt: skip
    # A relay over a dimension of 2 followed by a spread of it reaches nobody new: no sketch.


def test_each_pruning_removes_exactly_its_sequences() -> None:
    dims = _dims(("switch", 3), ("switch", 2))
    _, st = search(dims, trace=True)
    iso = {seq for seq, _, _ in st.removed["isomorphism"]}
    assert iso == {
        (_relay(0, 2),),
        (_spread(1), _relay(0, 2)),
        (_relay(1, 1), _relay(0, 2)),
    }
    # Forced consistency removes exactly the stages some holder groups sit out.
    assert all(k < g for _, k, g in st.removed["consistency"])
    assert len(st.removed["consistency"]) == 38 - 21
    # Bounded relays removes exactly the consistent sequences with two relays or a late one.
    relays = {seq for seq, _, _ in st.removed["relays"]}
    assert relays == {
        (_spread(0), _relay(1, 1)),
        (_spread(1), _relay(0, 1)),
        (_relay(0, 1), _relay(0, 1)),
        (_relay(0, 1), _relay(1, 1)),
        (_relay(0, 1), _spread(0), _relay(1, 1)),
        (_relay(0, 1), _spread(1), _relay(0, 1)),
        (_relay(0, 1), _spread(1), _relay(0, 2)),
        (_relay(1, 1), _relay(0, 1)),
        (_relay(1, 1), _spread(0), _relay(1, 1)),
    }


def test_filters_as_predicates() -> None:
    dims = _dims(("switch", 4), ("ring", 6))
    assert canonical((_relay(0, 3),), dims) == (_relay(0, 1),)
    assert canonical((_relay(1, 5),), dims) == (_relay(1, 1),)  # ring reflection
    assert canonical((_relay(1, 2),), dims) == (_relay(1, 2),)  # 2 hops is not 1 hop
    assert consistent(4, 4) and not consistent(3, 4)
    assert relays_bounded((_relay(0, 1), _spread(0), _spread(1)))
    assert not relays_bounded((_spread(0), _relay(1, 1), _spread(1)))
    assert not relays_bounded((_relay(0, 1), _relay(1, 1), _spread(0), _spread(1)))
    assert relays_bounded((_relay(0, 1), _relay(1, 1), _spread(0)), max_relays=2)


def test_identical_dimensions_keep_one_order() -> None:
    dims = _dims(("switch", 4), ("switch", 4))
    dims[1] = dims[0].model_copy(update={"name": "twin"})
    sketches, st = search(dims, relays=False)
    assert [s.order for s in sketches] == [(0, 1)]
    assert canonical((_spread(1), _spread(0)), dims) == (_spread(0), _spread(1))
    assert st.kept == 1


def test_ring_relays_fold_reflections() -> None:
    sketches, _ = search(_dims(("ring", 6)))
    offsets = sorted(s.relay.offset for s in sketches if s.relay)
    assert offsets == [1, 2, 3]


def test_work_limit_stops_the_search_and_says_so() -> None:
    dims = _dims(("switch", 8), ("switch", 8))
    _, full = search(dims)
    assert not full.truncated
    sketches, st = search(dims, limit=full.enumerated // 2)
    assert st.truncated and st.enumerated == full.enumerated // 2
    assert 0 < st.kept < full.kept and len(sketches) == st.kept
    assert "stopped at the limit" in st.line()


def test_every_sketch_reaches_every_gpu_once() -> None:
    topo = make_cluster(4, 3, "ring")
    assert topo.dimensions is not None
    fab = asm.Fabric(topo.dimensions)
    sketches, _ = search(topo.dimensions)
    assert sketches
    for sk in sketches:
        for cp in sk.copies(topo.dimensions):
            solved = {}
            for st in cp.stages:
                d = asm.stage_demand(topo.dimensions, st, False, 2)
                solved[d.key()] = solve(d.canonical())
            for root in (0, 5):
                b = asm.Builder()
                asm.broadcast_tree(fab, cp, asm.Patterns(solved), root, [0, 1], b, symmetric=False)
                got = Counter(zip(b.dst, b.chunk, strict=True))
                want = {(r, c) for r in range(fab.nranks) if r != root for c in (0, 1)}
                assert set(got) == want and set(got.values()) == {1}
