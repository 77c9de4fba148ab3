"""AlltoAll against its lower bound: the cut through an oversubscribed switch, and the launch
every call pays (model/cost/bounds.py, sm_bound.launched_bound_us)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cost_model_topos import spec_topology
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccltune.api.common import Collective
from ccltune.model.cost.bounds import lower_bound
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import PROTOCOL_COSTS, protocol_cost
from ccltune.model.cost.sm_bound import launched_bound_us
from ccltune.model.nccl.baselines import nccl_schedule_arrays
from ccltune.model.nccl.default import default_estimate
from ccltune.model.sim.simulate import simulate
from ccltune.synth.engine import default_threadblocks
from ccltune.topology.load import load_cluster
from ccltune.topology.presets import load_preset

MiB = 1 << 20
THREE_TIER = Path(__file__).resolve().parents[2] / "examples/clusters/astra-3tier-128.yaml"


def test_three_tier_cut_is_the_leaf_uplink() -> None:
    """astra-3tier-128: a leaf's 32 GPUs reach the spine over one 800 GB/s link (32 NICs x 50
    GB/s below it), and 96/128 of each GPU's AlltoAll buffer goes to other leaves, so 64 MiB
    takes >= 24 x 64 MiB / 800 GB/s = 2,013 us. Counting only the NICs (1,600 GB/s) the bound
    said 1,268 us, and NCCL's p2p looked 62% efficient; it is at the bound."""
    topo = load_cluster(str(THREE_TIER))
    size = 64 * MiB
    b = lower_bound(Collective.ALLTOALL, size, topo, PROTOCOL_COSTS["Simple"])
    uplink = 32 * 96 / 128 * size / 800e3
    assert b.binding == "cut:spine"
    assert uplink < b.time_us < uplink + 20.0
    nccl = default_estimate(Collective.ALLTOALL, size, topo, with_bound=False).time_us
    assert b.time_us * (1 - 1e-9) <= nccl <= b.time_us * 1.001


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(coll=st.sampled_from(list(Collective)), over=st.sampled_from([1.0, 2.0, 4.0]),
       gpus=st.sampled_from([1, 2, 4]), nics=st.sampled_from([1, 2]),
       size=st.sampled_from([1000, 1 << 16, 1 << 22, 1 << 27]),
       proto=st.sampled_from(sorted(PROTOCOL_COSTS)))  # fmt: skip
def test_switch_cut_never_exceeds_simulated_time(coll: Collective, over: float, gpus: int,
                                                 nics: int, size: int, proto: str) -> None:  # fmt: skip
    """With switches joining a cut where they carry more in than out, the bound still holds for
    NCCL's direct AlltoAll and rings on two leaves of two servers under an `over`:1 spine."""
    tiers = [{"name": "leaf", "size": 2, "oversubscription": over}, {"name": "spine"}]
    topo = spec_topology(4, gpus, "nvswitch" if gpus > 1 else "pcie", nics=nics, tiers=tiers)
    algo = "direct" if coll == Collective.ALLTOALL else "ring"
    cost = PROTOCOL_COSTS[proto]
    sim = simulate(nccl_schedule_arrays(coll, algo, topo, chunks=2), topo, size, cost)
    assert lower_bound(coll, size, topo, cost).time_us <= sim.time_us * (1 + 1e-9)


@pytest.mark.parametrize("cluster", ["h800-rail-64", "syccl-a800-16", "dgx-h100-2", str(THREE_TIER)])
@pytest.mark.parametrize("coll", [Collective.ALLTOALL, Collective.ALLGATHER])
def test_launched_bound_never_above_nccl(cluster: str, coll: Collective) -> None:
    """Every call NCCL's default makes pays its launch before any byte: the launch-inclusive
    bound stays below its simulated time at every size (equal where it is tight)."""
    topo = load_cluster(cluster)
    sizes = [1 << k for k in range(10, 31, 4)]
    budget = default_threadblocks(coll, topo, sizes)
    for s in sizes:
        nccl = default_estimate(coll, s, topo, with_bound=False).time_us
        assert launched_bound_us(coll, s, topo, budget) <= nccl * (1 + 1e-9), s


def test_launched_bound_holds_for_a_relayed_schedule() -> None:
    """A schedule the engine would make (a ring, relayed through every GPU) with an MSCCL
    file's costs: the launch counts for it as for NCCL's p2p."""
    topo = load_preset("h800-rail-64")
    phys = gpu_physics(topo.gpu_model)
    ring = nccl_schedule_arrays(Collective.ALLGATHER, "ring", topo)
    for proto in ("LL", "LL128", "Simple"):
        cost = protocol_cost(proto, gpu=phys)
        for s in (1 << 10, 1 << 18, 1 << 24):
            t = simulate(ring, topo, s, replace(cost, floor_us=0.0)).time_us
            assert launched_bound_us(Collective.ALLGATHER, s, topo, 16) <= t * (1 + 1e-9)


def test_small_alltoall_cannot_halve_nccl_on_rail_64() -> None:
    """Issue 18 asks <= 0.5x NCCL's time at <= 256 KiB on >= 64 GPUs. On h800-rail-64 every
    call pays LL's launch (6.6 us) and the farthest pair's route (NVLink then the rail: 7.6 us)
    at least; NCCL's p2p is within 6% of that at every size up to 256 KiB."""
    topo = load_preset("h800-rail-64")
    for k in range(10, 19):
        s = 1 << k
        nccl = default_estimate(Collective.ALLTOALL, s, topo, with_bound=False).time_us
        floor = launched_bound_us(Collective.ALLTOALL, s, topo, 16)
        assert floor >= 14.2 - 1e-9
        assert nccl <= 1.06 * floor, s
        assert 0.5 * nccl < floor
