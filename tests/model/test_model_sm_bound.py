"""The bound at an SM budget (cost/sm_bound.py): never above a simulated schedule that runs on
that many threadblocks per GPU, equal to the link bound where threadblocks do not bind."""

from __future__ import annotations

import pytest

from ccltune.api.common import Collective
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import BASE_LAT, PROTOCOLS, protocol_cost
from ccltune.model.cost.sm_bound import budget_bound_us, demand_bytes, sm_bound
from ccltune.model.evaluate import common_bound_us
from ccltune.model.nccl.baselines import nccl_schedule_arrays
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.sim.capacity import threadblocks_per_rank
from ccltune.model.sim.simulate import simulate
from ccltune.synth.engine import default_threadblocks, synthesize
from ccltune.topology.presets import load_preset

MiB = 1 << 20


def test_demand_per_gpu() -> None:
    assert demand_bytes("allgather", 16, 16.0) == 15.0
    assert demand_bytes("reducescatter", 16, 16.0) == 15.0
    assert demand_bytes("alltoall", 4, 8.0) == 6.0
    assert demand_bytes("allreduce", 4, 8.0) == 12.0  # 2 (N-1)/N M
    assert demand_bytes("broadcast", 4, 8.0) == 8.0
    assert demand_bytes("allgather", 1, 8.0) == 0.0


def test_a800_allgather_at_eight_threadblocks() -> None:
    """The issue's example: 8 threadblocks at 12.5 GB/s receive at most 100 GB/s, so 64 MiB
    AllGather on 16 GPUs (15/16 of it into each) takes >= 629 us plus launch and a step."""
    topo = load_preset("syccl-a800-16")
    b = sm_bound("allgather", 64 * MiB, topo, 8)
    assert b.protocol == "Simple"
    bw_us = 15 / 16 * 64 * MiB / 100e3
    assert bw_us + BASE_LAT["ring"][2] < b.time_us < bw_us + BASE_LAT["ring"][2] + 5.0
    link = common_bound_us(Collective.ALLGATHER, 64 * MiB, topo)
    assert link < 0.6 * b.time_us  # the budget, not the links, binds here
    assert budget_bound_us("allgather", 64 * MiB, topo, 8, link) == b.time_us
    # Twice the threadblocks: the threadblock term halves (less the fixed part).
    assert sm_bound("allgather", 64 * MiB, topo, 16).time_us < 0.55 * b.time_us


@pytest.mark.parametrize("preset", ["syccl-a800-16", "h800-rail-64", "mi300x-8", "dgx-h100-2"])
@pytest.mark.parametrize("coll", list(Collective))
def test_equals_the_link_bound_where_threadblocks_do_not_bind(
    preset: str, coll: Collective
) -> None:
    topo = load_preset(preset)
    for size in (64 * MiB, 1 << 30):
        link = common_bound_us(coll, size, topo)
        assert budget_bound_us(coll, size, topo, 1 << 20, link) == link
        assert budget_bound_us(coll, size, topo, 1, link) > link
    # Tiny calls: what is left without threadblock limits is the launch and one step, which
    # the link bound does not count.
    link = common_bound_us(coll, 4 << 10, topo)
    unbound = budget_bound_us(coll, 4 << 10, topo, 1 << 20, link)
    assert link <= unbound <= max(link, max(BASE_LAT["ring"]) + 15.0)


def test_no_bound_without_threadblock_physics() -> None:
    topo = load_preset("syccl-a800-16").model_copy(update={"gpu_model": "unknown-gpu"})
    assert sm_bound("allgather", 64 * MiB, topo, 8).time_us == 0.0
    with pytest.raises(ValueError, match="threadblocks"):
        sm_bound("allgather", 64 * MiB, topo, 0)


def _costs(topo):  # type: ignore[no-untyped-def]
    g = nccl_graph(topo)
    return [protocol_cost(p, link_kind=g.intra_kind, gpu=gpu_physics(topo.gpu_model))
            for p in PROTOCOLS]  # fmt: skip


@pytest.mark.parametrize("preset", ["syccl-a800-16", "mi300x-8", "dgx-h100-2"])
@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER,
                                  Collective.ALLREDUCE, Collective.BROADCAST])  # fmt: skip
def test_nccl_rings_never_beat_it(preset: str, coll: Collective) -> None:
    """NCCL's rings on 1..8 channels (one threadblock each), every protocol, small to large."""
    topo = load_preset(preset)
    for channels in (1, 2, 8):
        arr = nccl_schedule_arrays(coll, "ring", topo, chunks=2, channels=channels)
        arr.tb = arr.channel
        tbs = threadblocks_per_rank(arr)
        assert tbs == channels
        for size in (64 << 10, 4 * MiB, 256 * MiB):
            bound = sm_bound(coll, size, topo, tbs).time_us
            for cost in _costs(topo):
                t = simulate(arr, topo, size, cost).time_us
                assert t >= bound * (1 - 1e-9), (channels, size, cost.name, t, bound)


@pytest.mark.parametrize(("preset", "coll", "budget"), [
    ("syccl-a800-16", Collective.ALLGATHER, 8),
    ("syccl-a800-16", Collective.REDUCESCATTER, 16),
    ("mi300x-8", Collective.ALLREDUCE, 16),
    ("dgx-h100-2", Collective.ALLGATHER, None),
])  # fmt: skip
def test_synthesized_schedules_never_beat_it(preset: str, coll: Collective,
                                             budget: int | None) -> None:  # fmt: skip
    """Every variant synthesis assembled, at the threadblocks it needs, every protocol; and every
    size's pick (file or NCCL) against the budget the files were fitted to."""
    topo = load_preset(preset)
    sizes = [256 << 10, 64 * MiB, 512 * MiB]
    res = synthesize(topo, coll, sizes, max_threadblocks=budget)
    assert res.schedules
    for arr in res.schedules.values():
        tbs = threadblocks_per_rank(arr)
        for size in sizes:
            bound = sm_bound(coll, size, topo, tbs).time_us
            for cost in _costs(topo):
                t = simulate(arr, topo, size, cost, engine="symmetric").time_us
                assert t >= bound * (1 - 1e-9), (arr.name, size, cost.name, t, bound)
    # NCCL's default runs on its own channel count, which an explicit budget may undercut.
    nccl_tbs = max(res.max_threadblocks, default_threadblocks(coll, topo, sizes))
    for s in res.sizes:
        bound = budget_bound_us(coll, s.size_bytes, topo, res.max_threadblocks, s.bound_us)
        if not s.chosen.startswith("nccl:"):
            assert s.estimate.time_us >= bound * (1 - 1e-9)
        bound = budget_bound_us(coll, s.size_bytes, topo, nccl_tbs, s.bound_us)
        assert s.default.time_us >= bound * (1 - 1e-9)
