"""The symmetric engine (one representative per orbit) equals the full simulation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_helpers import make_cluster

from ccltune.api.cluster import ClusterTopology
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.nccl.baselines import ring_allgather, ring_broadcast
from ccltune.model.sim.routing import Router
from ccltune.model.sim.simulate import simulate
from ccltune.synth.engine import synthesize
from ccltune.topology.presets import load_preset

COLLECTIVES = ["allgather", "reducescatter", "allreduce"]


def _schedules(topo: ClusterTopology, coll: str) -> list:
    # A budget that every cluster here fits (NCCL's own channel count is below one threadblock
    # per peer on some): the test is about the simulator, not the budget.
    res = synthesize(topo, coll, [1 << 16, 1 << 26], max_threadblocks=32, evaluate=False)
    return list(res.schedules.values())


def _agree(topo: ClusterTopology, arr, size: int, proto: str) -> None:
    router = Router(topo)
    cost = protocol_cost(proto, gpu=gpu_physics(topo.gpu_model))  # threadblock caps, NVLink
    full = simulate(arr, topo, size, cost, router)
    sym = simulate(arr, topo, size, cost, router, engine="symmetric")
    assert sym.engine == "symmetric", sym.note
    assert sym.time_us == pytest.approx(full.time_us, rel=1e-9)
    np.testing.assert_allclose(sym.finish_us, full.finish_us, rtol=1e-9)


@pytest.mark.parametrize("preset", ["dgx-h100-2", "syccl-a800-16", "h800-rail-64"])
@pytest.mark.parametrize("coll", COLLECTIVES)
def test_presets_agree_with_full_simulation(preset: str, coll: str) -> None:
    topo = load_preset(preset)
    arrs = _schedules(topo, coll)
    assert arrs
    for arr in arrs[:2]:
        for proto in ("Simple", "LL128"):
            _agree(topo, arr, 1 << 24, proto)
        _agree(topo, arr, 1 << 24, "LL")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.sampled_from([2, 4, 8]),
    servers=st.integers(2, 4),
    coll=st.sampled_from(COLLECTIVES),
    size=st.sampled_from([1 << 12, 1 << 20, 1 << 28]),
)
def test_random_symmetric_clusters_agree(gpus: int, servers: int, coll: str, size: int) -> None:
    topo = make_cluster(gpus, servers)
    for arr in _schedules(topo, coll)[:2]:
        _agree(topo, arr, size, "Simple")


def test_falls_back_with_a_reason_when_not_translation_invariant() -> None:
    topo = load_preset("dgx-h100-2")
    ring = ring_broadcast(topo)  # NCCL's ring broadcast: a chain from its root
    router = Router(topo)
    full = simulate(ring, topo, 1 << 20, protocol_cost("Simple"), router)
    sym = simulate(ring, topo, 1 << 20, protocol_cost("Simple"), router, engine="symmetric")
    assert sym.engine != "symmetric" and sym.note
    assert sym.time_us == full.time_us


def test_asymmetric_fabric_falls_back() -> None:
    topo = load_preset("v100-cubemesh-4")
    ring = ring_allgather(topo)
    sym = simulate(ring, topo, 1 << 20, engine="symmetric")
    assert sym.note == "the fabric is not symmetric"


def _with_deps(arr, rows: dict[int, list[int]]):
    """`arr` with the deps of the given transfers replaced."""
    from dataclasses import replace

    ptr, idx = arr.dep_ptr.tolist(), arr.dep_idx.tolist()
    lists = [idx[ptr[i] : ptr[i + 1]] for i in range(len(arr))]
    for i, deps in rows.items():
        lists[i] = deps
    new_ptr = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=new_ptr[1:])
    new_idx = np.asarray([d for x in lists for d in x], dtype=np.int64)
    return replace(arr, dep_ptr=new_ptr, dep_idx=new_idx)


@pytest.mark.parametrize("change", ["extra", "missing", "moved"])
def test_deps_that_do_not_translate_fall_back(change: str) -> None:
    topo = load_preset("dgx-h100-2")
    arr = _schedules(topo, "allgather")[0]
    per_root = len(arr) // arr.nranks
    ndeps = np.diff(arr.dep_ptr)
    i = per_root * 3 + int(np.flatnonzero(ndeps[per_root * 3 : per_root * 4])[0])  # root 3
    deps = arr.dep_idx[arr.dep_ptr[i] : arr.dep_ptr[i + 1]].tolist()
    if change == "extra":
        deps = sorted({*deps, i - 1})
    elif change == "missing":
        deps = deps[1:]
    else:
        deps = [d - 1 if d > per_root * 3 else d + 1 for d in deps]
    bad = _with_deps(arr, {i: deps})
    sym = simulate(bad, topo, 1 << 20, protocol_cost("Simple"), Router(topo), engine="symmetric")
    assert sym.engine != "symmetric"
    assert sym.note == "dependencies do not translate with the transfers"
