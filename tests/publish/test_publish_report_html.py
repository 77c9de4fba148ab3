"""report.html as a browser shows it: headless Chromium (Debian's `chromium`) takes a screenshot,
which must not be blank and must show the plots' curve colours (the inline SVG was drawn).

Without Chromium the test skips, except under CI (CI set), where it fails: scripts/install puts
Chromium in place there (docs/report.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageStat

from ccltune.publish.html import render_html
from ccltune.publish.plots import svg_plots
from ccltune.publish.report import build_report

from .test_publish_report import _plan

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]  # fmt: skip


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = "no chromium on PATH (Debian: apt-get install chromium; scripts/install does it in CI)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _pixels_near(image: np.ndarray, colour: str, tolerance: int = 40) -> int:
    want = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(image.astype(int) - want) <= tolerance).all(axis=-1).sum())


def test_report_html_renders_in_chromium_to_a_page_with_plots(tmp_path: Path) -> None:
    chromium = _chromium()
    report = build_report(_plan(), "2 nodes x 8 GPUs")
    page = tmp_path / "report.html"
    page.write_text(render_html(report, svg_plots(report)))
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert shot.is_file(), result.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2400)
    grey = image.convert("L")
    assert ImageStat.Stat(grey).var[0] > 100.0, "the screenshot is (nearly) one colour"
    pixels = np.asarray(image)
    # Curve colours of publish/plots.py: synthesized orange and tuned blue.
    for colour in ("#ff7f0e", "#1f77b4"):
        assert _pixels_near(pixels, colour) > 200, f"no {colour} pixels: plot not drawn"
