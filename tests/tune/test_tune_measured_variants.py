"""Measured MSCCL variants (`msccl:<name>` rows of measured profiles) are published as the schedule
file of that name: beside the profiles for `ccltune tune --profiles`, the plan's synthesized file for
`ccltune plan --profiles`. A name with no such file, or a file that is another schedule, is a note
and the next best choice runs; never a crash."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.common import Collective, Source
from ccltune.api.plan import Choice, Estimate, PlanTask, TaskKey
from ccltune.cli import tune as tune_cli
from ccltune.plan_steps import synth_step
from ccltune.synth.units import Synthesized
from ccltune.topology.load import load_cluster
from ccltune.tune.profilers.simulated import sweep_csv

M = 1 << 20


def one_variant_table(directory: Path) -> dict[str, str]:
    """The simulator's joint table on dgx-h100-1 at 1M and 2M with one MSCCL variant kept: the
    allpairs variant fastest at 1M (so that name is one schedule file). Returns that variant's row."""
    text = sweep_csv(load_cluster("dgx-h100-1"), 8, 1, [Collective.ALLREDUCE], [M, 2 * M])
    rows = list(csv.DictReader(io.StringIO(text)))
    best = min((r for r in rows if r["algorithm"] == "msccl:allpairs" and int(r["size_bytes"]) == M),
               key=lambda r: float(r["latency_us"]))
    same = ("algorithm", "protocol", "channels", "instances")
    kept = [r for r in rows if not r["algorithm"].startswith("msccl:") or all(r[k] == best[k] for k in same)]
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(kept)
    (directory / "joint.csv").write_text(out.getvalue())
    return best


def algo_xml(proto: str, nchannels: int, coll: str = "allreduce", ngpus: int = 8) -> str:
    return (f'<algo name="allpairs" proto="{proto}" nchannels="{nchannels}" nchunksperloop="8" ngpus="{ngpus}" '
            f'coll="{coll}" inplace="1" outofplace="1" minBytes="0" maxBytes="0">\n</algo>\n')


def tune(profiles: Path, out: Path) -> dict:
    app = typer.Typer()

    @app.callback()
    def _root() -> None: ...

    tune_cli.register(app)
    run = CliRunner().invoke(app, ["tune", "--cluster", "dgx-h100-1", "--profiles", str(profiles), "--sizes", "1M:2M",
                                   "--runtime", "msccl", "--budget", "60", "-o", str(out)])
    assert run.exit_code == 0, run.output
    return json.loads((out / "tuning.json").read_text())


def msccl_rows(doc: dict) -> list[dict]:
    return [e for t in doc["tasks"] for e in t["chosenEstimates"] if e["choice"]["kind"] == "msccl"]


def test_tune_writes_the_winning_variants_file(tmp_path: Path) -> None:
    best = one_variant_table(tmp_path)
    nchannels = int(best["channels"]) * int(best["instances"])
    (tmp_path / "allpairs.xml").write_text(algo_xml(best["protocol"], nchannels))
    doc = tune(tmp_path, tmp_path / "out")
    won = msccl_rows(doc)
    assert won, "the allpairs variant is fastest at 1M on this surface"
    assert {e["choice"]["mscclFile"] for e in won} == {"msccl/allpairs.xml"}
    assert {e["source"] for e in won} == {str(Source.MEASURED)}
    assert (tmp_path / "out" / "msccl" / "allpairs.xml").read_text() == algo_xml(best["protocol"], nchannels)
    assert any("msccl/allpairs.xml is the file it was measured with" in n for t in doc["tasks"] for n in t["notes"])


@pytest.mark.parametrize(("xml", "why"), [
    (None, "no schedule file named allpairs (or allpairs.xml) in"),
    (algo_xml("Simple", 1, ngpus=16), "allpairs.xml is another schedule (ngpus='16', the variant '8'"),
])
def test_an_unknown_or_different_file_is_a_note_and_nccl_runs(tmp_path: Path, xml: str | None, why: str) -> None:
    one_variant_table(tmp_path)
    if xml is not None:
        (tmp_path / "allpairs.xml").write_text(xml)
    doc = tune(tmp_path, tmp_path / "out")
    assert msccl_rows(doc) == []  # the tuned NCCL setting runs instead
    assert not (tmp_path / "out" / "msccl").exists()
    notes = [n for t in doc["tasks"] for n in t["notes"]]
    assert any("won the joint search" in n and "is not published: " + why in n for n in notes), notes


def variant_task(schedule: str, proto: str, channels: int) -> PlanTask:
    key = TaskKey(collective="allreduce", min_bytes=M, max_bytes=M, ranks=8, nodes=1)
    default = Estimate(size_bytes=M, time_us=20.0, algbw_gbps=50.0, busbw_gbps=87.5, source=Source.MEASURED,
                       choice=Choice(kind="nccl", realized_by="NCCL default"))
    variant = Choice(kind="msccl", algorithm=f"{schedule}/{proto} {channels}ch x1", protocol=proto, channels=channels)
    chosen = default.model_copy(update={"time_us": 10.0, "choice": variant})
    return PlanTask(key=key, default=Choice(kind="nccl"), chosen=variant, default_estimates=[default],
                    chosen_estimates=[chosen], trials=1)


def synthesized(name: str, proto: str, nchannels: int) -> Synthesized:
    return Synthesized(index=0, sizes=(M,), files=((name, algo_xml(proto, nchannels)),), ranges=((name, (M,)),),
                       picks=(), notes=(), symmetric=True)


def test_plan_matches_a_measured_variant_to_its_synthesized_file() -> None:
    spec = CCLTuningSpec.model_validate({"selector": {"matchLabels": {"app": "x"}},
                                         "collectives": [{"op": "allreduce", "minBytes": "1M", "maxBytes": "1M"}]})
    sub = load_cluster("dgx-h100-1")
    task = variant_task("allpairs", "LL", 4)
    got, files = synth_step(spec, sub, task, 0, lambda _m: None, task, synthesized("allpairs.xml", "LL", 4))
    (est,) = got.chosen_estimates
    assert est.choice is not None and est.choice.msccl_file == "msccl/t0-allpairs.xml"
    assert est.time_us == 10.0 and est.source == Source.MEASURED  # the measured number, as measured
    assert [f.path for f in files] == ["msccl/t0-allpairs.xml"]

    other, files = synth_step(spec, sub, task, 0, lambda _m: None, task, synthesized("ring.xml", "LL", 4))
    (est,) = other.chosen_estimates
    assert est.choice is not None and est.choice.kind == "nccl" and est.time_us == 20.0 and files == []
    assert any(n.startswith("measured MSCCL variant allpairs/LL 4ch x1: no synthesized file is named allpairs")
               for n in other.notes), other.notes


def test_plan_without_synthesis_has_no_file_for_a_variant_and_says_so(tmp_path: Path) -> None:
    from ccltune.pipeline import build_plan

    one_variant_table(tmp_path)
    spec = CCLTuningSpec.model_validate({
        "selector": {"matchLabels": {"app": "x"}}, "publish": {"runtime": "msccl"},
        "collectives": [{"op": "allreduce", "minBytes": "1M", "maxBytes": "2M"}],
        "tuning": {"enabled": True, "budget": 60}})
    plan = build_plan(spec, load_cluster("dgx-h100-1"), name="p", profiles=tmp_path)
    (task,) = plan.tasks
    assert all(e.choice is None or e.choice.kind == "nccl" for e in task.chosen_estimates)
    assert not [f for f in plan.files if f.path.startswith("msccl/")]
    assert any("won the joint search" in n and "no schedule file named allpairs" in n
               and "synthesis is off" in n for n in task.notes), task.notes
