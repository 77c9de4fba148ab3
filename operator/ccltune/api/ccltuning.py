"""CCLTuning: the namespaced resource a user applies to have a job's collectives planned."""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .common import (
    CONDITION_LIST,
    Collective,
    Condition,
    Message,
    Name,
    ShortText,
    SizeText,
    WireModel,
    format_size,
    parse_size,
)

LabelValue = Annotated[str, Field(max_length=63)]
LabelKey = Annotated[str, Field(max_length=317)]

# What the API server accepts as a ConfigMap (or Job, workload) name: RFC 1123 subdomain.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]

# The largest message a task may plan for. Frameworks' biggest single calls are gradient and
# parameter buckets: DeepSpeed's reduce/allgather_bucket_size default 5e8 elements (~1-2 GB,
# https://www.deepspeed.ai/docs/config-json/), PyTorch DDP's bucket_cap_mb 25 MB; 16 GiB leaves
# room for whole-layer FSDP gathers of very large models while ruling out typos such as 1T.
MAX_TASK_BYTES = 16 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _int_at_most(limit: int) -> str:
    """Regex for a decimal integer (leading zeros stripped) <= limit."""
    s = str(limit)
    alts = [f"[0-9]{{1,{len(s) - 1}}}"] if len(s) > 1 else []
    for i, d in enumerate(s):
        if d != "0":
            rest = len(s) - i - 1
            alts.append(s[:i] + f"[0-{int(d) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alts.append(s)
    return "(" + "|".join(alts) + ")"


def _fraction_at_most(digits: str) -> str:
    """Regex for fraction digits whose value is <= 0.<digits>."""
    alts = [digits[:i] + "0*" for i in range(1, len(digits) + 1)]
    alts += [digits[:i] + f"[0-{int(d) - 1}][0-9]*" for i, d in enumerate(digits) if d != "0"]
    return "(" + "|".join(alts) + ")"


def _numeral_at_most(limit: Fraction) -> str:
    """Regex for a decimal numeral (digits, optional .digits) whose value is <= limit."""
    whole, rest = divmod(limit, 1)
    alts = [f"0*{_int_at_most(int(whole) - 1)}([.][0-9]+)?"] if whole >= 1 else []
    at = f"0*{int(whole)}" if whole >= 1 else "0+"
    if rest == 0:
        alts.append(f"{at}([.]0+)?")
    else:  # unit sizes are powers of two, so the fraction has a finite decimal expansion
        digits = ""
        while rest:
            rest *= 10
            digits += str(int(rest))
            rest -= int(rest)
        alts.append(f"{at}([.]{_fraction_at_most(digits)})?")
    return "(" + "|".join(alts) + ")"


def size_at_most_regex(limit: int) -> str:
    """The SIZE_PATTERN texts whose parse_size is <= limit bytes (what CEL checks at admission)."""
    alts = []
    for unit, scale in _UNITS.items():
        suffix = f"[{unit}{unit.lower()}]i?[Bb]?" if unit else "[Bb]?"
        alts.append(_numeral_at_most(Fraction(limit, scale)) + r"\s*" + suffix)
    return r"^\s*(" + "|".join(alts) + r")\s*$"


def _too_big(field: str) -> str:
    return (f"{field} must be at most {format_size(MAX_TASK_BYTES)} "
            "(the largest single collective ccltune plans for)")


def _size_rule(field: str) -> dict[str, list[dict[str, str]]]:
    regex = size_at_most_regex(MAX_TASK_BYTES).replace("\\", "\\\\")
    return {"x-kubernetes-validations": [{"rule": f"self.matches('{regex}')", "message": _too_big(field)}]}




class LabelSelectorRequirement(WireModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[list[LabelValue], Field(max_length=64)] = []


class LabelSelector(WireModel):
    match_labels: dict[LabelKey, LabelValue] = {}
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=16)] = []


class WorkloadRef(WireModel):
    kind: Literal["Job", "JobSet", "PyTorchJob", "MPIJob"]
    name: ObjectName


class NodeTarget(WireModel):
    selector: dict[LabelKey, LabelValue] = {}
    names: Annotated[list[Name], Field(max_length=4096)] = []


Role = Literal["world", "tp", "dp", "pp", "ep"]


class CollectiveTask(WireModel):
    """One collective to plan over a size range, for a communicator of a given role."""

    op: Collective
    min_bytes: Annotated[SizeText, Field(json_schema_extra=_size_rule("minBytes"))] = "1K"
    max_bytes: Annotated[SizeText, Field(json_schema_extra=_size_rule("maxBytes"))] = "1G"
    role: Role = "world"
    # Communicator size; default: what the role implies (world = all target GPUs).
    ranks: Annotated[int, Field(ge=1, le=1_000_000)] | None = None

    @field_validator("min_bytes", "max_bytes")
    @classmethod
    def _at_most(cls, text: str, info: ValidationInfo) -> str:
        if parse_size(text) > MAX_TASK_BYTES:
            raise ValueError(f"{_too_big(to_camel(info.field_name or ''))}, got {text}")
        return text

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
    # SM budget: threadblocks per GPU an MSCCL schedule may take from the job's kernels. Unset:
    # no more than NCCL's own choice uses for that collective (docs/synthesis.md). The executor
    # holds at most 32 per channel x 32 channels (msccl_struct.h, device.h).
    max_threadblocks: Annotated[int, Field(ge=1, le=1024)] | None = None
    # In the cluster: pods of the Indexed Job the tasks' syntheses are spread over (at most one
    # per task, and the operator's synthesisMaxShards); 1 never shards. Unset: from the
    # estimated synthesis work (docs/operator.md, "Sharded synthesis").
    shards: Annotated[int, Field(ge=1, le=64)] | None = None


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
    replay_config_map: ObjectName | None = None
    budget: Annotated[int, Field(ge=1, le=100_000)] = 200
    seed: Annotated[int, Field(ge=0)] = 0
    # profiler live: the image with nccl-tests and the job's NCCL (None: the chart's default).
    benchmark_image: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    # Deadline of one benchmark run (the Job's activeDeadlineSeconds); a run past it is deleted.
    benchmark_timeout_seconds: Annotated[int, Field(ge=60, le=86_400)] = 1800
    # Each configuration's launch is killed after this; its points are recorded missing.
    trial_timeout_seconds: Annotated[int, Field(ge=10, le=3600)] = 120
    # Benchmarks never share nodes with the selected training pods unless this is true.
    benchmark_on_busy_nodes: bool = False


# Which runtime the job's image runs: stock NCCL, Azure's msccl-executor-nccl (NCCL 2.23.4 under
# it), or RCCL with its built-in MSCCL. Files and claims follow what that runtime really does.
Runtime = Literal["nccl", "msccl", "rccl"]


class PublishOptions(WireModel):
    config_map_name: ObjectName | None = None
    inject: bool = True
    runtime: Runtime = "nccl"
    # NCCL_TOPO_FILE: auto = only where it helps and is safe (docs/topology.md); always = whenever
    # every node's file is the same; never.
    topology_file: Literal["auto", "always", "never"] = "auto"
    # The NCCL under the runtime; None: the runtime's own (publish/runtime.py: 2.23 for msccl).
    nccl_version: (
        Annotated[str, Field(max_length=16, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")] | None
    ) = None


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


class MeasuredProfile(WireModel):
    """The measured profile a plan was tuned on (profiler live, or replayConfigMap)."""

    source: Literal["measured"] = "measured"
    config_map: Name
    job: ShortText | None = None  # the benchmark Job/MPIJob that measured it (namespace/name)
    measured_at: ShortText | None = None  # RFC 3339, when that run finished
    missing_points: int = 0  # trials that timed out or failed: missing, never zero


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
    measurement: MeasuredProfile | None = None  # profiler live/replay: where the numbers came from


class CCLTuning(WireModel):
    spec: CCLTuningSpec
    status: CCLTuningStatus = CCLTuningStatus()

    KIND: ClassVar[str] = "CCLTuning"
    PLURAL: ClassVar[str] = "ccltunings"
