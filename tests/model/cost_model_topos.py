"""Random symmetric clusters (hypothesis) and small hand-built ones for the cost-model tests."""

from __future__ import annotations

from hypothesis import strategies as st

from ccltune.api.cluster import ClusterTopology
from ccltune.topology.cluster_file import from_spec
from ccltune.topology.spec import ClusterSpec


def spec_topology(
    servers: int,
    gpus: int,
    fabric: str,
    *,
    nics: int = 1,
    layout: str = "tor",
    intra_bw: float = 100.0,
    intra_lat: float = 0.6,
    nic_gbps: float = 200.0,
    nic_lat: float = 2.0,
    tiers: list[dict] | None = None,
    gpu_model: str = "A100-SXM4-80GB",
) -> ClusterTopology:
    intra: dict = {"fabric": fabric, "latencyUs": intra_lat}
    if fabric == "nvswitch":
        intra["bandwidthGbps"] = intra_bw
    elif fabric in ("fully_connected", "ring"):
        intra["linkBandwidthGbps"] = intra_bw
    data: dict = {
        "name": f"t-{servers}x{gpus}-{fabric}",
        "gpuModel": gpu_model,
        "servers": servers,
        "gpusPerServer": gpus,
        "intraNode": intra,
        "pcie": {"generation": 4, "lanes": 16, "gpusPerSwitch": 2, "cpus": 1},
    }
    if servers > 1 or nics:
        data["nics"] = {"perServer": nics, "rateGbps": nic_gbps * 8, "latencyUs": nic_lat}
        data["network"] = {"layout": layout, "tiers": tiers or []}
    return from_spec(ClusterSpec.model_validate(data))


@st.composite
def symmetric_topologies(
    draw: st.DrawFn, max_servers: int = 4, max_gpus: int = 4
) -> ClusterTopology:
    servers = draw(st.integers(1, max_servers))
    gpus = draw(st.integers(1, max_gpus))
    fabrics = ["pcie"] if gpus == 1 else ["nvswitch", "fully_connected", "pcie"]
    if gpus >= 3:
        fabrics.append("ring")
    fabric = draw(st.sampled_from(fabrics))
    nics = draw(st.sampled_from(sorted({1, gpus})))
    layout = draw(st.sampled_from(["tor", "rail"]))
    tiers = None
    if servers == 4 and draw(st.booleans()):
        tiers = [
            {"name": "leaf" if layout == "tor" else "rail", "size": 2},
            {"name": "spine", "latencyUs": draw(st.sampled_from([0.5, 1.0]))},
        ]
    return spec_topology(
        servers,
        gpus,
        fabric,
        nics=nics,
        layout=layout,
        intra_bw=draw(st.sampled_from([50.0, 100.0, 300.0])),
        intra_lat=draw(st.sampled_from([0.0, 0.6, 1.5])),
        nic_gbps=draw(st.sampled_from([12.5, 25.0, 50.0])),
        nic_lat=draw(st.sampled_from([0.5, 2.5])),
        tiers=tiers,
    )
