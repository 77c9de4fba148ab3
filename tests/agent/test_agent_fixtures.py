"""Each fixture yields the GPUs, links, NICs, bindings and distance classes of the real server."""

from __future__ import annotations

from collections import Counter

import pytest
from agent_testlib import NAMES, run_fixture

from ccltune.api.nodetopology import NodeTopologySpec
from ccltune.topology.nccl_xml import parse_nccl_xml, write_nccl_xml


def dist(spec: NodeTopologySpec, gpu: int, nic: str) -> str:
    return next(a.distance for a in spec.affinity if a.gpu == gpu and a.nic == nic)


def up_links(spec: NodeTopologySpec, gpu: int) -> list:
    return [link for link in spec.gpus[gpu].nvlinks if link.state == "up"]


def test_dgx_a100() -> None:
    r = run_fixture("dgx-a100")
    s = r.spec
    assert r.warnings == [] and r.nvml_error is None
    assert [g.name for g in s.gpus] == ["NVIDIA A100-SXM4-40GB"] * 8
    assert [g.pci_bus_id for g in s.gpus] == [f"0000:{b}:00.0" for b in
                                              ("07", "0f", "47", "4e", "87", "90", "b7", "bd")]
    for g in range(8):
        links = up_links(s, g)
        assert len(links) == 12 and {ln.remote_type for ln in links} == {"nvswitch"}
        assert {ln.bandwidth_gbps for ln in links} == {25.0} and {ln.version for ln in links} == {3}
        assert len({ln.remote_pci_bus_id for ln in links}) == 6  # 2 links to each of 6 NVSwitches
    ib = [n for n in s.nics if n.ports[0].link_layer == "InfiniBand"]
    assert len(ib) == 8 and {n.ports[0].rate_gbps for n in ib} == {200.0}
    assert s.nic_binding == {"0": "mlx5_0", "1": "mlx5_1", "2": "mlx5_2", "3": "mlx5_3",
                             "4": "mlx5_6", "5": "mlx5_7", "6": "mlx5_8", "7": "mlx5_9"}
    # Two-level PCIe switches: GPU and NIC share the top switch only -> PXB (as nvidia-smi shows).
    assert dist(s, 0, "mlx5_0") == dist(s, 0, "mlx5_1") == "PXB"
    assert dist(s, 0, "mlx5_2") == "SYS"  # NUMA 3 vs NUMA 1
    assert dist(s, 0, "mlx5_4") == "SYS"  # storage NIC, other NUMA node
    assert s.gpus[0].numa_node == 3 and not s.pcie_flattened
    assert sum(1 for d in s.pci_devices if d.class_code == "0x068000") == 6


def test_hgx_h100_eight_rails() -> None:
    s = run_fixture("hgx-h100").spec
    assert len(s.gpus) == 8 and all(g.compute_capability == "9.0" for g in s.gpus)
    for g in range(8):
        links = up_links(s, g)
        assert len(links) == 18 and {ln.remote_type for ln in links} == {"nvswitch"}
        assert Counter(ln.remote_pci_bus_id for ln in links).most_common()[-1][1] == 4
        assert dist(s, g, f"mlx5_{g}") == "PIX"  # one rail NIC per GPU behind the same switch
    assert {n.ports[0].rate_gbps for n in s.nics} == {400.0}
    assert s.nic_binding == {str(i): f"mlx5_{i}" for i in range(8)}
    assert dist(s, 0, "mlx5_1") == "PHB" and dist(s, 0, "mlx5_4") == "SYS"
    assert {p.common_ancestor for p in s.p2p if p.gpu_a == 0 and p.gpu_b == 7} == {"system"}


def test_v100_hybrid_cube_mesh() -> None:
    s = run_fixture("v100-sxm2-4").spec
    by_bus = {g.pci_bus_id: g.index for g in s.gpus}
    count: Counter[tuple[int, int]] = Counter()
    for g in s.gpus:
        assert len(g.nvlinks) == 6  # V100 has six NVLink bricks
        for ln in g.nvlinks:
            if ln.state == "up":
                assert ln.remote_type == "gpu" and ln.bandwidth_gbps == 25.0
                count[(g.index, by_bus[str(ln.remote_pci_bus_id)])] += 1
    mesh = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2}
    for (a, b), n in mesh.items():
        assert count[(a, b)] == count[(b, a)] == n
    assert s.nic_binding == {"0": "mlx5_0", "1": "mlx5_0", "2": "mlx5_1", "3": "mlx5_1"}
    assert dist(s, 0, "mlx5_0") == "PIX" and dist(s, 0, "mlx5_1") == "SYS"
    assert {n.ports[0].rate_gbps for n in s.nics} == {100.0}


def test_a40_pcie_no_nvlink() -> None:
    s = run_fixture("a40-pcie-8").spec
    assert len(s.gpus) == 8 and all(not up_links(s, g) for g in range(8))
    assert all(ln.state == "down" and ln.bandwidth_gbps is None for g in s.gpus for ln in g.nvlinks)
    names = {n.name: n for n in s.nics}
    assert set(names) == {"mlx5_0", "mlx5_1", "eno1"}
    assert names["mlx5_0"].ports[0].link_layer == "Ethernet"  # RoCE
    assert names["eno1"].ports[0].rate_gbps == 10.0 and names["eno1"].netdev == "eno1"
    # RDMA NICs win over the management NIC even where eno1 is as close.
    assert s.nic_binding == {**{str(i): "mlx5_0" for i in range(4)}, **{str(i): "mlx5_1" for i in range(4, 8)}}
    assert dist(s, 0, "mlx5_0") == "PHB" and dist(s, 0, "mlx5_1") == "SYS" and dist(s, 0, "eno1") == "PHB"
    p2p = {(p.gpu_a, p.gpu_b): p for p in s.p2p}
    assert len(p2p) == 28
    assert p2p[(0, 1)].common_ancestor == "single" and p2p[(0, 2)].common_ancestor == "hostbridge"
    assert p2p[(0, 4)].p2p_read == "chipset_not_supported"


def test_flattened_vm_grouped_by_numa() -> None:
    s = run_fixture("azure-ndv4-vm").spec
    assert s.pcie_flattened and any("grouped by NUMA" in n for n in s.notes)
    assert {n.name for n in s.nics} == {f"mlx5_{i}" for i in range(8)}  # eth0 (VMBus) is not PCI
    assert not any(d.class_code.startswith("0x0604") for d in s.pci_devices)  # no invented switch
    gpu_numa = {g.pci_bus_id: g.numa_node for g in s.gpus}
    assert gpu_numa["0001:00:00.0"] == 1 and gpu_numa["0003:00:00.0"] == 0
    for a in s.affinity:
        gpu, nic = s.gpus[a.gpu], next(n for n in s.nics if n.name == a.nic)
        assert a.distance == ("PHB" if gpu.numa_node == nic.numa_node else "SYS")
    for gpu_index, nic_name in s.nic_binding.items():
        assert s.gpus[int(gpu_index)].numa_node == next(n.numa_node for n in s.nics if n.name == nic_name)
    assert len(set(s.nic_binding.values())) == 8


def test_flattened_vm_xml_matches_azure_file() -> None:
    """Our XML puts every device on the NUMA node Azure's own NCCL topology file says."""
    from pathlib import Path

    real = Path("/work/shared/data/topologies/azure-ndv4-topo.xml")
    if not real.exists():
        pytest.skip("shared data not mounted")
    theirs = parse_nccl_xml(real.read_text())
    want = {p.busid: p.numaid for p in theirs.pcis if p.pci_class in ("0x030200", "0x020700")}
    ours = parse_nccl_xml(write_nccl_xml(run_fixture("azure-ndv4-vm").spec))
    got = {p.busid: p.numaid for p in ours.pcis}
    assert got == want
    assert all(p.parent is None for p in ours.pcis)


@pytest.mark.parametrize("name", NAMES)
def test_xml_has_every_gpu_nic_and_nvlink(name: str) -> None:
    spec = run_fixture(name).spec
    topo = parse_nccl_xml(write_nccl_xml(spec))
    gpus = {g.busid: g for g in topo.gpus}
    assert set(gpus) == {g.pci_bus_id for g in spec.gpus}
    for g in spec.gpus:
        xg = gpus[g.pci_bus_id]
        assert xg.dev == g.index and xg.numaid == g.numa_node
        ups = [ln for ln in g.nvlinks if ln.state == "up"]
        assert sum(x.count for x in xg.nvlinks) == len(ups)
        gpu_targets = {ln.remote_pci_bus_id for ln in ups if ln.remote_type == "gpu"}
        assert {x.target for x in xg.nvlinks if x.tclass == "0x030200"} == gpu_targets
    assert {n.name for n in topo.nets} == {n.name for n in spec.nics}
    for net in topo.nets:
        nic = next(n for n in spec.nics if n.name == net.name)
        assert net.busid == nic.pci_bus_id and net.speed_mbps == int(nic.ports[0].rate_gbps * 1000)
    # Parents in the XML are real bridges from sysfs, never invented.
    bridges = {d.bus_id for d in spec.pci_devices if d.class_code.startswith("0x0604")}
    assert {p.busid for p in topo.pcis if p.pci_class.startswith("0x0604")} <= bridges


@pytest.mark.parametrize("name", NAMES)
def test_hash_ignores_probe_time(name: str) -> None:
    a, b = run_fixture(name).spec, run_fixture(name).spec
    assert a.content_hash == b.content_hash and a.content_hash.startswith("sha256:")
    assert a.probed_at is not None
