"""Sketch search: pruning counts, and every sketch reaches every GPU exactly once."""

from __future__ import annotations

from collections import Counter

from synth_helpers import make_cluster

from ccltune.api.cluster import Dimension
from ccltune.synth import assemble as asm
from ccltune.synth.milp import solve
from ccltune.synth.sketch import search


def _dims(*spec: tuple[str, int]) -> list[Dimension]:
    return [Dimension(name=f"d{i}", kind=k, size=n, bandwidth_gbps=10.0 * (i + 1))
            for i, (k, n) in enumerate(spec)]  # fmt: skip


def test_pruning_counts() -> None:
    dims = _dims(("switch", 8), ("switch", 4))
    sketches, st = search(dims)
    hops = 7 + 3
    assert st.raw == 2 * (1 + hops + hops**2)
    assert st.after_relay_bound == 2 * (1 + hops)  # at most one relay before the D spreads
    assert st.kept == len(sketches) == 2 * (1 + 2)  # one relay representative per switch dim
    assert st.raw_inconsistent > 0


def test_identical_dimensions_keep_one_order() -> None:
    dims = _dims(("switch", 4), ("switch", 4))
    dims[1] = dims[0].model_copy(update={"name": "twin"})
    sketches, _ = search(dims, relays=False)
    assert len(sketches) == 1


def test_ring_relays_fold_reflections() -> None:
    sketches, _ = search(_dims(("ring", 6)))
    offsets = sorted(s.relay.offset for s in sketches if s.relay)
    assert offsets == [1, 2, 3]


def test_every_sketch_reaches_every_gpu_once() -> None:
    topo = make_cluster(4, 3, "ring")
    assert topo.dimensions is not None
    fab = asm.Fabric(topo.dimensions)
    sketches, _ = search(topo.dimensions)
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
