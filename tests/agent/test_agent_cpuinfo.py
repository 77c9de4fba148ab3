"""The host CPU from /proc/cpuinfo, in the terms of NCCL's topology file."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_testlib import NAMES, run_fixture

from ccltune.topology.nccl_xml import parse_nccl_xml, write_nccl_xml
from ccltune_agent.sysfs import SysRoot, read_cpuinfo

X86 = "processor\t: 0\nvendor_id\t: {v}\ncpu family\t: {f}\nmodel\t\t: {m}\nmodel name\t: {n}\n\nprocessor\t: 1\n"


def cpuinfo(tmp_path: Path, text: str | None) -> SysRoot:
    if text is not None:
        (tmp_path / "proc").mkdir()
        (tmp_path / "proc" / "cpuinfo").write_text(text)
    return SysRoot(tmp_path)


@pytest.mark.parametrize(("vendor", "family", "model", "nccl_family"), [
    ("GenuineIntel", 6, 143, 6),       # Sapphire Rapids: family below 0xF is kept
    ("AuthenticAMD", 23, 49, 143),     # Rome 17h: NCCL adds extended family << 4
    ("AuthenticAMD", 25, 17, 175),     # Genoa 19h (cf. azure-ncv4-topo.xml familyid 175)
])
def test_x86_family_as_nccl_computes_it(tmp_path: Path, vendor: str, family: int, model: int,
                                        nccl_family: int) -> None:
    sys = cpuinfo(tmp_path, X86.format(v=vendor, f=family, m=model, n="X"))
    info = read_cpuinfo(sys)
    assert info is not None
    assert (info.arch, info.vendor, info.family_id, info.model_id) == ("x86_64", vendor, nccl_family, model)
    assert "proc/cpuinfo" in sys.touched  # `record` copies it into the fixture


def test_arm_and_power(tmp_path: Path) -> None:
    arm = read_cpuinfo(cpuinfo(tmp_path, "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\n"))
    assert arm is not None and arm.arch == "arm64" and arm.vendor is None


def test_power(tmp_path: Path) -> None:
    power = read_cpuinfo(cpuinfo(tmp_path, "processor\t: 0\ncpu\t\t: POWER9, altivec supported\n"))
    assert power is not None and power.arch == "ppc64"


@pytest.mark.parametrize("text", [None, "processor\t: 0\nfoo\t: bar\n"])
def test_missing_or_unknown_is_a_warning_not_a_guess(tmp_path: Path, text: str | None) -> None:
    sys = cpuinfo(tmp_path, text)
    assert read_cpuinfo(sys) is None
    assert sys.warnings and "proc/cpuinfo" in sys.warnings[0]


def test_bad_family_keeps_vendor_only(tmp_path: Path) -> None:
    sys = cpuinfo(tmp_path, X86.format(v="GenuineIntel", f="six", m=143, n="X"))
    info = read_cpuinfo(sys)
    assert info is not None and info.vendor == "GenuineIntel" and info.family_id is None
    assert any("not an integer" in w for w in sys.warnings)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_cpu_reaches_the_nccl_file(name: str) -> None:
    spec = run_fixture(name).spec
    assert spec.cpu is not None and spec.cpu.nccl_complete()
    cpus = parse_nccl_xml(write_nccl_xml(spec)).cpus.values()
    assert cpus and all(c["arch"] == "x86_64" and c["vendor"] == spec.cpu.vendor
                        and c["familyid"] == str(spec.cpu.family_id) for c in cpus)


def test_cpuinfo_option_is_recorded_where_a_replay_reads_it(tmp_path: Path) -> None:
    """`--cpuinfo /proc/cpuinfo` in a pod; `record` puts the file under the recorded root."""
    from agent_testlib import FIXTURES

    from ccltune_agent.nvml import ReplayNvml
    from ccltune_agent.probe import probe
    from ccltune_agent.record import record

    outside = tmp_path / "cpuinfo"
    outside.write_text(X86.format(v="GenuineIntel", f=6, m=207, n="Emerald Rapids"))
    base = FIXTURES / "hgx-h100"
    live = record(tmp_path / "rec", base / "sysfs", ReplayNvml(base / "nvml.json"), "n", cpuinfo=outside)
    assert live.spec.cpu is not None and live.spec.cpu.model_id == 207
    replay = probe("n", tmp_path / "rec" / "sysfs", ReplayNvml(tmp_path / "rec" / "nvml.json"))
    assert replay.spec.cpu == live.spec.cpu
    assert replay.spec.content_hash == live.spec.content_hash
