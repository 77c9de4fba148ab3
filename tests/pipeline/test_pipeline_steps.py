"""`build_plan` runs tuning and synthesis when the spec asks (plan_steps.py)."""

from __future__ import annotations

import json

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.common import Source
from ccltune.model.formats.msccl.reader import from_msccl_xml
from ccltune.model.schedule.check import check_schedule
from ccltune.pipeline import build_plan
from ccltune.publish.configmaps import render_configmaps
from ccltune.publish.files import MSCCL_DIR, TUNER_CSV
from ccltune.publish.runtime import algo_meta, selected_everywhere
from ccltune.publish.unpack import read_configmaps, restore
from ccltune.topology.presets import load_preset


def _spec(**extra: object) -> CCLTuningSpec:
    return CCLTuningSpec.model_validate(
        {"collectives": [{"op": "allgather", "minBytes": "1M", "maxBytes": "64M"}], **extra}
    )


def test_tuning_step_tunes_every_task_and_publishes_the_tuner_table() -> None:
    topo = load_preset("dgx-a100-1")
    plan = build_plan(_spec(tuning={"enabled": True, "budget": 8}), topo, name="t")
    task = plan.tasks[0]
    assert task.trials and task.trials > 0
    assert all(e.source == Source.SIMULATED for e in task.chosen_estimates)
    assert TUNER_CSV in {f.path for f in plan.files}
    # never worse than NCCL's default at any size (same simulated surface)
    by_size = {e.size_bytes: e.time_us for e in task.default_estimates}
    assert all(e.time_us <= by_size[e.size_bytes] * 1.02 for e in task.chosen_estimates)


def test_synthesis_step_publishes_checked_msccl_files_where_they_win() -> None:
    topo = load_preset("syccl-a800-16")
    # 16 threadblocks: more than NCCL's own 4 channels here, so 8-block schedules compete.
    synthesis = {"enabled": True, "timeBudgetSeconds": 60, "maxThreadblocks": 16}
    plan = build_plan(_spec(synthesis=synthesis, publish={"runtime": "msccl"}), topo, name="s")
    task = plan.tasks[0]
    msccl = [e for e in task.chosen_estimates if e.choice and e.choice.kind == "msccl"]
    files = {f.path: f.content for f in plan.files if f.path.startswith(MSCCL_DIR + "/")}
    assert msccl
    assert not [n for n in task.notes if "ConfigMap limit" in n]  # large files are published too
    metas = [algo_meta(p, text) for p, text in files.items()]
    for e in msccl:
        assert e.choice is not None and e.choice.msccl_file in files
        assert e.choice.realized_by == e.choice.msccl_file
        claim = next(m for m in metas if m.path == e.choice.msccl_file)
        assert selected_everywhere(metas, claim, e.size_bytes)  # the executor runs this file
        default = next(d for d in task.default_estimates if d.size_bytes == e.size_bytes)
        assert e.time_us < default.time_us
    for text in files.values():
        check_schedule(from_msccl_xml(text))
    # 16-GPU schedules are about 1 MB of XML: packed into the ConfigMaps, restored exactly.
    manifests = render_configmaps(plan, name="s-ccltune", namespace="ml")
    items = json.loads(manifests[-1]["data"]["manifest.json"])["items"]
    assert restore(items, read_configmaps(manifests)) == {f.path: f.content.encode() for f in plan.files}


def test_offline_plan_says_why_live_tuning_does_not_run() -> None:
    plan = build_plan(_spec(tuning={"enabled": True, "profiler": "live"}), load_preset("dgx-a100-1"),
                      name="l")  # fmt: skip
    assert any("profiler live" in n for n in plan.notes)
    assert plan.tasks[0].trials is None
