"""The simulated surface: seeded noise, interference, and the shape the searchers rely on."""

from __future__ import annotations

import itertools

import pytest
from tune_helpers import preset

from ccltune.api.common import Source
from ccltune.api.plan import TaskKey
from ccltune.tune.profilers.simulated import SimulatedProfiler
from ccltune.tune.space import Config, Impl

KEY = TaskKey(collective="allreduce", min_bytes=1 << 20, max_bytes=(2 << 20) - 1, ranks=8, nodes=1)
RING = Config(Impl("ring", "Simple"), 16, 512, 4 << 20)


def test_noise_is_seeded_and_reproducible() -> None:
    a = SimulatedProfiler(preset("dgx-a100-1"), seed=5)
    b = SimulatedProfiler(preset("dgx-a100-1"), seed=5)
    c = SimulatedProfiler(preset("dgx-a100-1"), seed=6)
    xs = [a.measure(KEY, KEY.min_bytes, RING).time_us for _ in range(3)]
    ys = [b.measure(KEY, KEY.min_bytes, RING).time_us for _ in range(3)]
    assert xs == ys and len(set(xs)) == 3  # repetitions differ, runs repeat
    assert c.measure(KEY, KEY.min_bytes, RING).time_us != xs[0]
    m = a.measure(KEY, KEY.min_bytes, RING, reps=4)
    assert m.reps == 4 and m.source == Source.SIMULATED
    exact = SimulatedProfiler(preset("dgx-a100-1"), noise=0.0)
    assert exact.measure(KEY, KEY.min_bytes, RING).time_us == exact.true_time_us(KEY, KEY.min_bytes, RING)


def test_surface_shape() -> None:
    prof = SimulatedProfiler(preset("dgx-a100-1"), noise=0.0)
    t = lambda size, cfg: prof.true_time_us(KEY, size, cfg)  # noqa: E731
    sizes = [1 << i for i in range(10, 31, 2)]
    times = [t(s, RING) for s in sizes]
    assert all(b > a for a, b in itertools.pairwise(times))
    # Small messages: LL's latency wins; large: Simple's bandwidth wins (NCCL's well-known split).
    ll = Config(Impl("ring", "LL"), 16, 512, 4 << 20)
    assert t(4096, ll) < t(4096, RING) and t(1 << 30, RING) < t(1 << 30, ll)
    # Too few channels or threads starve the protocol phase.
    assert t(1 << 28, Config(RING.impl, 2, 512, 4 << 20)) > 2 * t(1 << 28, RING)
    assert t(1 << 28, Config(RING.impl, 16, 64, 4 << 20)) > t(1 << 28, RING)


def test_interference_slows_and_is_validated() -> None:
    calm = SimulatedProfiler(preset("dgx-a100-1"), noise=0.0)
    busy = SimulatedProfiler(preset("dgx-a100-1"), noise=0.0, interference=0.5)
    assert busy.true_time_us(KEY, 1 << 28, RING) > calm.true_time_us(KEY, 1 << 28, RING)
    with pytest.raises(ValueError, match="interference must be in"):
        SimulatedProfiler(preset("dgx-a100-1"), interference=1.5)
