"""The lower bound on a file's published time from its lowering alone (model/published_bound.py;
docs/synthesis-scale.md, "Session 12: files that cannot win"): never above the time the
evaluator reports, on synthesized, rail-ring and rail-ring-reduce files of two fabrics, every
protocol, small to large sizes; and close to it where the file is latency-bound."""

from __future__ import annotations

import pytest

from ccltune.api.common import Collective
from ccltune.model.cost.gpu import gpu_physics
from ccltune.model.cost.protocols import protocol_cost
from ccltune.model.evaluate import published_estimate
from ccltune.model.formats.msccl.stream import render_lowering
from ccltune.model.formats.msccl.writer import MscclFormatError, MscclLowering, lower_msccl
from ccltune.model.nccl.default import nccl_graph
from ccltune.model.published_bound import file_shape, published_lower_bound
from ccltune.model.sim.routing import Router
from ccltune.synth import engine
from ccltune.synth import rail_ring as rings
from ccltune.synth import rail_ring_reduce as rrr
from ccltune.topology.load import load_cluster

SIZES = (1 << 10, 1 << 20, 64 << 20, 1 << 30)
PROTOCOLS = ("LL", "LL128", "Simple")
BUDGET = 16


def _lowerings(cluster: str, coll: Collective) -> list[tuple[str, MscclLowering]]:
    """Two synthesized schedules lowered with two pairings, and the rail rings built as files."""
    topo = load_cluster(cluster)
    out: list[tuple[str, MscclLowering]] = []
    schedules = engine.synthesize(topo, coll, [1 << 20], evaluate=False).schedules
    for label, arr in list(schedules.items())[:2]:
        sched = arr.to_schedule()
        for pairing in ("forwarding", "balanced"):
            try:
                low = lower_msccl(sched, max_threadblocks=BUDGET, pairing=pairing, order="early")
                low.require(max_threadblocks=BUDGET)
            except MscclFormatError:
                continue
            out.append((f"{label} {pairing}", low))
    dims = topo.dimensions
    assert dims is not None
    if coll == Collective.ALLGATHER:
        out += [(lb, low) for lb, _, low in rings.files(dims, BUDGET, lambda x: x)]
    else:
        out += [(v.label, v.lowering) for v in rrr.variants(dims, coll, BUDGET, "rail-ring")]
    return out


@pytest.mark.parametrize(("cluster", "coll"), [
    ("syccl-a800-16", Collective.ALLGATHER), ("syccl-a800-16", Collective.REDUCESCATTER),
    ("syccl-a800-16", Collective.ALLREDUCE), ("dgx-h100-2", Collective.ALLGATHER),
    ("dgx-h100-2", Collective.ALLREDUCE),
])  # fmt: skip
def test_bound_never_above_the_published_time(cluster: str, coll: Collective) -> None:
    topo = load_cluster(cluster)
    router = Router(topo)
    intra = nccl_graph(topo).intra_kind
    lows = _lowerings(cluster, coll)
    assert len(lows) >= 3
    ratios = []
    for label, low in lows:
        shape = file_shape(low)
        assert shape is not None, label
        text = render_lowering(low, name=label, proto="Simple")
        for proto in PROTOCOLS:
            cost = protocol_cost(proto, link_kind=intra, gpu=gpu_physics(topo.gpu_model))
            file = text.replace(' proto="Simple"', f' proto="{proto}"', 1)
            for size in SIZES:
                t = published_estimate(coll, size, topo, file, router=router).time_us
                b = published_lower_bound(shape, coll, size, router, cost)
                assert 0 < b <= t, (label, proto, size, b, t)
                ratios.append(b / t)
    # not a vacuous bound: exact where a file is latency-bound, close on most
    assert max(ratios) > 0.999
    assert sorted(ratios)[len(ratios) // 2] > 0.5
