"""Pydantic models: what ccltune reads and writes. No I/O, no Kubernetes client here.

The names below are re-exported lazily (PEP 562): importing `ccltune.api.cluster` must not build
the CRD models of `ccltuning` (~0.13 s), which `ccltune synthesize` never uses.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ccltuning import CCLTuning, CCLTuningSpec, CCLTuningStatus, CollectiveTask
    from .cluster import ClusterNode, ClusterTopology, Device, DeviceKind, Dimension, Link, LinkKind
    from .common import Collective, Condition, Source, format_size, parse_size
    from .nodetopology import NodeTopology, NodeTopologySpec
    from .plan import Choice, Estimate, Plan, PlanFile, PlanTask, TaskKey

__all__ = [
    "CCLTuning",
    "CCLTuningSpec",
    "CCLTuningStatus",
    "Choice",
    "ClusterNode",
    "ClusterTopology",
    "Collective",
    "CollectiveTask",
    "Condition",
    "Device",
    "DeviceKind",
    "Dimension",
    "Estimate",
    "Link",
    "LinkKind",
    "NodeTopology",
    "NodeTopologySpec",
    "Plan",
    "PlanFile",
    "PlanTask",
    "Source",
    "TaskKey",
    "format_size",
    "parse_size",
]

_MODULES = {
    "ccltuning": ("CCLTuning", "CCLTuningSpec", "CCLTuningStatus", "CollectiveTask"),
    "cluster": ("ClusterNode", "ClusterTopology", "Device", "DeviceKind", "Dimension", "Link",
                "LinkKind"),
    "common": ("Collective", "Condition", "Source", "format_size", "parse_size"),
    "nodetopology": ("NodeTopology", "NodeTopologySpec"),
    "plan": ("Choice", "Estimate", "Plan", "PlanFile", "PlanTask", "TaskKey"),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
