"""Malformed or missing sysfs entries are skipped with a warning naming the path; the rest survives."""

from __future__ import annotations

import logging
import os

from agent_testlib import run_fixture

from ccltune_agent.agent import conditions_for


def _warned(result, fragment: str) -> bool:
    return any(fragment in w for w in result.warnings)


def test_malformed_class_skips_device(fixture_copy, caplog) -> None:
    root = fixture_copy("v100-sxm2-4")
    (root / "sysfs/sys/bus/pci/devices/0000:87:00.0/class").write_text("garbage\n")
    with caplog.at_level(logging.WARNING):
        r = run_fixture("v100-sxm2-4", root.parent)
    assert _warned(r, "/sys/bus/pci/devices/0000:87:00.0/class")
    assert "0000:87:00.0/class" in caplog.text
    # NVML still knows the GPU; it just has no sysfs position, which is reported too.
    assert len(r.spec.gpus) == 4
    assert _warned(r, "GPU 3 from NVML has no sysfs entry")
    assert any(a.distance == "SYS" for a in r.spec.affinity if a.gpu == 3)
    conds = {c.type: c for c in conditions_for(r)}
    assert conds["Degraded"].status == "True" and conds["Degraded"].reason == "SysfsEntriesSkipped"
    assert "0000:87:00.0/class" in conds["Degraded"].message


def test_missing_port_rate_and_dangling_links(fixture_copy) -> None:
    root = fixture_copy("dgx-a100")
    sysfs = root / "sysfs/sys"
    (sysfs / "class/infiniband/mlx5_3/ports/1/rate").unlink()
    os.unlink(sysfs / "class/infiniband/mlx5_7/device")
    os.symlink("../../../devices/nowhere/0000:99:00.0", sysfs / "class/infiniband/mlx5_7/device")
    (sysfs / "class/infiniband/mlx5_8/ports/1/link_layer").write_text("Token Ring\n")
    os.unlink(sysfs / "bus/pci/devices/0000:b7:00.0")
    os.symlink("../../../devices/gone/0000:b7:00.0", sysfs / "bus/pci/devices/0000:b7:00.0")
    r = run_fixture("dgx-a100", root.parent)
    assert _warned(r, "/sys/class/infiniband/mlx5_3/ports/1/rate: missing")
    assert _warned(r, "/sys/class/infiniband/mlx5_3/ports: no readable port")
    assert _warned(r, "/sys/class/infiniband/mlx5_7/device")
    assert _warned(r, "/sys/class/infiniband/mlx5_8/ports/1/link_layer")
    assert _warned(r, "/sys/bus/pci/devices/0000:b7:00.0: dangling")
    names = {n.name: n for n in r.spec.nics}
    assert "mlx5_7" not in names and names["mlx5_3"].ports == []
    assert names["mlx5_8"].ports[0].link_layer == "unknown"
    assert r.spec.nic_binding["0"] == "mlx5_0"  # the undamaged rails are unaffected


def test_malformed_numbers(fixture_copy) -> None:
    root = fixture_copy("a40-pcie-8")
    dev = root / "sysfs/sys/bus/pci/devices/0000:12:00.0"
    (dev / "numa_node").write_text("zero\n")
    (dev / "max_link_width").write_text("99\n")
    (dev / "vendor").write_text("nvidia\n")
    (root / "sysfs/sys/devices/system/node/node1/cpulist").write_text("all of them\n")
    (root / "sysfs/sys/class/net/eno1/speed").write_text("fast\n")
    r = run_fixture("a40-pcie-8", root.parent)
    for frag in ("0000:12:00.0/numa_node: not an integer", "0000:12:00.0/max_link_width: width 99",
                 "0000:12:00.0/vendor: malformed id", "node1/cpulist: malformed",
                 "/sys/class/net/eno1/speed: not an integer"):
        assert _warned(r, frag), frag
    pci = {d.bus_id: d for d in r.spec.pci_devices}
    assert pci["0000:12:00.0"].max_link_width is None and pci["0000:12:00.0"].numa_node == -1
    assert next(n for n in r.spec.nics if n.name == "eno1").ports[0].rate_gbps == 0.0


def test_empty_root_gives_empty_report(tmp_path) -> None:
    (tmp_path / "sys").mkdir()
    from ccltune_agent.probe import probe

    r = probe("bare", tmp_path, None)
    assert r.spec.gpus == [] and r.spec.nics == [] and r.nvml_error
    assert conditions_for(r)[0].reason == "NvmlUnavailable"


def test_sriov_virtual_functions_are_not_rails(fixture_copy) -> None:
    root = fixture_copy("a40-pcie-8")
    sysfs = root / "sysfs/sys"
    pf = os.readlink(sysfs / "bus/pci/devices/0000:61:00.0")  # ../../../devices/.../0000:61:00.0
    vf_dir = (sysfs / "bus/pci/devices" / pf).resolve().parent / "0000:61:00.2"
    vf_dir.mkdir()
    for name, value in (("class", "0x020000"), ("vendor", "0x15b3"), ("device", "0x101e"), ("numa_node", "0")):
        (vf_dir / name).write_text(value + "\n")
    os.symlink("../0000:61:00.0", vf_dir / "physfn")
    os.symlink(os.path.relpath(vf_dir, sysfs / "bus/pci/devices"), sysfs / "bus/pci/devices/0000:61:00.2")
    ib = sysfs / "class/infiniband/mlx5_2"
    (ib / "ports/1").mkdir(parents=True)
    os.symlink(os.path.relpath(vf_dir, ib), ib / "device")
    (ib / "ports/1/rate").write_text("100 Gb/sec (4X EDR)\n")
    (ib / "ports/1/state").write_text("4: ACTIVE\n")
    (ib / "ports/1/link_layer").write_text("Ethernet\n")
    r = run_fixture("a40-pcie-8", root.parent)
    assert r.warnings == []
    assert {n.name for n in r.spec.nics} == {"mlx5_0", "mlx5_1", "eno1"}
    assert any("SR-IOV virtual functions not listed as NICs: mlx5_2" in n for n in r.spec.notes)
