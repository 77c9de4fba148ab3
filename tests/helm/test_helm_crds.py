"""The chart ships exactly the generated CRDs, and the upgrade path hands kubectl the same bytes.

Helm installs crds/ once and never upgrades it, so docs/install.md upgrades CRDs with
`helm show crds ... | kubectl apply --server-side -f -`; these tests keep that command honest.
On drift, re-sync with either of:
    cp crds/*.yaml charts/ccltune/crds/
    .venv/bin/ccltune crds --out charts/ccltune/crds
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ccltune.cli.crds import render_crds

from .chart import CHART, run_helm
from .helm_binary import REPO_ROOT

ROOT_CRDS = REPO_ROOT / "crds"
CHART_CRDS = CHART / "crds"
SYNC = "cp crds/*.yaml charts/ccltune/crds/  (or: ccltune crds --out charts/ccltune/crds)"


def _files(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(d.glob("*.yaml"))}


def test_chart_crds_equal_root_crds() -> None:
    root, chart = _files(ROOT_CRDS), _files(CHART_CRDS)
    assert root, "no CRDs at the repository root"
    assert sorted(chart) == sorted(root), f"CRD files differ; run: {SYNC}"
    stale = [name for name in root if root[name] != chart[name]]
    assert not stale, f"charts/ccltune/crds out of date: {stale}; run: {SYNC}"


def test_chart_crds_equal_generated() -> None:
    generated, chart = render_crds(), _files(CHART_CRDS)
    stale = sorted(n for n in generated if chart.get(n) != generated[n])
    assert not stale and sorted(chart) == sorted(generated), (
        f"charts/ccltune/crds differ from the API models: {stale or sorted(chart)}; run: {SYNC}")


def test_helm_show_crds_is_what_upgrades_apply(helm: Path) -> None:
    proc = run_helm(helm, "show", "crds", str(CHART))
    assert proc.returncode == 0, proc.stderr
    shown = [d for d in yaml.safe_load_all(proc.stdout) if d]
    expected = [yaml.safe_load(t) for t in _files(ROOT_CRDS).values()]
    key = lambda d: d["metadata"]["name"]  # noqa: E731
    assert sorted(shown, key=key) == sorted(expected, key=key)
