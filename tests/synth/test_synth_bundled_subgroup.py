"""Bundles whose runs are cut inside a digit: the symmetric simulator on the subgroup their
translations generate (symmetric_sim._digit_steps), not only the outer dimensions' K_j.

On h800-rail-512 the bundle "rail/4 > rail/4 > NVSwitch > rail/4" cuts 128-chunk runs at 64,
which every second position of a rail digit keeps: K_j gave 4 images (a ~1 s run at 512 GPUs),
the generated subgroup 256 (0.01 s). The small fabrics below are cut the same way."""

from __future__ import annotations

import numpy as np
import pytest
from synth_helpers import make_cluster
from test_synth_bundled import _bundled, _dims, _shuffled, _split_sketches

from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.sim import symmetric_sim as ss
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.model.sim.translations import Translations
from ccltune.synth import engine

SIMPLE = protocol_cost("Simple")


def _outer_only_images(b: object, topo: object, router: Router) -> int | str:
    """What the quotient had before: the fabric's and the refined fabric's K_j only."""
    keep = ss._subgroups
    ss._subgroups = lambda s, grp: ss._outer_subgroups(grp)
    try:
        got = ss._structure(b, topo, router)  # type: ignore[arg-type]
    finally:
        ss._subgroups = keep
    return got if isinstance(got, str) else got.images


@pytest.mark.parametrize(("shape", "label", "max_count", "images", "before"), [
    # the rail-512 case: runs of 32 cut at 8 keep every second position of a rail digit
    ((4, 16), "spread:nvswitch/2@1 > spread:nvswitch/2@2 > spread:rail/4@1 > spread:rail/4@4",
     8, 32, 4),
    ((8, 8), "spread:nvswitch/2@1 > spread:rail/4@1 > spread:nvswitch/4@2 > spread:rail/2@4",
     4, 32, 8),
    ((8, 8), "spread:nvswitch/4@1 > spread:rail/4@1 > spread:rail/2@4 > spread:nvswitch/2@4",
     2, 32, 16),
])  # fmt: skip
def test_runs_cut_inside_a_digit_are_timed_on_the_generated_subgroup(
    shape: tuple[int, int], label: str, max_count: int, images: int, before: int,
) -> None:  # fmt: skip
    topo = make_cluster(*shape)
    router = Router(topo)
    sketches = [s for s in _split_sketches(topo, 8) if s.label(_dims(topo)) == label]
    assert len(sketches) == 1
    for sk in sketches:
        b = _bundled(topo, sk, max_count=max_count)
        ss._CACHE.clear()
        q = ss.prepare_symmetric(b, topo, router, SIMPLE)
        assert not isinstance(q, str), q
        assert q.images == images
        assert _outer_only_images(b, topo, router) == before
        for size in (1 << 16, 1 << 24):
            full = simulate(b, topo, size, SIMPLE, router, engine="heap").time_us
            for s in (b, _shuffled(b, 2)):
                sym = simulate(s, topo, size, SIMPLE, router, engine="symmetric",
                               fallback="heap")  # fmt: skip
                assert sym.note == "", sym.note
                assert sym.time_us == pytest.approx(full, rel=1e-9)


def test_translation_tables_are_shared_and_read_only() -> None:
    a, b = Translations([2, 4, 8]), Translations([2, 4, 8])
    assert a._add is b._add and a._sub is b._sub
    assert a._add is not None and not a._add.flags.writeable
    x = np.arange(64)
    c = a.coords(x)
    want = ((c[:, None, :] + c[None, :, :]) % a.sizes * a.strides).sum(axis=-1)
    assert np.array_equal(a.add(np.repeat(x, 64), np.tile(x, 64)), want.ravel())


def test_counted_keys_are_numpys_unique() -> None:
    rng = np.random.default_rng(3)
    for span in (1, 17, 1 << 12, (1 << 24) + 5):
        keys = rng.integers(0, span, size=5000)
        got = engine._counted(keys, span)
        want = np.unique(keys, return_counts=True)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
