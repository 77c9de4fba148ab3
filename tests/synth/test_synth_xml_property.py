"""Acceptance: every XML written passes the semantic checker, on random symmetric clusters."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_helpers import make_cluster

from ccltune.api.common import Collective
from ccltune.model.formats.msccl.reader import from_msccl_xml
from ccltune.model.schedule.check import check_schedule
from ccltune.synth.engine import synthesize

clusters = st.builds(
    make_cluster,
    gpus=st.sampled_from([2, 3, 4]),
    servers=st.sampled_from([1, 2, 3]),
    fabric=st.sampled_from(["nvswitch", "ring", "fully_connected"]),
    layout=st.sampled_from(["rail", "tor"]),
    nvlink=st.sampled_from([50.0, 150.0]),
    nic_gbps=st.sampled_from([100.0, 400.0]),
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(topo=clusters, coll=st.sampled_from(list(Collective)))
def test_every_written_xml_passes_the_checker(topo, coll, tmp_path_factory) -> None:
    if topo.dimensions is None or topo.world_size < 2:
        return
    out: Path = tmp_path_factory.mktemp("xml")
    res = synthesize(topo, coll, [4096, 1 << 24], time_budget_s=30, out_dir=out)
    files = sorted(out.glob("*.xml"))
    assert len(files) == sum(1 for r in res.ranges if r.kind == "msccl")
    for f in files:
        sched = from_msccl_xml(f.read_text())
        assert sched.collective == coll
        assert sched.nranks == topo.world_size
        check_schedule(sched)  # raises ScheduleError on any flaw
    for sr in res.sizes:  # never slower than NCCL's default choice
        assert sr.estimate.time_us <= sr.default.time_us * (1 + 1e-9)
