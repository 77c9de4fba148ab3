"""A synthesized file that msccl-executor-nccl would block on is never published and never crashes
the plan: synth_step reads every candidate file back as the executor runs it, and a file that
deadlocks there becomes a note while NCCL's default keeps the size."""

from __future__ import annotations

import sys
from pathlib import Path

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.common import Source
from ccltune.api.plan import Choice, Estimate, PlanTask, TaskKey
from ccltune.plan_steps import synth_step
from ccltune.synth.units import Synthesized
from ccltune.topology.presets import load_preset
from ccltune.topology.subgroup import subcluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from test_model_msccl_reader import exchange_allgather

SIZE = 1 << 20


def test_a_file_the_executor_would_block_on_is_a_note_not_a_crash() -> None:
    spec = CCLTuningSpec.model_validate({"selector": {"matchLabels": {"app": "x"}},
                                         "collectives": [{"op": "allgather", "minBytes": "1M", "maxBytes": "1M"}]})  # fmt: skip
    sub = subcluster(load_preset("dgx-h100-1"), [0, 1])
    key = TaskKey(collective="allgather", min_bytes=SIZE, max_bytes=SIZE, ranks=2, nodes=1)
    default = Estimate(size_bytes=SIZE, time_us=20.0, algbw_gbps=50.0, busbw_gbps=25.0,
                       source=Source.SIMULATED, choice=Choice(kind="nccl", realized_by="NCCL default"))  # fmt: skip
    task = PlanTask(key=key, default=Choice(kind="nccl"), chosen=Choice(kind="nccl"),
                    default_estimates=[default], chosen_estimates=[default])  # fmt: skip
    # Simple: three one-chunk sends before any receive need 12 FIFO slots of 8 (the reader's test)
    blocked = exchange_allgather("Simple", 1, 0)
    done = Synthesized(index=0, sizes=(SIZE,), files=(("x.xml", blocked),), ranges=(("x.xml", (SIZE,)),),
                       picks=((SIZE, "exchange", "Simple"),), notes=(), symmetric=True)  # fmt: skip
    got, files = synth_step(spec, sub, task, 0, lambda _m: None, task, done)
    assert files == []
    (est,) = got.chosen_estimates
    assert est.choice is not None and est.choice.kind == "nccl" and est.time_us == 20.0
    assert any("x.xml not published" in n and "deadlock" in n for n in got.notes), got.notes


def test_a_narrowed_file_is_named_for_the_range_it_is_selected_for() -> None:
    from ccltune.plan_steps import _range_named

    def algo(lo: int, hi: int) -> str:
        return (f'<algo name="x" proto="LL" nchannels="1" nchunksperloop="16" ngpus="16" coll="allreduce" '
                f'inplace="1" outofplace="1" minBytes="{lo}" maxBytes="{hi}">\n</algo>\n')  # fmt: skip

    name = "allreduce-16r-1B-512K-LL.xml"  # as the engine names a range [1 B, 512 KiB)
    assert _range_named(name, algo(65536, 524287)) == "allreduce-16r-64K-512K-LL.xml"
    assert _range_named(name, algo(0, 0)) == "allreduce-16r-1B-inf-LL.xml"
    assert _range_named("allpairs.xml", algo(65536, 524287)) == "allpairs.xml"  # a user's name stays
