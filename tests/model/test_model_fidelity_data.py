"""The stored real nccl-tests measurements (benchmarks/data/nccl-tests) parse and are physically sane.

Structural checks only: the model-vs-measurement error target is benchmarks/model_fidelity.py's job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccltune.api.cluster import ClusterTopology, DeviceKind, LinkKind
from ccltune.model.cost.busbw import busbw_gbps
from ccltune.model.cost.protocols import Arch, arch_of
from ccltune.topology.load import load_cluster
from ccltune.tune.profilers.nccltests import parse_log

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "nccl-tests"
SETS = sorted(p.name for p in DATA.iterdir() if (p / "set.json").is_file())
INJECTING = (LinkKind.NVLINK, LinkKind.XGMI, LinkKind.PCIE)


def _cluster(directory: Path, ref: str) -> ClusterTopology:
    return load_cluster(str(directory / ref) if ref.endswith((".yaml", ".yml")) else ref)


def injection_gbps(topo: ClusterTopology) -> float:
    """Most any GPU can send per direction: the sum of its NVLink/xGMI/PCIe links."""
    best = 0.0
    for rank in range(topo.world_size):
        gid = topo.gpu_id(rank)
        total = sum(link.bandwidth_gbps for link in topo.links
                    if gid in (link.a, link.b) and LinkKind(link.kind) in INJECTING)  # fmt: skip
        best = max(best, total)
    return best


def busbw_bound(collective: str, topo: ClusterTopology) -> float:
    """Without in-network reduction a rank sends at least the busbw's bytes (Patarasuk & Yuan,
    2009); NVLink SHARP (NVSwitch on Hopper and later) reduces in the switch, so an allreduce rank
    sends each byte once and receives it once: at most twice that."""
    nvls = arch_of(topo.gpu_model) == Arch.HOPPER and any(
        d.kind == DeviceKind.NVSWITCH for d in topo.devices
    )
    return injection_gbps(topo) * (2.0 if nvls and collective == "allreduce" else 1.0)


def test_there_are_three_hardware_types_on_one_and_several_nodes() -> None:
    metas = [json.loads((DATA / s / "set.json").read_text()) for s in SETS]
    models = {
        _cluster(DATA / s, m["cluster"]).gpu_model.split("-")[0]
        for s, m in zip(SETS, metas, strict=True)
    }
    assert len(models) >= 3, models
    assert {m["nodes"] == 1 for m in metas} == {True, False}


@pytest.mark.parametrize("name", SETS)
def test_set_parses_and_is_physically_sane(name: str) -> None:
    directory = DATA / name
    meta = json.loads((directory / "set.json").read_text())
    source = (directory / "SOURCE.md").read_text()
    for field in ("Where from", "Hardware", "Command"):
        assert f"**{field}**" in source, f"{name}/SOURCE.md lacks {field}"
    topo = _cluster(directory, meta["cluster"])
    assert (topo.node_count, topo.gpus_per_node) == (meta["nodes"], meta["gpus_per_node"])
    rows = parse_log((directory / meta["log"]).read_text(), name).rows()
    assert len(rows) >= 8
    sizes = [r.size for r in rows]
    assert sizes == sorted(set(sizes)), "sizes must strictly increase"
    assert any(s >= 1 << 20 for s in sizes), "the error target is judged from 1 MiB up"
    bound = busbw_bound(meta["collective"], topo)
    for r in rows:
        assert r.time_us > 0 and r.inplace_time_us > 0
        # The printed busbw is nccl-tests' own factor over the printed time (2-decimal rounding).
        ours = busbw_gbps(meta["collective"], topo.world_size, r.size, r.time_us)
        assert ours == pytest.approx(r.busbw_gbps, rel=0.02, abs=0.011), r
        assert r.busbw_gbps <= bound, (
            f"{r.size} B: busbw {r.busbw_gbps} > physical bound {bound:.0f}"
        )
