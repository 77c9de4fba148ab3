"""CCLTuning: the namespaced resource a user applies to have a job's collectives planned."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from .common import (
    CONDITION_LIST,
    Collective,
    Condition,
    Message,
    Name,
    ShortText,
    SizeText,
    WireModel,
    parse_size,
)

LabelValue = Annotated[str, Field(max_length=63)]
LabelKey = Annotated[str, Field(max_length=317)]


class LabelSelectorRequirement(WireModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[list[LabelValue], Field(max_length=64)] = []


class LabelSelector(WireModel):
    match_labels: dict[LabelKey, LabelValue] = {}
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=16)] = []


class WorkloadRef(WireModel):
    kind: Literal["Job", "JobSet", "PyTorchJob", "MPIJob"]
    name: Name


class NodeTarget(WireModel):
    selector: dict[LabelKey, LabelValue] = {}
    names: Annotated[list[Name], Field(max_length=4096)] = []


Role = Literal["world", "tp", "dp", "pp", "ep"]


class CollectiveTask(WireModel):
    """One collective to plan over a size range, for a communicator of a given role."""

    op: Collective
    min_bytes: SizeText = "1K"
    max_bytes: SizeText = "1G"
    role: Role = "world"
    # Communicator size; default: what the role implies (world = all target GPUs).
    ranks: Annotated[int, Field(ge=1, le=1_000_000)] | None = None

    @model_validator(mode="after")
    def _range(self) -> CollectiveTask:
        lo, hi = parse_size(self.min_bytes), parse_size(self.max_bytes)
        if lo > hi:
            raise ValueError(
                f"minBytes ({self.min_bytes}) is larger than maxBytes ({self.max_bytes})"
            )
        return self


class Parallelism(WireModel):
    tp: Annotated[int, Field(ge=1, le=1024)] = 1
    pp: Annotated[int, Field(ge=1, le=1024)] = 1
    dp: Annotated[int, Field(ge=1, le=1_000_000)] = 1


class SynthesisOptions(WireModel):
    enabled: bool = False
    time_budget_seconds: Annotated[int, Field(ge=1, le=86_400)] = 600


class TuningOptions(WireModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.profiler) || self.profiler != 'replay' || has(self.replayConfigMap)",
                    "message": "tuning.replayConfigMap is required when tuning.profiler is replay",
                }
            ]
        }
    )

    enabled: bool = False
    searcher: Literal["autoccl", "mraco", "grid", "random"] = "autoccl"
    profiler: Literal["simulated", "replay", "live"] = "simulated"
    replay_config_map: Name | None = None
    budget: Annotated[int, Field(ge=1, le=100_000)] = 200
    seed: Annotated[int, Field(ge=0)] = 0


# Which runtime the job's image runs: stock NCCL, Azure's msccl-executor-nccl (NCCL 2.23.4 under
# it), or RCCL with its built-in MSCCL. Files and claims follow what that runtime really does.
Runtime = Literal["nccl", "msccl", "rccl"]


class PublishOptions(WireModel):
    config_map_name: Name | None = None
    inject: bool = True
    runtime: Runtime = "nccl"
    nccl_version: Annotated[str, Field(max_length=16, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")] = (
        "2.24"
    )


class CCLTuningSpec(WireModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.collectives) && size(self.collectives) > 0)"
                    " || has(self.parallelism)",
                    "message": "spec needs collectives or parallelism to know what to plan",
                }
            ]
        }
    )

    selector: LabelSelector = LabelSelector()
    workload_ref: WorkloadRef | None = None
    nodes: NodeTarget = NodeTarget()
    collectives: Annotated[list[CollectiveTask], Field(max_length=64)] = []
    parallelism: Parallelism | None = None
    synthesis: SynthesisOptions = SynthesisOptions()
    tuning: TuningOptions = TuningOptions()
    publish: PublishOptions = PublishOptions()
    rediscover: bool = False

    @model_validator(mode="after")
    def _something_to_plan(self) -> CCLTuningSpec:
        if not self.collectives and self.parallelism is None:
            raise ValueError("spec needs collectives or parallelism to know what to plan")
        if self.tuning.profiler == "replay" and not self.tuning.replay_config_map:
            raise ValueError("tuning.replayConfigMap is required when tuning.profiler is replay")
        return self


class TopologySummary(WireModel):
    nodes: int = 0
    gpus: int = 0
    gpu_model: ShortText = ""
    dimensions: ShortText = ""  # e.g. "8x NVSwitch 200 GB/s · 4x rail 25 GB/s"
    symmetric: bool = False


class TaskResult(WireModel):
    key: ShortText
    default_busbw_gbps: float | None = None
    chosen_busbw_gbps: float | None = None
    speedup: float | None = None
    choice: ShortText = ""
    source: ShortText = ""


class PublishedConfigMap(WireModel):
    name: Name
    digest: Annotated[str, Field(max_length=80)]


class CCLTuningStatus(WireModel):
    observed_generation: int | None = None
    conditions: Annotated[
        list[Condition], Field(max_length=16, json_schema_extra=CONDITION_LIST)
    ] = []
    topology: TopologySummary | None = None
    results: Annotated[list[TaskResult], Field(max_length=256)] = []
    config_maps: Annotated[list[PublishedConfigMap], Field(max_length=64)] = []
    plan_digest: Annotated[str, Field(max_length=80)] | None = None
    speedup: ShortText | None = None  # printer column, e.g. "1.27x (simulated)"
    message: Message | None = None


class CCLTuning(WireModel):
    spec: CCLTuningSpec
    status: CCLTuningStatus = CCLTuningStatus()

    KIND: ClassVar[str] = "CCLTuning"
    PLURAL: ClassVar[str] = "ccltunings"
