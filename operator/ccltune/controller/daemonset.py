"""The agent DaemonSet: rendered from the operator config, node affinity from the CCLTunings."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from ..api.ccltuning import CCLTuningSpec
from ..api.common import API_GROUP, API_VERSION
from .config import OperatorConfig
from .kube import KubeClient

NAME = "ccltune-agent"
LABELS = {
    "app.kubernetes.io/name": NAME,
    "app.kubernetes.io/component": "agent",
    "app.kubernetes.io/managed-by": "ccltune-operator",
}
SELECTOR = {"app.kubernetes.io/name": NAME}
HASH_ANNOTATION = f"{API_GROUP}/template-hash"


def node_terms(specs: Iterable[CCLTuningSpec], gpu_label: tuple[str, str]) -> list[dict[str, Any]]:
    """One nodeSelectorTerm per distinct target (terms are ORed); sorted so output is stable."""
    key, value = gpu_label
    gpu_term = {"matchExpressions": [
        {"key": key, "operator": "In", "values": [value]} if value else {"key": key, "operator": "Exists"}
    ]}
    terms: dict[str, dict[str, Any]] = {}
    for spec in specs:
        term: dict[str, Any]
        if spec.nodes.names:
            term = {"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": sorted(set(spec.nodes.names))}
            ]}
        elif spec.nodes.selector:
            term = {"matchExpressions": [
                {"key": k, "operator": "In", "values": [v]} for k, v in sorted(spec.nodes.selector.items())
            ]}
        else:
            term = gpu_term  # where the pods run or will run: any GPU node
        terms[json.dumps(term, sort_keys=True)] = term
    return [terms[k] for k in sorted(terms)]


def render(cfg: OperatorConfig, terms: list[dict[str, Any]]) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "serviceAccountName": cfg.agent_service_account,
        "automountServiceAccountToken": True,
        "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }},
        "tolerations": cfg.agent_tolerations,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "agent",
            "image": cfg.agent_image,
            "imagePullPolicy": cfg.image_pull_policy,
            "command": ["ccltune-agent"],
            "args": list(cfg.agent_args),
            "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                # NVIDIA container toolkit: expose NVML without requesting a GPU (as GPU Feature
                # Discovery's DaemonSet does).
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
            ],
            "resources": cfg.agent_resources,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [{"name": "sys", "mountPath": "/host/sys", "readOnly": True}],
        }],
        "volumes": [{"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}}],
    }
    if cfg.agent_health_port:
        container = pod_spec["containers"][0]
        container["ports"] = [{"name": "health", "containerPort": cfg.agent_health_port}]
        container["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": "health"},
                                      "periodSeconds": 30, "failureThreshold": 3}
        container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": "health"}, "periodSeconds": 10}
    if cfg.agent_priority_class:
        pod_spec["priorityClassName"] = cfg.agent_priority_class
    template = {"metadata": {"labels": dict(LABELS)}, "spec": pod_spec}
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": cfg.namespace, "labels": dict(LABELS),
                     "annotations": {HASH_ANNOTATION: digest}},
        "spec": {
            "selector": {"matchLabels": dict(SELECTOR)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": template,
        },
    }


def _specs(items: Iterable[dict[str, Any]]) -> list[CCLTuningSpec]:
    out = []
    for item in items:
        if item.get("metadata", {}).get("deletionTimestamp"):
            continue
        try:
            out.append(CCLTuningSpec.model_validate(item.get("spec") or {}))
        except ValidationError:
            continue  # an invalid CCLTuning targets nothing; its own status says why
    return out


_lock = asyncio.Lock()


async def sync(client: KubeClient, cfg: OperatorConfig) -> str:
    """Make the DaemonSet match the current CCLTunings; returns what it did."""
    async with _lock:
        tunings = await client.list(f"{API_GROUP}/{API_VERSION}", "ccltunings")
        specs = _specs(tunings)
        current = await client.get("apps/v1", "daemonsets", NAME, cfg.namespace)
        if not specs:
            if current is not None:
                await client.delete("apps/v1", "daemonsets", NAME, cfg.namespace)
                return "deleted"
            return "absent"
        desired = render(cfg, node_terms(specs, cfg.gpu_label))
        if current is None:
            await client.create("apps/v1", "daemonsets", desired, cfg.namespace)
            return "created"
        # The API server fills defaults into the stored template, so compare our own hash.
        have = (current.get("metadata", {}).get("annotations") or {}).get(HASH_ANNOTATION)
        if have != desired["metadata"]["annotations"][HASH_ANNOTATION]:
            # Merge patch replaces lists wholesale, so the affinity terms follow exactly.
            await client.patch("apps/v1", "daemonsets", NAME,
                               {"metadata": desired["metadata"], "spec": desired["spec"]}, cfg.namespace)
            return "updated"
        return "unchanged"
