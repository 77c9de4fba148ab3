"""Fixtures for the chart tests: the helm binary and rendered manifests per values file."""

from __future__ import annotations

from pathlib import Path

import pytest

from .chart import VALUES_FILES, Rendered, render_cached
from .helm_binary import ToolDownloadRefused, helm_binary


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return helm_binary()
    except ToolDownloadRefused as exc:
        pytest.skip(f"helm unavailable: {exc}")


@pytest.fixture(scope="session", params=VALUES_FILES, ids=lambda p: p.name)
def rendered(request: pytest.FixtureRequest, helm: Path) -> Rendered:
    """`helm template` output for one values file (rendered once per session)."""
    return render_cached(helm, request.param)
