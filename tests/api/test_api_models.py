"""Validation of user input: one line naming the field; conditions follow API conventions."""

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.cluster import ClusterNode, ClusterTopology, Dimension
from ccltune.api.common import Condition, format_size, parse_size, set_condition
from ccltune.api.errors import one_line


def _error(data: dict) -> str:
    with pytest.raises(ValidationError) as info:
        CCLTuningSpec.model_validate(data)
    return one_line(info.value, "spec")


def test_spec_errors_name_the_field() -> None:
    assert _error(
        {"collectives": [{"op": "allreduce", "minBytes": "1G", "maxBytes": "1K"}]}
    ).startswith("spec.collectives[0]: minBytes (1G) is larger than maxBytes (1K)")
    assert _error({"collectives": [{"op": "allsum"}]}).startswith("spec.collectives[0].op:")
    assert "is not a positive size" in _error(
        {"collectives": [{"op": "allreduce", "minBytes": "-5"}]}
    )
    assert _error({"collectives": [{"op": "allreduce", "maxBytes": "0"}]}).startswith(
        "spec.collectives[0].maxBytes: size must be positive"
    )
    assert _error({}) == "spec: spec needs collectives or parallelism to know what to plan"
    assert "replayConfigMap" in _error(
        {"collectives": [{"op": "allreduce"}], "tuning": {"profiler": "replay"}}
    )
    assert _error({"collectives": [{"op": "allreduce"}], "bogus": 1}).startswith("spec.bogus:")


def test_wire_names_are_camel_case() -> None:
    spec = CCLTuningSpec.model_validate({"collectives": [{"op": "allgather", "minBytes": "4K"}]})
    wire = spec.wire()
    assert wire["collectives"][0]["minBytes"] == "4K"
    assert CCLTuningSpec.model_validate(wire) == spec


@given(st.integers(min_value=1, max_value=1 << 40))
def test_sizes_round_trip(n: int) -> None:
    assert parse_size(format_size(n)) == n


def test_size_units_are_binary() -> None:
    assert (
        parse_size("1K") == 1024 and parse_size("64MiB") == 64 << 20 and parse_size("1G") == 1 << 30
    )
    for bad in ("", "1X", "-1", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_condition_transition_time_moves_only_on_status_change() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    conds = set_condition(
        [], Condition(type="Ready", status="False", reason="Pending", last_transition_time=t0)
    )
    same = set_condition(
        conds, Condition(type="Ready", status="False", reason="StillPending", message="x")
    )
    assert same[0].last_transition_time == t0 and same[0].reason == "StillPending"
    flipped = set_condition(same, Condition(type="Ready", status="True", reason="Published"))
    assert flipped[0].last_transition_time != t0 and len(flipped) == 1


def test_cluster_rejects_inconsistent_input() -> None:
    with pytest.raises(ValidationError, match="node 'b' has 4 GPUs but gpusPerNode is 8"):
        ClusterTopology(
            name="x",
            gpus_per_node=8,
            nodes=[ClusterNode(name="a", gpus=8), ClusterNode(name="b", gpus=4)],
        )
    with pytest.raises(ValidationError, match="dimensions multiply to 4 GPUs"):
        ClusterTopology(
            name="x",
            gpus_per_node=8,
            nodes=[ClusterNode(name="a", gpus=8)],
            dimensions=[Dimension(name="nvl", kind="switch", size=4, bandwidth_gbps=100)],
        )


def test_coords_round_trip() -> None:
    topo = ClusterTopology(
        name="x",
        gpus_per_node=4,
        nodes=[ClusterNode(name=f"n{i}", gpus=4) for i in range(3)],
        dimensions=[
            Dimension(name="nvl", kind="switch", size=4, bandwidth_gbps=100),
            Dimension(name="rail", kind="switch", size=3, bandwidth_gbps=25),
        ],
    )
    assert [topo.rank_of(topo.coords(r)) for r in range(12)] == list(range(12))
    assert topo.coords(5) == (1, 1)
