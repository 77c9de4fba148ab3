"""Shared model pieces: camelCase wire names, bounded strings, Kubernetes-style conditions."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from .errors import InputError

API_GROUP = "ccltune.io"
API_VERSION = "v1alpha1"

# Bounds keep CEL rules within the API server's cost budget (it multiplies by maxLength/maxItems).
Name = Annotated[str, Field(min_length=1, max_length=253)]
ShortText = Annotated[str, Field(max_length=256)]
Message = Annotated[str, Field(max_length=1024)]


class WireModel(BaseModel):
    """Base for every model: camelCase on the wire, snake_case in Python, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
    )

    def wire(self) -> dict:
        """The JSON-ready dict with wire names, leaving out unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Collective(StrEnum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLTOALL = "alltoall"
    BROADCAST = "broadcast"


class Source(StrEnum):
    """Where a number came from. Every number ccltune prints carries one."""

    SIMULATED = "simulated"
    REPLAYED = "replayed"
    MEASURED = "measured"
    BOUND = "bound"


# Conditions form a map keyed by type (Kubernetes API conventions).
CONDITION_LIST = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}

ConditionStatus = Literal["True", "False", "Unknown"]
_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(WireModel):
    """metav1.Condition, as Kubernetes API conventions define it."""

    type: Annotated[str, Field(max_length=316, pattern=r"^[A-Za-z][A-Za-z0-9]*$")]
    status: ConditionStatus
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=_REASON)]
    message: Message = ""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    last_transition_time: datetime | None = None


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Upsert by type; lastTransitionTime moves only when the status changes."""
    out: list[Condition] = []
    replaced = False
    for cond in conditions:
        if cond.type != new.type:
            out.append(cond)
            continue
        replaced = True
        changed = cond.status != new.status
        ltt = (new.last_transition_time or now()) if changed else cond.last_transition_time
        out.append(new.model_copy(update={"last_transition_time": ltt}))
    if not replaced:
        out.append(
            new.model_copy(update={"last_transition_time": new.last_transition_time or now()})
        )
    return out


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """'64K', '64KiB', '1G', '1048576' -> bytes. K/M/G are binary, as nccl-tests' -b/-e flags."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.match(text)
        if not match:
            raise InputError(f"not a size: {text!r} (use e.g. 1K, 64MiB, 1G or a byte count)")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise InputError(f"size must be positive, got {text!r}")
    return value


def format_size(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        scale = _UNITS[unit]
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B" if nbytes < 1024 else f"{nbytes}"


SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGTkmgt]i?)?[Bb]?\s*$"
SizeText = Annotated[str, Field(max_length=32, pattern=SIZE_PATTERN)]
