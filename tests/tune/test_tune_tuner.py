"""tune_tasks end to end, the CLI, and bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from tune_helpers import DATA, preset
from typer.testing import CliRunner

from ccltune.api.common import Source
from ccltune.api.plan import PlanTask
from ccltune.cli import tune as tune_cli
from ccltune.tune.keys import make_keys, parse_collective, parse_size_range
from ccltune.tune.profilers.base import Measurement
from ccltune.tune.tuner import SynthCandidate, tune_tasks


def small_keys():
    return make_keys(["allreduce"], 16 << 10, 256 << 20, ranks=8, nodes=1, factor=16)


def test_buckets() -> None:
    keys = make_keys(["allreduce"], 1 << 10, 1 << 30, ranks=8, nodes=1)
    assert len(keys) == 21 and keys[0].max_bytes == 2047 and (keys[-1].min_bytes, keys[-1].max_bytes) == (1 << 30, 1 << 30)
    keys = make_keys(["allgather"], 1000, 5000, ranks=8, nodes=1, factor=4)
    assert [(k.min_bytes, k.max_bytes) for k in keys] == [(1000, 3999), (4000, 5000)]


def test_tune_tasks_is_reproducible_and_reports_sources() -> None:
    topo = preset("dgx-h100-1")
    a = tune_tasks(small_keys(), topo, searcher="autoccl", budget=30, seed=4, size_factor=16)
    b = tune_tasks(small_keys(), topo, searcher="autoccl", budget=30, seed=4, size_factor=16)
    assert len(a.tasks) == len(small_keys()) == 4
    assert a.files == b.files and a.env == b.env
    assert [t.plan_task() for t in a.tasks] == [t.plan_task() for t in b.tasks]
    assert a.source == Source.SIMULATED
    for t in a.tasks:
        p = t.plan_task()
        assert isinstance(p, PlanTask) and p.trials == t.trials and 1 <= t.trials <= 30
        assert p.default_estimates[0].source == p.chosen_estimates[0].source == Source.SIMULATED
        assert p.chosen.kind == "nccl" and p.chosen.channels and p.chosen.channels >= 1
        # The tuned choice is never worse than NCCL's beyond measurement noise.
        assert t.chosen_measure.time_us <= t.default_measure.time_us * 1.03


def test_every_search_starts_from_nccl_default() -> None:
    result = tune_tasks(small_keys(), preset("dgx-h100-1"), budget=5, seed=0, noise=0.0)
    for t in result.tasks:
        assert t.searched is not None and t.default is not None
        assert t.searched.trials[0].config == t.default  # the known-good incumbent comes first
        assert t.searched.value <= t.default_measure.time_us * (1 + 1e-9)  # so it never ends worse


def test_tuning_beats_nccl_default_somewhere() -> None:
    result = tune_tasks(small_keys(), preset("dgx-h100-1"), budget=60, seed=0, noise=0.0)
    assert max(t.speedup for t in result.tasks) > 1.05


def test_synthesized_schedule_competes() -> None:
    def synth(key, size):
        return [SynthCandidate("syccl-ring2d", Measurement(1.0, Source.SIMULATED), "msccl/syccl-ring2d.xml")]

    result = tune_tasks(small_keys()[:1], preset("dgx-h100-1"), budget=10, synthesized=synth)
    task = result.tasks[0].plan_task()
    assert task.chosen.kind == "msccl" and task.chosen.msccl_file == "msccl/syccl-ring2d.xml"
    assert "allreduce" in result.tuner_csv  # NCCL still gets a row (MSCCL falls back to NCCL)


def test_bad_input_is_named() -> None:
    topo = preset("dgx-h100-1")
    with pytest.raises(ValueError, match="--collective: unknown collective 'allscatter'"):
        parse_collective("allscatter", "--collective")
    with pytest.raises(ValueError, match="sizes: 1M is larger than 1K"):
        parse_size_range("1M:1K")
    with pytest.raises(ValueError, match="sizes: not a size: 'x'"):
        parse_size_range("x:1G")
    with pytest.raises(ValueError, match="budget must be at least 1"):
        tune_tasks(small_keys(), topo, budget=0)
    with pytest.raises(ValueError, match="profiler: unknown 'magic'"):
        tune_tasks(small_keys(), topo, profiler="magic")
    with pytest.raises(ValueError, match="puts 16 ranks on a node"):
        tune_tasks(make_keys(["allreduce"], 1024, 2048, ranks=16, nodes=1), topo)
    with pytest.raises(ValueError, match="nccl_version: 'two' is not a version"):
        tune_tasks(small_keys(), topo, nccl_version="two")


def app() -> typer.Typer:
    a = typer.Typer()

    @a.callback()
    def _root() -> None: ...

    tune_cli.register(a)
    return a


def test_cli_simulated_writes_files(tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = CliRunner().invoke(app(), ["tune", "--cluster", "dgx-a100-1", "--collective", "allreduce,allgather",
                                   "--sizes", "64K:16M", "--size-factor", "16", "--budget", "15", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "simulated" in r.output and re.search(r"\d\.\d\dx", r.output)
    assert (out / "nccl_tuner.conf").read_text().count("allgather,") >= 1
    assert "NCCL_ALGO=" not in (out / "nccl.conf").read_text()
    assert '"source": "simulated"' in (out / "tuning.json").read_text()


def test_cli_replay_and_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(app(), ["tune", "--cluster", "dgx-a100-2", "--ranks", "16", "--nodes", "2",
                                   "--profiler", f"replay:{DATA}/nccl-sweep-schema-sample.csv", "--fallback", "interpolate",
                                   "--sizes", "1K:1M", "--searcher", "grid", "--budget", "5"])
    assert r.exit_code == 0, r.output
    assert "replayed" in r.output
    bad = CliRunner().invoke(app(), ["tune", "--cluster", "dgx-a100-1", "--collective", "allscatter"])
    assert bad.exit_code == 2 and "unknown collective 'allscatter'" in bad.output
    assert "Traceback" not in bad.output
    f = tmp_path / "bad.csv"
    f.write_text((Path(DATA) / "nccl-sweep-schema-sample.csv").read_text().splitlines()[0] + "\n")
    empty = CliRunner().invoke(app(), ["tune", "--cluster", "dgx-a100-1", "--profiler", f"replay:{f}"])
    assert empty.exit_code == 2 and "empty table" in empty.output
    nosearch = CliRunner().invoke(app(), ["tune", "--cluster", "dgx-a100-1", "--searcher", "annealing"])
    assert nosearch.exit_code == 2 and "unknown 'annealing'" in nosearch.output


def test_plan_tasks_by_key_regroups_buckets() -> None:
    keys = make_keys(["allreduce"], 64 << 10, 64 << 20, ranks=8, nodes=1, factor=1 << 30)  # one whole key
    assert len(keys) == 1
    result = tune_tasks(keys, preset("dgx-a100-1"), budget=8, seed=0, size_factor=16)
    per_bucket = result.plan_tasks()
    [merged] = result.plan_tasks_by_key()
    assert merged.key == keys[0] and len(per_bucket) == 3
    assert [e.size_bytes for e in merged.chosen_estimates] == [64 << 10, 1 << 20, 16 << 20]
    assert all(e.choice is not None for e in merged.chosen_estimates + merged.default_estimates)
    assert merged.trials == sum(p.trials or 0 for p in per_bucket)
    assert merged.chosen == per_bucket[-1].chosen
