"""Plan: for each task key, what ccltune chose, what it predicts or measured, and the files to publish."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .common import Collective, Source, WireModel

ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")


class TaskKey(WireModel):
    collective: Collective
    min_bytes: Annotated[int, Field(ge=1)]
    max_bytes: Annotated[int, Field(ge=1)]
    ranks: Annotated[int, Field(ge=1)]
    nodes: Annotated[int, Field(ge=1)]
    role: str = "world"

    def label(self) -> str:
        return f"{self.collective}/{self.role}/{self.ranks}r{self.nodes}n/{self.min_bytes}-{self.max_bytes}"


class Choice(WireModel):
    """A concrete way to run the task: NCCL with given settings, or an MSCCL schedule file."""

    kind: Literal["nccl", "msccl"]
    algorithm: str | None = None  # NCCL algorithm or the MSCCL schedule's name
    protocol: str | None = None
    channels: Annotated[int, Field(ge=1)] | None = None
    threads: Annotated[int, Field(ge=1)] | None = None
    chunk_bytes: Annotated[int, Field(ge=1)] | None = None
    msccl_file: str | None = None
    # What makes the runtime do this, for the report: "NCCL default", "tuner row 12",
    # "msccl/<file>.xml", "nccl.conf". None: not yet known.
    realized_by: str | None = None

    def describe(self) -> str:
        if self.kind == "msccl":
            return f"msccl:{self.algorithm}"
        parts = [self.algorithm or "?", self.protocol or "?"]
        if self.channels:
            parts.append(f"{self.channels}ch")
        return "/".join(parts)


class Estimate(WireModel):
    """One size point, nccl-tests style: time, algbw, busbw, and where the numbers came from."""

    size_bytes: Annotated[int, Field(ge=1)]
    time_us: Annotated[float, Field(gt=0)]
    algbw_gbps: float
    busbw_gbps: float
    source: Source
    bound_us: float | None = None  # lower bound on time at this size
    pct_of_bound: float | None = None  # bound_us / time_us * 100
    choice: Choice | None = None  # what ran at this size, when it varies by size
    # Which model timed it (model/evaluate.py); speedups divide only times of one evaluator.
    evaluator: str | None = None


class PlanTask(WireModel):
    key: TaskKey
    default: Choice  # what NCCL would pick on its own
    chosen: Choice
    default_estimates: list[Estimate]
    chosen_estimates: list[Estimate]
    trials: int | None = None  # tuning trials used, when tuned
    notes: list[str] = []


class PlanFile(WireModel):
    """A file to publish: path relative to the plan directory (nccl.conf, msccl/<x>.xml, ...)."""

    path: str
    content: str
    digest: str  # sha256 of content


class Plan(WireModel):
    name: str
    cluster: str
    runtime: Literal["nccl", "msccl", "rccl"] = "nccl"  # spec.publish.runtime the files are for
    world_size: int
    nodes: int
    tasks: list[PlanTask]
    env: dict[str, str] = {}  # NCCL_* settings; also written to nccl.conf
    files: list[PlanFile] = []
    digest: str = ""  # sha256 over the files, in path order
    notes: list[str] = []
