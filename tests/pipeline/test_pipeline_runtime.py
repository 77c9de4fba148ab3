"""Plans follow spec.publish.runtime: what each runtime runs is what the files and the report claim."""

from __future__ import annotations

import pytest

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.common import Source
from ccltune.api.plan import Choice, Estimate, PlanFile, PlanTask, TaskKey
from ccltune.pipeline import NO_MSCCL_NOTE, PlanError, build_plan
from ccltune.plan_steps import msccl_step, realize_step
from ccltune.publish.files import MSCCL_DIR, NCCL_CONF, injection_env, plan_file
from ccltune.topology.presets import load_preset

KB = 1024


def _spec(**extra: object) -> CCLTuningSpec:
    return CCLTuningSpec.model_validate(
        {"collectives": [{"op": "allreduce", "minBytes": "64K", "maxBytes": "4M"}], **extra}
    )


def test_stock_nccl_skips_synthesis_and_publishes_no_msccl() -> None:
    spec = _spec(synthesis={"enabled": True, "timeBudgetSeconds": 5}, tuning={"enabled": True,
                 "budget": 4})  # fmt: skip
    plan = build_plan(spec, load_preset("dgx-h100-1"), name="n")
    assert plan.runtime == "nccl" and NO_MSCCL_NOTE in plan.notes
    assert not [f for f in plan.files if f.path.startswith(MSCCL_DIR + "/")]
    assert "MSCCL_ALGO_DIR" not in injection_env(plan.files, "/ccltune")
    for task in plan.tasks:
        for e in task.chosen_estimates:
            assert e.choice is not None and e.choice.kind == "nccl" and e.choice.realized_by
    conf = next(f.content for f in plan.files if f.path == NCCL_CONF)
    assert "NCCL_ALGO" not in conf and "NCCL_PROTO" not in conf


@pytest.mark.parametrize(
    ("publish", "cluster", "field"),
    [({"runtime": "msccl", "ncclVersion": "2.24"}, "dgx-h100-1", "spec.publish.ncclVersion"),
     ({"runtime": "rccl"}, "dgx-h100-1", "spec.publish.runtime"),
     ({"runtime": "nccl"}, "mi300x-8", "spec.publish.runtime")],
)  # fmt: skip
def test_a_runtime_the_spec_contradicts_is_a_spec_error(publish: dict[str, str], cluster: str,
                                                         field: str) -> None:  # fmt: skip
    with pytest.raises(PlanError, match=rf"^{field}: "):
        build_plan(_spec(publish=publish), load_preset(cluster), name="x")


# --- msccl_step and realize_step on hand-made tasks -------------------------------------------

ALGO = ('<algo name="{name}" proto="{proto}" nchannels="1" nchunksperloop="{chunks}" ngpus="8" '
        'coll="allreduce" inplace="0" outofplace="1" minBytes="{lo}" maxBytes="{hi}"></algo>')  # fmt: skip


def _xml(path: str, chunks: int, lo: int = 0, hi: int = 0, proto: str = "Simple") -> PlanFile:
    return plan_file(path, ALGO.format(name=path, proto=proto, chunks=chunks, lo=lo, hi=hi))


def _est(size: int, time_us: float, choice: Choice) -> Estimate:
    return Estimate(size_bytes=size, time_us=time_us, algbw_gbps=1.0, busbw_gbps=1.0,
                    source=Source.SIMULATED, choice=choice)  # fmt: skip


RING = Choice(kind="nccl", algorithm="ring", protocol="Simple", channels=8)
TREE = Choice(kind="nccl", algorithm="tree", protocol="LL", channels=4)


def _task(chosen: list[Estimate]) -> PlanTask:
    key = TaskKey(collective="allreduce", min_bytes=64 * KB, max_bytes=256 * KB, ranks=8, nodes=1)
    default = [_est(e.size_bytes, 10.0, RING) for e in chosen]
    return PlanTask(key=key, default=RING, chosen=chosen[-1].choice or RING,
                    default_estimates=default, chosen_estimates=chosen)  # fmt: skip


def _msccl(path: str) -> Choice:
    return Choice(kind="msccl", algorithm="s", protocol="Simple", msccl_file=path)


def test_msccl_rows_stay_only_where_the_scheduler_selects_their_file() -> None:
    good, bad = f"{MSCCL_DIR}/t0-good.xml", f"{MSCCL_DIR}/t0-zbad.xml"
    files = [_xml(good, chunks=8, hi=128 * KB), _xml(bad, chunks=3)]  # 3 divides no power of two
    task = _task([_est(64 * KB, 5.0, _msccl(good)), _est(128 * KB, 5.0, _msccl(good)),
                  _est(256 * KB, 5.0, _msccl(bad))])  # fmt: skip
    tasks, kept, notes = msccl_step("msccl", [task], [task.default_estimates], files)
    assert [f.path for f in kept] == [good]  # the unselected file is not published
    rows = tasks[0].chosen_estimates
    assert [r.choice.realized_by for r in rows[:2] if r.choice] == [good, good]
    assert rows[2].choice == RING and rows[2].time_us == 10.0  # what ran before synthesis
    assert any("t0-zbad.xml: not selected" in n and "nchunksperloop 3" in n for n in notes)


def test_an_earlier_file_that_wins_the_size_takes_the_row_away() -> None:
    first, second = f"{MSCCL_DIR}/t0-a.xml", f"{MSCCL_DIR}/t1-b.xml"
    files = [_xml(first, chunks=8), _xml(second, chunks=8)]
    t0 = _task([_est(64 * KB, 5.0, _msccl(first))])
    t1 = _task([_est(64 * KB, 4.0, _msccl(second))])
    tasks, kept, notes = msccl_step("msccl", [t0, t1], [t0.default_estimates, t1.default_estimates],
                                    files)  # fmt: skip
    assert [f.path for f in kept] == [first]
    assert tasks[1].chosen_estimates[0].choice == RING
    assert any(f"{first} comes first" in n for n in notes)


def test_rccl_does_not_claim_ll128_files() -> None:
    path = f"{MSCCL_DIR}/t0-ll128.xml"
    task = _task([_est(64 * KB, 5.0, _msccl(path))])
    tasks, kept, notes = msccl_step("rccl", [task], [task.default_estimates],
                                    [_xml(path, chunks=8, proto="LL128")])  # fmt: skip
    assert kept == [] and tasks[0].chosen_estimates[0].choice == RING
    assert any("does not run LL128" in n for n in notes)


def test_realize_names_the_carrier_and_reports_nccl_where_nothing_carries_a_choice() -> None:
    carried = TREE.model_copy(update={"realized_by": "tuner row 3"})
    task = _task([_est(64 * KB, 6.0, TREE), _est(128 * KB, 6.0, carried),
                  _est(256 * KB, 9.0, RING)])  # fmt: skip
    task = task.model_copy(update={"chosen_estimates": [*task.chosen_estimates[:2],
                                                        task.default_estimates[2]]})  # fmt: skip
    out = realize_step(task)
    by = [e.choice.realized_by for e in out.chosen_estimates if e.choice]
    assert by == ["NCCL default", "tuner row 3", "NCCL default"]
    assert out.chosen_estimates[0].time_us == 10.0  # the uncarried tree/LL row: NCCL's default runs
    assert any("no tuner-table row or MSCCL file" in n for n in out.notes)
    # Same per-call choice but a different time: the process-wide settings did it.
    knobs = _task([_est(64 * KB, 8.0, RING)])
    assert realize_step(knobs).chosen_estimates[0].choice.realized_by == "nccl.conf"  # type: ignore[union-attr]


def test_an_msccl_row_no_check_has_vouched_for_is_not_claimed() -> None:
    out = realize_step(_task([_est(64 * KB, 5.0, _msccl(f"{MSCCL_DIR}/t0-x.xml"))]))
    row = out.chosen_estimates[0]
    assert row.choice == RING.model_copy(update={"realized_by": "NCCL default"})
    assert row.time_us == 10.0


def test_a_file_another_task_of_the_same_shape_runs_is_noted() -> None:
    path = f"{MSCCL_DIR}/t0-a.xml"
    t0 = _task([_est(64 * KB, 5.0, _msccl(path))])
    t1 = _task([_est(64 * KB, 10.0, RING)]).model_copy(
        update={"key": t0.key.model_copy(update={"role": "tp"})})  # fmt: skip
    _, kept, notes = msccl_step("msccl", [t0, t1], [t0.default_estimates, t1.default_estimates],
                                [_xml(path, chunks=8)])  # fmt: skip
    assert [f.path for f in kept] == [path]
    (note,) = [n for n in notes if "cannot tell communicators apart" in n]
    assert note.startswith("allreduce/tp/8r1n/") and f"at 64K the scheduler runs {path}" in note


def test_a_per_call_restriction_never_reaches_nccl_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    import ccltune.pipeline as pipeline

    def leaky(_spec: object, _cluster: object, tasks: list[PlanTask], _say: object,
              _version: str, _profiles: object = None, _judge: object = None) -> tuple[list[PlanTask], dict[str, str], list[PlanFile], list[str]]:  # fmt: skip
        return tasks, {"NCCL_ALGO": "allreduce:tree,ring"}, [], []

    monkeypatch.setattr(pipeline, "tune_step", leaky)
    with pytest.raises(AssertionError, match="must not set NCCL_ALGO"):  # a bug: exit 3, not 2
        build_plan(_spec(tuning={"enabled": True}), load_preset("dgx-h100-1"), name="leak")
