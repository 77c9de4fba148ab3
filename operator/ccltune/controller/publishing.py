"""Apply a Plan's ConfigMaps: content first, pointer last, then prune older generations.

Content ConfigMaps are immutable and named by the plan digest, so re-applying the same plan is a
no-op (409 on create; a namesake holding other bytes is replaced) and a restarted operator writes
exactly the same objects.
"""

from __future__ import annotations

import copy
from typing import Any

from ..publish.configmaps import LABEL_DIGEST, LABEL_PLAN, LABEL_ROLE, plan_label
from .kube import ApiError, KubeClient


def with_owner(manifests: list[dict[str, Any]], owner: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for m in manifests:
        m = copy.deepcopy(m)
        m["metadata"]["ownerReferences"] = [owner]
        out.append(m)
    return out


async def apply_configmaps(client: KubeClient, manifests: list[dict[str, Any]], namespace: str) -> None:
    *content, pointer = manifests
    for cm in content:
        try:
            await client.create("v1", "configmaps", cm, namespace)
        except ApiError as exc:
            if exc.status != 409:
                raise
            # Same name means the same plain files, but another zlib may pack them into other
            # bytes or parts: an immutable ConfigMap that differs is replaced, not trusted.
            name = cm["metadata"]["name"]
            have = await client.get("v1", "configmaps", name, namespace) or {}
            if any((have.get(f) or {}) != (cm.get(f) or {}) for f in ("data", "binaryData")):
                await client.delete("v1", "configmaps", name, namespace)
                await client.create("v1", "configmaps", cm, namespace)
    # The pointer moves only now that its generation is complete.
    current = await client.get("v1", "configmaps", pointer["metadata"]["name"], namespace)
    if current is None:
        await client.create("v1", "configmaps", pointer, namespace)
        return
    patch = {k: v for k, v in pointer.items() if k not in ("apiVersion", "kind")}
    for field in ("data", "binaryData"):  # merge patch keeps keys it does not mention: drop them
        stale = set(current.get(field) or {}) - set(pointer.get(field) or {})
        if stale:
            patch.setdefault(field, {}).update({k: None for k in stale})
    await client.patch("v1", "configmaps", pointer["metadata"]["name"], patch, namespace)


async def prune(client: KubeClient, plan_name: str, keep: set[str], namespace: str) -> list[str]:
    """Delete content ConfigMaps of older generations of this plan (after the pointer moved)."""
    removed = []
    label = plan_label(plan_name)
    items = await client.list("v1", "configmaps", namespace, label_selector=f"{LABEL_PLAN}={label}")
    for cm in items:
        meta = cm["metadata"]
        labels = meta.get("labels") or {}
        if labels.get(LABEL_PLAN) != label or labels.get(LABEL_ROLE) != "content":
            continue  # the server may not have filtered; check ourselves
        if meta["name"] in keep or LABEL_DIGEST not in labels:
            continue
        if await client.delete("v1", "configmaps", meta["name"], namespace):
            removed.append(meta["name"])
    return removed
