"""Plan files -> ConfigMap manifests under the 1 MiB object limit, switched by a pointer.

Content ConfigMaps are named by the plan digest and immutable, so a generation is complete
before anything points at it; the pointer ConfigMap (named after the CCLTuning) is written last
and names the generation, its ConfigMaps, and where each key goes in the pod (`manifest.json`).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from typing import Any

from ..api.plan import Plan

# A ConfigMap must stay under 1 MiB in total; leave room for metadata and keys.
MAX_CONFIGMAP_BYTES = 900 * 1024
# Above this size a file is stored gzipped in binaryData (NCCL reads plain files: the injected
# pod unpacks nothing, so only files NCCL never reads directly, like reports, may be compressed).
COMPRESSIBLE = ("report.md", "report.json")
COMPRESS_ABOVE = 256 * 1024
MANIFEST_KEY = "manifest.json"
LABEL_PLAN = "ccltune.io/plan"
LABEL_DIGEST = "ccltune.io/plan-digest"
LABEL_ROLE = "ccltune.io/role"


def config_key(path: str) -> str:
    """ConfigMap keys allow [-._a-zA-Z0-9]+ only: 'msccl/ar.xml' -> 'msccl__ar.xml'."""
    key = path.replace("/", "__")
    if not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
        raise ValueError(f"plan file path {path!r} cannot be a ConfigMap key")
    return key


def _entry(path: str, content: str) -> tuple[str, str, str, int]:
    """(key, field, value, size): gzip+base64 large reports into binaryData."""
    key = config_key(path)
    raw = content.encode()
    if path in COMPRESSIBLE and len(raw) > COMPRESS_ABOVE:
        packed = base64.b64encode(gzip.compress(raw, mtime=0)).decode()
        return key + ".gz", "binaryData", packed, len(packed)
    return key, "data", content, len(raw)


def render_configmaps(
    plan: Plan, *, name: str, namespace: str, labels: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Content ConfigMaps first, the pointer ConfigMap last (apply in this order)."""
    if not plan.digest:
        raise ValueError("plan has no digest: build it with publish.files.with_files")
    short = plan.digest[:10]
    base_labels = {
        "app.kubernetes.io/managed-by": "ccltune",
        "app.kubernetes.io/part-of": "ccltune",
        LABEL_PLAN: name,
        LABEL_DIGEST: short,
        **(labels or {}),
    }
    shards: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    size = 0
    items: list[dict[str, str]] = []
    for f in plan.files:
        key, field_name, value, entry_size = _entry(f.path, f.content)
        if entry_size > MAX_CONFIGMAP_BYTES:
            raise ValueError(f"plan file {f.path} is {entry_size} bytes, over the ConfigMap limit")
        if current is None or size + entry_size > MAX_CONFIGMAP_BYTES:
            current = {"data": {}, "binaryData": {}}
            shards.append(current)
            size = 0
        current[field_name][key] = value
        size += entry_size + len(key)
        items.append({"configMap": f"{name}-{short}-{len(shards) - 1}", "key": key, "path": f.path})
    manifests: list[dict[str, Any]] = []
    for index, shard in enumerate(shards):
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{name}-{short}-{index}",
                "namespace": namespace,
                "labels": {**base_labels, LABEL_ROLE: "content"},
            },
            "immutable": True,
        }
        for field_name in ("data", "binaryData"):
            if shard[field_name]:
                body[field_name] = shard[field_name]
        manifests.append(body)
    manifest = {
        "plan": name,
        "digest": plan.digest,
        "configMaps": [m["metadata"]["name"] for m in manifests],
        "items": items,
        "env": plan.env,
    }
    manifests.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {**base_labels, LABEL_ROLE: "pointer"},
                "annotations": {LABEL_DIGEST: plan.digest},
            },
            "data": {MANIFEST_KEY: json.dumps(manifest, indent=1, sort_keys=True) + "\n"},
        }
    )
    return manifests
