from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from agent_testlib import FIXTURES


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copy a fixture (symlinks kept) into tmp so a test may damage it."""

    def make(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    return make
