"""The error hierarchy (who must act) and validation errors that name every field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.api.cluster import ClusterTopology
from ccltune.api.common import parse_size
from ccltune.api.errors import (
    CcltuneError,
    InputError,
    InternalError,
    did_you_mean,
    one_line,
    problems,
)
from ccltune.controller.config import ConfigError
from ccltune.model.formats.msccl.writer import MscclFormatError
from ccltune.model.nccl.baselines import BaselineError
from ccltune.model.schedule.check import ScheduleError
from ccltune.model.sim.routing import RoutingError
from ccltune.model.sim.simulate import SimulationError
from ccltune.pipeline import PlanError
from ccltune.publish.runtime import RuntimeMismatch
from ccltune.publish.unpack import UnpackError
from ccltune.topology.errors import TopologyError
from ccltune.topology.shape_warnings import mixed_gpu_models, shape_warnings
from ccltune.topology.subgroup import SubgroupError
from ccltune.tune.profilers import ProfilerError
from ccltune.tune.table import TableError

INPUT = [TopologyError, PlanError, SubgroupError, UnpackError, ConfigError, RuntimeMismatch,
         ProfilerError, TableError]  # fmt: skip
INTERNAL = [ScheduleError, SimulationError, RoutingError, MscclFormatError, BaselineError]


@pytest.mark.parametrize("cls", INPUT)
def test_input_errors_are_the_users_to_fix(cls: type[Exception]) -> None:
    assert issubclass(cls, InputError) and issubclass(cls, CcltuneError)
    assert not issubclass(cls, InternalError)
    assert issubclass(cls, ValueError)  # `except ValueError` sites written before the split still work


@pytest.mark.parametrize("cls", INTERNAL)
def test_internal_errors_are_ours(cls: type[Exception]) -> None:
    assert issubclass(cls, InternalError) and issubclass(cls, CcltuneError)
    assert not issubclass(cls, InputError)


def test_an_input_error_carries_its_problems() -> None:
    assert InputError("a: bad").problems == ("a: bad",)
    assert InputError("2 problems", ["a: x", "b: y"]).problems == ("a: x", "b: y")
    with pytest.raises(InputError, match="not a size"):
        parse_size("lots")


def _spec_error(spec: dict) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        CCLTuningSpec.model_validate(spec)
    return info.value


def test_unknown_fields_get_the_wire_name_the_user_meant() -> None:
    exc = _spec_error({"collectives": [{"op": "allreduce", "maxByte": "1G"}], "tunning": {}})
    found = problems(exc, "spec")
    assert "spec.collectives[0].maxByte: unknown field (did you mean maxBytes?)" in found
    assert "spec.tunning: unknown field (did you mean tuning?)" in found


def test_a_field_far_from_every_name_gets_no_guess() -> None:
    exc = _spec_error({"collectives": [{"op": "allreduce", "zzzzqqq": 1}]})
    assert problems(exc, "spec") == ["spec.collectives[0].zzzzqqq: unknown field"]
    assert did_you_mean("minbytes", ["minBytes", "maxBytes"]) == "minBytes"


def test_one_line_names_every_problem_for_conditions() -> None:
    exc = _spec_error({"collectives": [{"op": "allreduce", "minByte": "1K", "maxBytes": "x"}], "publsh": {}})
    line = one_line(exc, "spec")
    assert line.startswith("3 problems: ") and "\n" not in line and "more)" not in line
    for field in ("spec.collectives[0].minByte", "spec.collectives[0].maxBytes", "spec.publsh"):
        assert field in line


def test_one_problem_is_just_that_problem() -> None:
    exc = _spec_error({"collectives": [{"op": "allreduce", "minByte": "1K"}]})
    assert one_line(exc, "spec") == "spec.collectives[0].minByte: unknown field (did you mean minBytes?)"


def _cluster(gpus: int) -> ClusterTopology:
    return ClusterTopology(name="c", gpus_per_node=gpus, nodes=[{"name": "a", "gpus": gpus}])


@pytest.mark.parametrize(("gpus", "warned"), [(1, False), (2, False), (3, True), (6, True), (8, False)])
def test_gpu_counts_that_are_not_a_power_of_two_are_warned(gpus: int, warned: bool) -> None:
    found = shape_warnings(_cluster(gpus))
    assert bool(found) == warned
    assert all("\n" not in w and f"{gpus} GPUs per node" in w for w in found)


def test_mixed_gpu_models_are_warned_with_an_example_node() -> None:
    assert mixed_gpu_models({"a": "H100", "b": "H100"}) is None
    line = mixed_gpu_models({"b": "A100", "a": "H100", "c": "A100"})
    assert line is not None and "A100 (e.g. b)" in line and "H100 (e.g. a)" in line
    assert "LL128" in line and "\n" not in line
