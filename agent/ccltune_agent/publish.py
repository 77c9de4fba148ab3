"""Publish one cluster-scoped NodeTopology per node; write only when its content changed.

Writes are JSON merge patches (RFC 7386): every API server accepts them for custom resources, and
lists are replaced whole. Keys that disappear are sent as null so no stale entry survives.
Status goes to the /status subresource; a server without one (404 there) gets it in the object.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ccltune.api.common import API_GROUP, API_VERSION, Condition, set_condition
from ccltune.api.nodetopology import NodeTopology, NodeTopologySpec

from .kube import ApiError, KubeClient

log = logging.getLogger(__name__)

BASE = f"/apis/{API_GROUP}/{API_VERSION}/{NodeTopology.PLURAL}"
REPROBE_REQUEST = "ccltune.io/reprobe-request"
REPROBE_SERVED = "ccltune.io/reprobe-served"
AGENT_POD = "ccltune.io/agent-pod"


def merge_diff(old: Any, new: Any) -> Any:
    """The merge patch that turns `old` into `new` (dicts recurse, removed keys become None)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_diff(old[key], value)
    return patch


def _cond_key(conds: list[Condition]) -> list[tuple[str, str, str, str]]:
    return sorted((c.type, c.status, c.reason, c.message) for c in conds)


@dataclass
class PublishOutcome:
    created: bool = False
    spec_written: bool = False
    status_written: bool = False


class Publisher:
    def __init__(self, client: KubeClient, node_name: str, owner: dict[str, Any] | None,
                 pod: str | None = None) -> None:
        self.client = client
        self.name = node_name
        self.owner = owner
        self.pod = pod
        self.path = f"{BASE}/{node_name}"

    def _metadata(self) -> dict[str, Any]:
        labels = {"app.kubernetes.io/managed-by": "ccltune-agent"}
        if len(self.name) <= 63:  # label values are capped at 63; longer node names keep only the name
            labels["ccltune.io/node"] = self.name
        meta: dict[str, Any] = {"name": self.name, "labels": labels}
        if self.pod:
            meta["annotations"] = {AGENT_POD: self.pod}
        if self.owner:
            meta["ownerReferences"] = [self.owner]
        return meta

    async def publish(self, spec: NodeTopologySpec, conditions: list[Condition]) -> PublishOutcome:
        out = PublishOutcome()
        obj = await self.client.get(self.path)
        if obj is None:
            body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": NodeTopology.KIND,
                    "metadata": self._metadata(), "spec": spec.wire()}
            try:
                obj = await self.client.create(BASE, body)
                out.created = out.spec_written = True
                log.info("created NodeTopology %s (%s)", self.name, spec.content_hash)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                obj = await self.client.get(self.path)  # lost a race with ourselves: update instead
                if obj is None:
                    raise
        if not out.created:
            old_spec = obj.get("spec") or {}
            meta_patch = merge_diff(_meta_view(obj.get("metadata") or {}), self._metadata())
            if old_spec.get("contentHash") != spec.content_hash or meta_patch:
                patch: dict[str, Any] = {}
                if old_spec.get("contentHash") != spec.content_hash:
                    patch["spec"] = merge_diff(old_spec, spec.wire())
                if meta_patch:
                    patch["metadata"] = meta_patch
                obj = await self.client.merge_patch(self.path, patch)
                out.spec_written = "spec" in patch
                if out.spec_written:
                    log.info("updated NodeTopology %s: %s -> %s", self.name, old_spec.get("contentHash"),
                             spec.content_hash)
            else:
                log.info("NodeTopology %s unchanged (%s); not rewritten", self.name, spec.content_hash)

        existing = _conditions(obj)
        merged = existing
        for cond in conditions:
            merged = set_condition(merged, cond)
        generation = (obj.get("metadata") or {}).get("generation")
        if generation is not None:
            merged = [c.model_copy(update={"observed_generation": generation}) for c in merged]
        old_gen = {c.observed_generation for c in existing}
        if out.created or _cond_key(merged) != _cond_key(existing) or (generation is not None and
                                                                        old_gen != {generation}):
            await self.write_status({"conditions": [c.wire() for c in merged]})
            out.status_written = True
        return out

    async def write_status(self, status: dict[str, Any]) -> None:
        try:
            await self.client.merge_patch(f"{self.path}/status", {"status": status})
        except ApiError as exc:
            if exc.status != 404:
                raise
            await self.client.merge_patch(self.path, {"status": status})  # no status subresource

    async def mark_served(self, request: str) -> bool:
        await self.client.merge_patch(self.path, {"metadata": {"annotations": {REPROBE_SERVED: request}}})
        return True


def _meta_view(meta: dict[str, Any]) -> dict[str, Any]:
    """The parts of live metadata the agent owns, shaped like `_metadata()` for diffing."""
    view: dict[str, Any] = {"name": meta.get("name")}
    labels = meta.get("labels") or {}
    view["labels"] = {k: v for k, v in labels.items() if k in ("app.kubernetes.io/managed-by", "ccltune.io/node")}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k == AGENT_POD}
    if annotations:
        view["annotations"] = annotations
    if meta.get("ownerReferences"):
        view["ownerReferences"] = meta["ownerReferences"]
    return view


def _conditions(obj: dict[str, Any]) -> list[Condition]:
    out = []
    for raw in (obj.get("status") or {}).get("conditions") or []:
        try:
            out.append(Condition.model_validate(raw))
        except ValidationError:
            log.warning("ignoring a malformed condition on NodeTopology: %.200s", raw)
    return out
