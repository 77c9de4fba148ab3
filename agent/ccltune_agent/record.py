"""`ccltune-agent record --out DIR`: capture exactly what the probes read, as a replayable fixture.

DIR/nvml.json      the NVML snapshot (or why NVML was unavailable)
DIR/sysfs/...      every sysfs file, directory and symlink the probe touched, links made relative
DIR/nodetopology.json  what the agent derived from them (for the bug report reader)
Replay with: ccltune-agent probe --sysfs-root DIR/sysfs --nvml-recording DIR/nvml.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .nvml import NvmlSnapshot, NvmlSource, NvmlUnavailable, unavailable_json
from .probe import ProbeResult, probe


class _Capture:
    """Wraps an NVML source and keeps what it returned, so the recording is what the probe saw."""

    def __init__(self, inner: NvmlSource) -> None:
        self.inner = inner
        self.doc: dict[str, object] | None = None

    def snapshot(self) -> NvmlSnapshot:
        try:
            snap = self.inner.snapshot()
        except NvmlUnavailable as exc:
            self.doc = unavailable_json(str(exc))
            raise
        self.doc = snap.to_json()
        return snap


def record(out: Path, sysfs_root: Path, nvml: NvmlSource | None, node_name: str,
           cpuinfo: Path | None = None) -> ProbeResult:
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"--out {out} exists and is not empty; choose a new directory")
    capture = _Capture(nvml) if nvml is not None else None
    result = probe(node_name, sysfs_root, capture, cpuinfo)
    (out / "sysfs").mkdir(parents=True, exist_ok=True)
    nvml_doc = capture.doc if capture and capture.doc else unavailable_json(result.nvml_error or "not probed")
    (out / "nvml.json").write_text(json.dumps(nvml_doc, indent=1) + "\n")
    copy_touched(Path(sysfs_root), out / "sysfs", result.touched)
    if cpuinfo is not None and cpuinfo.is_file():  # where a replay looks for it
        (out / "sysfs" / "proc").mkdir(parents=True, exist_ok=True)
        (out / "sysfs" / "proc" / "cpuinfo").write_text(cpuinfo.read_text(errors="replace"))
    (out / "nodetopology.json").write_text(json.dumps(result.spec.wire(), indent=1) + "\n")
    return result


def copy_touched(src_root: Path, dst_root: Path, touched: set[str]) -> None:
    real_root = os.path.realpath(src_root)
    for rel in sorted(touched):
        src, dst = src_root / rel, dst_root / rel
        if src.is_symlink():
            target = os.path.realpath(src)
            if not target.startswith(real_root.rstrip("/") + "/"):
                continue
            target_rel = os.path.relpath(target, real_root)
            dst_target = dst_root / target_rel
            if os.path.isdir(target):
                dst_target.mkdir(parents=True, exist_ok=True)
            else:
                dst_target.parent.mkdir(parents=True, exist_ok=True)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.is_symlink() and not dst.exists():
                os.symlink(os.path.relpath(dst_target, dst.parent), dst)
        elif src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                dst.write_text(src.read_text(errors="replace"))
            except OSError:
                continue
