"""Small symmetric clusters built the way users describe them (ClusterSpec -> graph -> dims)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ccltune.api.cluster import ClusterTopology
from ccltune.topology.builder import build
from ccltune.topology.spec import ClusterSpec, IntraNode, Network, Nics, Tier
from ccltune.topology.symmetry import detect

CHECK_PLAN = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "check-plan"


def check_plan(plan: Path, *args: str) -> str:
    """The conformance kit (NCCL's and msccl-executor's own code) on a plan directory: its
    output, after asserting that it ran and that everything passed."""
    assert CHECK_PLAN.exists(), f"conformance kit missing at {CHECK_PLAN}"
    p = subprocess.run([str(CHECK_PLAN), str(plan), *args], capture_output=True, text=True,
                       timeout=900)  # fmt: skip
    assert p.returncode != 2, p.stdout + p.stderr  # the kit could not run: nothing was checked
    assert p.returncode == 0, p.stdout
    return p.stdout


def write_in_place_file(plan: Path, name: str, coll: Any, arr: Any, low: Any) -> None:
    """A Simple-protocol file as the engine writes it, in place, selected from the first size
    the executor would pick it at: `plan`/msccl/`name`.xml."""
    from ccltune.model.formats.msccl.limits import first_selected
    from ccltune.model.formats.msccl.stream import render_lowering
    from ccltune.synth import engine

    start = first_selected(coll, arr.nranks, engine._chunks_per_loop(arr), 1)
    assert start is not None
    xml = plan / "msccl" / f"{name}.xml"
    xml.parent.mkdir(exist_ok=True)
    xml.write_text(render_lowering(low, name=name, proto="Simple", nchannels=arr.channels,
                                   min_bytes=start, inplace=True), encoding="utf-8")  # fmt: skip


def make_cluster(gpus: int, servers: int, fabric: str = "nvswitch", layout: str = "rail",
                 nvlink: float = 100.0, nic_gbps: float = 200.0, tiers: list[int] | None = None) -> ClusterTopology:  # fmt: skip
    if fabric == "nvswitch":
        intra = IntraNode(fabric="nvswitch", bandwidth_gbps=nvlink)
    else:
        intra = IntraNode(fabric=fabric, link_bandwidth_gbps=nvlink)
    net = Network(
        layout=layout, tiers=[Tier(name=f"t{i}", size=s) for i, s in enumerate(tiers or [])]
    )
    spec = ClusterSpec(name=f"t-{fabric}-{gpus}x{servers}", servers=servers, gpus_per_server=gpus,
                       intra_node=intra, nics=Nics(per_server=gpus, rate_gbps=nic_gbps),
                       network=net)  # fmt: skip
    return detect(build(spec))


def allgather_combination_inputs(topo: ClusterTopology) -> tuple[Any, ...]:
    """What `combine.candidates` takes for AllGather on a symmetric preset, as the engine builds
    it: (fabric, collective, sketches, patterns, dimensions)."""
    from ccltune.api.common import Collective
    from ccltune.synth import assemble as asm
    from ccltune.synth import engine
    from ccltune.synth.sketch import search

    dims = topo.dimensions
    assert dims is not None
    sketches, _ = search(dims, relays=True)
    coll = Collective.ALLGATHER
    pats = asm.Patterns(engine._solve(dims, sketches, True, 1, coll, 1, 500))
    return asm.Fabric(dims), coll, sketches, pats, dims
