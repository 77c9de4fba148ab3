"""NVML: live reader against a fake pynvml, replay errors, and record -> replay round trips."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from agent_testlib import FIXTURES, run_fixture

from ccltune_agent.nvml import (
    NvmlUnavailable,
    RealNvml,
    RecordingError,
    ReplayNvml,
    normalize_bus_id,
)
from ccltune_agent.probe import probe
from ccltune_agent.record import record


class _Err(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_pynvml(init_error: int | None = None) -> types.ModuleType:
    """Two V100s joined by two NVLinks; link 2 reports 'not supported' (ends the list)."""
    m: Any = types.ModuleType("pynvml")
    m.NVMLError = _Err
    m.NVML_ERROR_NOT_SUPPORTED = 3
    m.NVML_NVLINK_MAX_LINKS = 18
    m.NVML_P2P_CAPS_INDEX_READ = 0
    bus = ["00000000:06:00.0", "00000000:07:00.0"]

    def init() -> None:
        if init_error is not None:
            raise _Err(init_error)

    def state(h: int, link: int) -> int:
        if link >= 2:
            raise _Err(3)
        return 1

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"470.1"
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=16 << 30)
    m.nvmlDeviceGetMigMode = lambda h: (_ for _ in ()).throw(_Err(3))
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (7, 0)
    m.nvmlDeviceGetNumaNodeId = lambda h: (_ for _ in ()).throw(_Err(999))
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    m.nvmlDeviceGetName = lambda h: b"Tesla V100-SXM2-16GB"
    m.nvmlDeviceGetNvLinkState = state
    m.nvmlDeviceGetNvLinkVersion = lambda h, link: 2
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=bus[1 - h])
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: 0
    m.nvmlDeviceGetP2PStatus = lambda a, b, idx: 0
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 10
    return m


def test_live_reader_maps_nvml(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    snap = RealNvml().snapshot()
    assert snap.driver_version == "470.1"
    g0, _g1 = snap.gpus
    assert g0.bus_id == "0000:06:00.0" and g0.compute_capability == (7, 0) and g0.mig_mode is None
    assert [(ln.link, ln.active, ln.remote_bus_id, ln.remote_type) for ln in g0.nvlinks] == [
        (0, True, "0000:07:00.0", "gpu"), (1, True, "0000:07:00.0", "gpu")]
    assert snap.pairs[0].p2p_read == "ok" and snap.pairs[0].common_ancestor == "single"
    # NOT_SUPPORTED is normal (MIG on V100); other failures are kept as notes.
    assert snap.errors == ["gpu 0 NUMA node: NVML error 999", "gpu 1 NUMA node: NVML error 999"]


def test_live_reader_without_driver(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=9))
    with pytest.raises(NvmlUnavailable, match="nvmlInit failed"):
        RealNvml().snapshot()


def test_replay_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RecordingError, match=str(bad)):
        ReplayNvml(bad).snapshot()
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(RecordingError, match="'format'"):
        ReplayNvml(bad).snapshot()
    bad.write_text(json.dumps({"format": "ccltune.io/nvml-recording/v1", "gpus": [{"index": 0}]}))
    with pytest.raises(RecordingError, match="bad GPU"):
        ReplayNvml(bad).snapshot()
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        ReplayNvml(FIXTURES / "no-nvml.json").snapshot()
    with pytest.raises(NvmlUnavailable, match="does not exist"):
        ReplayNvml(tmp_path / "absent.json").snapshot()


def test_bus_id_normalization() -> None:
    assert normalize_bus_id("00000000:0F:00.0") == "0000:0f:00.0"
    assert normalize_bus_id("0001:00:00.0") == "0001:00:00.0"
    with pytest.raises(ValueError):
        normalize_bus_id("07:00.0")


@pytest.mark.parametrize("name", ["dgx-a100", "a40-pcie-8", "azure-ndv4-vm"])
def test_record_replays_to_the_same_report(name: str, tmp_path: Path, fixture_copy) -> None:
    src = fixture_copy(name)
    (src / "sysfs/sys/devices/system/node/node0/meminfo").write_text("never read by a probe\n")
    out = tmp_path / "rec"
    first = record(out, src / "sysfs", ReplayNvml(src / "nvml.json"), "node-a")
    again = probe("node-a", out / "sysfs", ReplayNvml(out / "nvml.json"))
    assert again.spec.content_hash == first.spec.content_hash == run_fixture(name).spec.content_hash
    assert again.warnings == []
    assert json.loads((out / "nodetopology.json").read_text())["contentHash"] == first.spec.content_hash
    assert not (out / "sysfs/sys/devices/system/node/node0/meminfo").exists()
    assert (out / "sysfs/sys/devices/system/node/node0/cpulist").exists()
    assert all(os.path.exists(p) for p in (out / "sysfs/sys/bus/pci/devices").iterdir())  # links resolve


def test_record_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    with pytest.raises(FileExistsError):
        record(tmp_path, FIXTURES / "v100-sxm2-4/sysfs", None, "n")


def test_real_nvml_on_this_machine_is_either_usable_or_says_why() -> None:
    try:
        snap = RealNvml().snapshot()
    except NvmlUnavailable as exc:
        assert "nvml" in str(exc).lower()
    else:  # a GPU node: the live reader must produce a consistent snapshot
        assert snap.gpus and all(g.bus_id.count(":") == 2 for g in snap.gpus)
