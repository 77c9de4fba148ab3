"""Render the chart with a real helm and hand the manifests to the tests."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .helm_binary import REPO_ROOT

CHART = REPO_ROOT / "charts" / "ccltune"
PRESETS = REPO_ROOT / "helm"
# Every values file CI renders: the chart defaults plus each preset in helm/.
VALUES_FILES = [CHART / "values.yaml", *sorted(PRESETS.glob("*.yaml"))]
RELEASE = "ccltune"
NAMESPACE = "ccltune-system"
# The Kubernetes version manifests are rendered for; they are validated (kubernetes-validate)
# against it and against the oldest version Chart.yaml's kubeVersion admits.
KUBE_VERSION = "1.33.0"
KUBE_VERSIONS = ("1.29.0", KUBE_VERSION)


@dataclass
class Rendered:
    values: list[Path]
    docs: list[dict[str, Any]]

    def values_merged(self) -> dict[str, Any]:
        """The chart defaults overlaid with the values files, as helm merges maps."""
        merged: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
        for path in self.values:
            merged = _merge(merged, yaml.safe_load(path.read_text()) or {})
        return merged

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
        return found[0]


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
    return over


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def template_args(values: list[Path], sets: list[str] | None = None) -> list[str]:
    args = [
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds",
        "--kube-version", KUBE_VERSION,
    ]
    for v in values:
        args += ["-f", str(v)]
    for s in sets or []:
        args += ["--set", s]
    return args


def render(helm: Path, values: list[Path], sets: list[str] | None = None) -> Rendered:
    proc = run_helm(helm, *template_args(values, sets))
    if proc.returncode != 0:
        raise AssertionError(f"helm template {values} {sets} failed:\n{proc.stderr}")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return Rendered(values=values, docs=docs)


def render_error(helm: Path, values: list[Path], sets: list[str]) -> str:
    """stderr of a render that must fail (schema or template `fail`)."""
    proc = run_helm(helm, *template_args(values, sets))
    assert proc.returncode != 0, f"helm template with {sets} unexpectedly succeeded"
    return proc.stderr


_cache: dict[Path, Rendered] = {}


def render_cached(helm: Path, values: Path) -> Rendered:
    """One values file rendered once per test session."""
    if values not in _cache:
        _cache[values] = render(helm, [values])
    return _cache[values]
