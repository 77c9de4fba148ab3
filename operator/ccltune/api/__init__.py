"""Pydantic models: what ccltune reads and writes. No I/O, no Kubernetes client here."""

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
