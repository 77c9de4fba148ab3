"""Every plan ccltune writes is loaded by the real consumers' own code and does what its report
claims, for each runtime: ../shared/conformance/check-plan runs NCCL 2.30.7's topology loader and
env parser, msccl-executor-nccl's MSCCL parser and selection rule, NCCL's example tuner plugin.

The matrix (kept cheap: one plan and one check-plan run per case, plans built once per module):
- every example spec on its intended cluster, for each runtime that drives the cluster's GPUs;
- every preset with a small spec (tuning on, synthesis on for one collective over 1M-4M on at most
  16 ranks, NCCL_TOPO_FILE always published for NVIDIA runtimes so NCCL's loader reads it),
  likewise;
- a runtime that cannot drive a cluster's GPUs (rccl on NVIDIA, nccl/msccl on AMD) is refused with
  one line naming spec.publish.runtime, checked once per preset and example.
A missing kit or one that cannot run (exit 2) fails: never skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.common import parse_size
from ccltune.api.plan import Plan
from ccltune.pipeline import PlanError, build_plan
from ccltune.publish.runtime import gpu_vendor
from ccltune.topology.load import load_cluster

REPO = Path(__file__).resolve().parents[2]
CHECK_PLAN = REPO.parent / "shared" / "conformance" / "check-plan"
PRESETS = sorted(p.stem for p in (REPO / "operator/ccltune/topology/presets").glob("*.yaml"))
# The cluster each example is written for (its header comment, or the shape its parallelism needs).
EXAMPLE_CLUSTERS = {
    "ccltuning.yaml": "dgx-h100-2",
    "ccltuning-3d.yaml": "h800-rail-64",
    "ccltuning-pytorchjob.yaml": "dgx-h100-2",  # tp 8 x dp 2 = 16 GPUs
}
RUNTIMES = ("nccl", "msccl", "rccl")
MSCCL_ROW = re.compile(r"^msccl/")


def _runtimes(cluster: str) -> list[str]:
    return ["rccl"] if gpu_vendor(load_cluster(cluster).gpu_model) == "amd" else ["nccl", "msccl"]


def _example_spec(example: str, runtime: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    spec = doc["spec"]
    publish = spec.setdefault("publish", {})
    publish["runtime"] = runtime
    if runtime == "msccl":
        publish.pop("ncclVersion", None)  # msccl-executor-nccl is NCCL 2.23.4, whatever was set
    return dict(spec)


def _preset_spec(preset: str, runtime: str) -> dict[str, Any]:
    ranks = min(16, load_cluster(preset).world_size)
    return {
        "collectives": [{"op": "allgather", "minBytes": "1M", "maxBytes": "4M", "ranks": ranks}],
        "tuning": {"enabled": True, "budget": 8},
        "synthesis": {"enabled": True, "timeBudgetSeconds": 30},
        # The kit's topology loader is NVIDIA NCCL's: it cannot judge a file written for RCCL.
        "publish": {"runtime": runtime, "topologyFile": "auto" if runtime == "rccl" else "always"},
    }


Case = tuple[str, str, str]  # (kind, name, runtime)
CASES: list[Case] = [("example", e, r) for e in sorted(EXAMPLE_CLUSTERS)
                     for r in _runtimes(EXAMPLE_CLUSTERS[e])]  # fmt: skip
CASES += [("preset", p, r) for p in PRESETS for r in _runtimes(p)]
REFUSED: list[Case] = [("example", e, r) for e in sorted(EXAMPLE_CLUSTERS) for r in RUNTIMES
                       if r not in _runtimes(EXAMPLE_CLUSTERS[e])]  # fmt: skip
REFUSED += [("preset", p, r) for p in PRESETS for r in RUNTIMES if r not in _runtimes(p)]


def _case_id(case: Case) -> str:
    return "-".join(case)


def _spec_and_cluster(case: Case) -> tuple[dict[str, Any], str]:
    kind, name, runtime = case
    if kind == "example":
        return _example_spec(name, runtime), EXAMPLE_CLUSTERS[name]
    return _preset_spec(name, runtime), name


@pytest.fixture(scope="module")
def kit() -> Path:
    # CI checks out ../shared beside the repository; without it nothing was checked: fail.
    assert CHECK_PLAN.is_file(), f"conformance kit missing at {CHECK_PLAN} (needs ../shared)"
    return CHECK_PLAN


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Case], tuple[Plan, Path]]:
    """Plans built once per module and written as `ccltune plan --out` writes them."""
    cache: dict[Case, tuple[Plan, Path]] = {}

    def get(case: Case) -> tuple[Plan, Path]:
        if case not in cache:
            spec, cluster = _spec_and_cluster(case)
            plan = build_plan(CCLTuningSpec.model_validate(spec), load_cluster(cluster),
                              name=case[1].removesuffix(".yaml"))  # fmt: skip
            out = tmp_path_factory.mktemp(_case_id(case))
            for f in plan.files:
                (out / f.path).parent.mkdir(parents=True, exist_ok=True)
                (out / f.path).write_text(f.content)
            cache[case] = (plan, out)
        return cache[case]

    return get


def _unselected(verbose: str) -> dict[str, set[int]]:
    """File name -> sizes the executor gives to another file or to NCCL (check-plan -v SELECT)."""
    out: dict[str, set[int]] = {}
    for m in re.finditer(r"SELECT (\S+) selected=\d+/\d+ dtypeBytes=\d+(?: unselected=(\S+))?", verbose):
        sizes = {parse_size(item.split(":")[0]) for item in (m.group(2) or "").split(",") if item}
        out[Path(m.group(1)).name] = sizes
    return out


@pytest.mark.timeout(900)  # a safety net: the example plans synthesize (work-limited, not timed)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_plan_is_accepted_and_run_as_reported(case: Case, kit: Path,
                                              planned: Callable[[Case], tuple[Plan, Path]]) -> None:  # fmt: skip
    _, out = planned(case)
    runtime = case[2]
    p = subprocess.run([str(kit), "-v", str(out)], capture_output=True, text=True, timeout=900)
    summary = "\n".join(ln for ln in p.stdout.splitlines() if not ln.startswith((" ", "\t")))
    assert p.returncode != 2, f"the kit could not run:\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
    assert p.returncode == 0, "\n".join(ln for ln in summary.splitlines() if ln.startswith("FAIL"))
    report = json.loads((out / "report.json").read_text())
    assert report["runtime"] == runtime
    msccl_dir = out / "msccl"
    rows = [(row["size"], row["realized_by"]) for t in report["tasks"] for row in t["rows"]]
    assert all(by for _, by in rows), "every row names what realizes it"
    claimed = [(size, by) for size, by in rows if MSCCL_ROW.match(by)]
    if runtime == "nccl":
        assert not msccl_dir.exists() and not claimed  # stock NCCL runs no MSCCL file
        return
    unselected = _unselected(p.stdout)
    for size, by in claimed:
        assert (out / by).is_file(), f"{by} is claimed but not published"
        if 1 << 10 <= size <= 1 << 30 and size & (size - 1) == 0:
            assert size not in unselected.get(Path(by).name, set()), f"{by} is not run at {size}"
    published = {f.name for f in msccl_dir.iterdir()} if msccl_dir.exists() else set()
    assert published == {Path(by).name for _, by in claimed}, "only claimed files are published"


@pytest.mark.parametrize("case", REFUSED, ids=_case_id)
def test_a_runtime_that_cannot_drive_the_gpus_is_refused(case: Case) -> None:
    spec, cluster = _spec_and_cluster(case)
    with pytest.raises(PlanError, match=r"^spec\.publish\.runtime: \w+ runs on (AMD|NVIDIA) GPUs"):
        build_plan(CCLTuningSpec.model_validate(spec), load_cluster(cluster), name="refused")


def test_the_matrix_covers_every_example_and_preset_for_every_runtime() -> None:
    examples = {p.name for p in (REPO / "examples").glob("*.yaml")}
    assert examples == set(EXAMPLE_CLUSTERS), "add new examples with their cluster"
    for kind, names in (("example", examples), ("preset", set(PRESETS))):
        for name in names:
            covered = {r for k, n, r in [*CASES, *REFUSED] if (k, n) == (kind, name)}
            assert covered == set(RUNTIMES), (kind, name)
    assert any(r == "rccl" for _, _, r in CASES), "at least one plan runs on RCCL"
