"""Label-selector matching and target-node resolution, done client-side.

We also send labelSelector to the API server where it helps, but always re-check locally: the
result must not depend on the server filtering (KMock, for one, does not filter).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..api.ccltuning import CCLTuningSpec, LabelSelector

# Pod labels that the common training operators put on the pods of a workload, by kind.
# Job: batch.kubernetes.io/job-name (k8s >= 1.27); JobSet: jobset.sigs.k8s.io/jobset-name;
# Kubeflow PyTorchJob/MPIJob: training.kubeflow.org/job-name.
WORKLOAD_LABELS = {
    "Job": "batch.kubernetes.io/job-name",
    "JobSet": "jobset.sigs.k8s.io/jobset-name",
    "PyTorchJob": "training.kubeflow.org/job-name",
    "MPIJob": "training.kubeflow.org/job-name",
}


def pod_selector(spec: CCLTuningSpec) -> LabelSelector:
    """The selector for the pods that get the plan: spec.selector plus the workload's label."""
    labels = dict(spec.selector.match_labels)
    if spec.workload_ref is not None:
        labels[WORKLOAD_LABELS[spec.workload_ref.kind]] = spec.workload_ref.name
    return LabelSelector(match_labels=labels, match_expressions=spec.selector.match_expressions)


def selector_is_empty(sel: LabelSelector) -> bool:
    return not sel.match_labels and not sel.match_expressions


def matches(sel: LabelSelector, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; an empty selector matches nothing here (never 'all pods')."""
    if selector_is_empty(sel):
        return False
    for key, value in sel.match_labels.items():
        if labels.get(key) != value:
            return False
    for req in sel.match_expressions:
        present = key_in = req.key in labels
        if req.operator == "In":
            ok = key_in and labels[req.key] in req.values
        elif req.operator == "NotIn":
            ok = not key_in or labels[req.key] not in req.values
        elif req.operator == "Exists":
            ok = present
        else:
            ok = not present
        if not ok:
            return False
    return True


def selector_string(sel: LabelSelector) -> str:
    parts = [f"{k}={v}" for k, v in sorted(sel.match_labels.items())]
    for req in sel.match_expressions:
        if req.operator in ("In", "NotIn"):
            parts.append(f"{req.key} {req.operator.lower()} ({','.join(req.values)})")
        elif req.operator == "Exists":
            parts.append(req.key)
        else:
            parts.append(f"!{req.key}")
    return ",".join(parts)


def node_is_gpu(node: Mapping[str, Any], gpu_label: tuple[str, str]) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    key, value = gpu_label
    if key in labels and (not value or labels[key] == value):
        return True
    capacity = node.get("status", {}).get("capacity") or {}
    return str(capacity.get("nvidia.com/gpu", "0")) not in ("0", "")


def target_nodes(spec: CCLTuningSpec, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                 gpu_label: tuple[str, str]) -> list[str]:
    """Names of the nodes to plan for, sorted (node order fixes global ranks).

    names > node selector > where the selected pods run > every GPU node.
    """
    node_list = list(nodes)
    if spec.nodes.names:
        return sorted(set(spec.nodes.names))
    if spec.nodes.selector:
        return sorted(
            n["metadata"]["name"] for n in node_list
            if all((n["metadata"].get("labels") or {}).get(k) == v for k, v in spec.nodes.selector.items())
        )
    sel = pod_selector(spec)
    placed = {
        p["spec"]["nodeName"] for p in pods
        if (p.get("spec") or {}).get("nodeName") and matches(sel, p["metadata"].get("labels") or {})
    }
    if placed:
        return sorted(placed)
    return sorted(n["metadata"]["name"] for n in node_list if node_is_gpu(n, gpu_label))
