"""The engine's step floor for GPUs whose sends and receives share threadblocks
(`engine._shared_floor`): it never exceeds the writer's exact lowering, so every channel deal it
rejects is one msccl-executor-nccl could not run either."""

from __future__ import annotations

import pytest

from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import Collective
from ccltune.model.formats.msccl.limits import MAX_STEPS
from ccltune.model.formats.msccl.writer import MscclFormatError, lower_msccl
from ccltune.model.schedule.ir import Schedule, ScheduleArrays, Transfer
from ccltune.synth import engine
from ccltune.topology.load import load_cluster
from ccltune.topology.presets import load_preset

FABRIC_3TIER = "examples/clusters/astra-3tier-128.yaml"


def _deals_seen(monkeypatch: pytest.MonkeyPatch, topo: ClusterTopology, coll: str,
                budget: int | None = None) -> list[tuple[ScheduleArrays, int, int]]:  # fmt: skip
    """Every deal `_deals` asked the floor about while assembling: (deal, budget, floor)."""
    seen: list[tuple[ScheduleArrays, int, int]] = []
    floor = engine._shared_floor

    def spy(arr: ScheduleArrays, chans: int, cap: int) -> int:
        got = floor(arr, chans, cap)
        seen.append((arr, cap, got))
        return got

    monkeypatch.setattr(engine, "_shared_floor", spy)
    engine.synthesize(topo, coll, [1 << 10, 1 << 30], max_threadblocks=budget, evaluate=False)
    assert seen
    return seen


def _exact(arr: ScheduleArrays, budget: int) -> tuple[int | None, bool]:
    """The writer's busiest threadblock (None: no lowering within the budget) and whether the
    file passes every executor limit."""
    try:
        low = lower_msccl(arr.to_schedule(), max_threadblocks=budget)
    except MscclFormatError:
        return None, False
    try:
        low.require(max_threadblocks=budget)
    except MscclFormatError:
        return low.max_steps, False
    return low.max_steps, True


CASES = [
    ("syccl-a800-16", "allgather", None, 0),
    ("dgx-h100-2", "allgather", None, 0),
    ("dgx-h100-2", "reducescatter", None, 0),
    ("h800-rail-64", "allgather", None, 2),  # deeper pipelines: minutes of lowering
    (FABRIC_3TIER, "reducescatter", None, 1),
]


@pytest.mark.parametrize(("cluster", "coll", "budget", "depth"), CASES)
def test_floor_never_exceeds_the_exact_lowering(monkeypatch: pytest.MonkeyPatch, cluster: str,
                                               coll: str, budget: int | None,
                                               depth: int) -> None:  # fmt: skip
    topo = load_cluster(cluster) if cluster.endswith(".yaml") else load_preset(cluster)
    checked = 0
    for arr, cap, floor in _deals_seen(monkeypatch, topo, coll, budget):
        if depth and not any(arr.name.endswith(f"x{d}") for d in range(1, depth + 1)):
            continue
        steps, ok = _exact(arr, cap)
        assert steps is None or floor <= steps, (arr.name, floor, steps)
        if floor > MAX_STEPS:
            assert not ok, f"{arr.name}: the floor rejects ({floor}) what the writer lowers"
        checked += 1
    assert checked


def test_a800_16_deep_mix_is_rejected_before_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor is tight enough to matter: the 4-deep mix of syccl-a800-16 pairs every
    threadblock's send with a receive (121 steps exact) and is rejected from the counts."""
    seen = _deals_seen(monkeypatch, load_preset("syccl-a800-16"), "allgather")
    floors = {arr.name.rsplit("/", 1)[-1]: f for arr, _, f in seen if "mix" in arr.name}
    assert floors["p1x4"] > MAX_STEPS >= floors["p1x1"]


def _star(per: list[int], stride: int) -> ScheduleArrays:
    """GPU 0 sends per[i] chunks of its own to GPU i + 1 and receives as many of GPU i + 1's
    back, all on channel 0, chunks `stride` apart (1: consecutive, so the writer may fuse).
    Not a whole allgather (the writer refuses it): the floor's arithmetic only; the cases
    above compare the floor with the writer."""
    n, c = len(per) + 1, stride * max(per)
    s = Schedule("star", Collective.ALLGATHER, n, c)
    for i, m in enumerate(per):
        for j in range(m):
            s.add(Transfer(0, i + 1, stride * j))
            s.add(Transfer(i + 1, 0, (i + 1) * c + stride * j))
    return ScheduleArrays.from_schedule(s)


def test_floor_is_the_bottleneck_pairing_of_unfusable_streams() -> None:
    arr = _star([10, 20, 30, 40], stride=2)  # never consecutive: a step per transfer
    # 8 streams on GPU 0: on 8 threadblocks nothing is shared; on 5 a pairing may leave a
    # threadblock free (the writer could then split a stream over channels): no floor either.
    assert engine._shared_floor(arr, 1, 8) == 0
    assert engine._shared_floor(arr, 1, 5) == 0
    # On 4 every send shares with a receive: 10 + 40, 20 + 30, .. -> 50 at best.
    assert engine._shared_floor(arr, 1, 4) == 50


def test_sends_count_as_fused_receives_as_paired() -> None:
    # Consecutive chunks: a send may become one step (its receiver drains into a threadblock
    # of its own), a paired receive may not: the 40 receives plus one send step.
    arr = _star([1, 2, 3, 40], stride=1)
    assert engine._shared_floor(arr, 1, 4) == 41
