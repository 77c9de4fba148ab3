"""A plan's syntheses as shards (synth/units.py): any completion order, a process pool or the
in-process run give the same plan files, byte for byte."""

from __future__ import annotations

import itertools
import random

import pytest

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.plan import Plan
from ccltune.pipeline import build_plan, synthesis_units
from ccltune.synth.units import Synthesized, assign, from_json, merge, run_units, to_json
from ccltune.topology.load import load_cluster

SPEC = CCLTuningSpec.model_validate({
    "collectives": [
        {"op": "reducescatter", "minBytes": "1M", "maxBytes": "64M"},
        {"op": "allgather", "minBytes": "4M", "maxBytes": "16M"},
        {"op": "reducescatter", "minBytes": "64K", "maxBytes": "1M"},
    ],
    "synthesis": {"enabled": True},
    "publish": {"runtime": "msccl"},
})  # fmt: skip
TOPO = load_cluster("dgx-h100-1")


def _files(plan: Plan) -> dict[str, str]:
    return {f.path: f.content for f in plan.files}


@pytest.fixture(scope="module")
def in_process() -> Plan:
    return build_plan(SPEC, TOPO, name="shards")


@pytest.fixture(scope="module")
def shard_outputs() -> list[str]:
    """What each of 3 shard pods writes: its units' results as JSON."""
    units = synthesis_units(SPEC, TOPO)
    shards = assign(units, 3)
    assert len(shards) == 3
    by_index = {u.index: u for u in units}
    return [to_json(run_units([by_index[i] for i in shard]).values()) for shard in shards]


def test_shards_merged_in_any_order_give_the_in_process_files(in_process: Plan,
                                                             shard_outputs: list[str]) -> None:  # fmt: skip
    msccl = [p for p in _files(in_process) if p.startswith("msccl/")]
    assert msccl, "the spec must synthesize at least one file, or the comparison proves little"
    merged = [merge(from_json(shard_outputs[i]) for i in order)
              for order in itertools.permutations(range(3))]  # fmt: skip
    assert all(list(m) == [0, 1, 2] for m in merged)
    assert all(m == merged[0] for m in merged)
    sharded = build_plan(SPEC, TOPO, name="shards", syntheses=merged[0])
    assert _files(sharded) == _files(in_process)
    assert sharded.digest == in_process.digest


def test_a_result_for_other_sizes_is_not_used(in_process: Plan, shard_outputs: list[str]) -> None:
    merged = merge(from_json(text) for text in shard_outputs)
    stale = {i: Synthesized(r.index, r.sizes[:-1], (), (), (), ("stale",), True)
             for i, r in merged.items()}  # fmt: skip
    assert build_plan(SPEC, TOPO, name="shards", syntheses=stale).digest == in_process.digest


def test_process_pool_gives_the_same_plan(in_process: Plan) -> None:
    pooled = build_plan(SPEC, TOPO, name="shards", workers=2)
    assert _files(pooled) == _files(in_process)


def test_assign_covers_every_unit_once_and_is_deterministic() -> None:
    units = synthesis_units(SPEC, TOPO)
    for shards in (1, 2, 3, 7):
        got = assign(units, shards)
        assert len(got) == min(shards, len(units))
        assert sorted(i for s in got for i in s) == [u.index for u in units]
        assert all(got_shard for got_shard in got)
        shuffled = list(units)
        random.Random(shards).shuffle(shuffled)
        assert assign(shuffled, shards) == got


def test_merge_refuses_two_different_results_for_one_task() -> None:
    a = Synthesized(0, (1,), (), (), (), (), True)
    b = Synthesized(0, (1,), (), (), (), ("other",), True)
    assert merge([[a], [a]]) == {0: a}
    with pytest.raises(ValueError, match="task 0"):
        merge([[a], [b]])


def test_wire_format_is_checked() -> None:
    with pytest.raises(ValueError, match="format"):
        from_json('{"format": 99, "results": []}')
