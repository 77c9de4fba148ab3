"""Plan files -> ConfigMap manifests under the 1 MiB object limit, switched by a pointer.

Content ConfigMaps are named by the plan digest and immutable, so a generation is complete
before anything points at it; the pointer ConfigMap (named after the CCLTuning) is written last
and names the generation, its ConfigMaps, and where each key goes in the pod (`manifest.json`).

A file whose plain entry would not fit (and a large report) is packed: gzip (mtime 0, so the
bytes are deterministic) in binaryData, split into parts of at most one ConfigMap each. Packed
items say so in the manifest (`packing`, `part`, `parts`); the pod's init container puts the plain
file back (publish/unpack.py). Every item carries the file's `sha256`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from typing import Any

from ..api.plan import Plan
from .unpack import MAX_INDEX_BYTES, PACKING, index_arg, is_packed

# A ConfigMap must stay under 1 MiB in total; leave room for metadata and keys.
MAX_CONFIGMAP_BYTES = 900 * 1024
# gzip bytes per part: base64 makes them exactly one ConfigMap's worth.
PART_BYTES = MAX_CONFIGMAP_BYTES // 4 * 3
# Reports are packed above this size already (they compress well and nothing reads them often).
COMPRESSIBLE = ("report.md", "report.json")
COMPRESS_ABOVE = 256 * 1024
# A generation larger than this as stored (~73 ConfigMaps) is a bug, not a plan: every pod
# start would copy it and etcd keeps it per generation.
MAX_PLAN_BYTES = 64 * 1024 * 1024
MANIFEST_KEY = "manifest.json"
LABEL_PLAN = "ccltune.io/plan"
LABEL_DIGEST = "ccltune.io/plan-digest"
LABEL_ROLE = "ccltune.io/role"


# API server limits: object names are DNS subdomains (<= 253), label values <= 63 characters.
MAX_NAME = 253
MAX_LABEL_VALUE = 63
POINTER_SUFFIX = "-ccltune"


def fit(text: str, limit: int) -> str:
    """`text` if it fits, else a deterministic `<prefix>-<hash8>` of at most `limit` characters
    (the prefix loses trailing '-' and '.', so the result stays a valid name and label value)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return text[: limit - 9].rstrip("-.") + "-" + digest


def pointer_name(tuning: str, configured: str | None = None) -> str:
    """The pointer ConfigMap's name: publish.configMapName, else `<tuning>-ccltune` (fitted)."""
    return configured or fit(tuning, MAX_NAME - len(POINTER_SUFFIX)) + POINTER_SUFFIX


def plan_label(pointer: str) -> str:
    """The ccltune.io/plan label value naming a pointer (names may be longer than labels)."""
    return fit(pointer, MAX_LABEL_VALUE)


def content_name(pointer: str, short_digest: str, index: int) -> str:
    suffix = f"-{short_digest}-{index}"
    return fit(pointer, MAX_NAME - len(suffix)) + suffix


def config_key(path: str) -> str:
    """ConfigMap keys allow [-._a-zA-Z0-9]+ only: 'msccl/ar.xml' -> 'msccl__ar.xml'."""
    key = path.replace("/", "__")
    if not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
        raise ValueError(f"plan file path {path!r} cannot be a ConfigMap key")
    return key


def _entries(path: str, content: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(key, field, value, item fields) per stored entry: plain data, or gzip parts in binaryData."""
    key = config_key(path)
    raw = content.encode()
    report = path in COMPRESSIBLE and len(raw) > COMPRESS_ABOVE
    if len(raw) <= MAX_CONFIGMAP_BYTES and not report:
        return [(key, "data", content, {})]
    packed = gzip.compress(raw, mtime=0)
    chunks = [packed[i : i + PART_BYTES] for i in range(0, len(packed), PART_BYTES)]
    # One part keeps the `<key>.gz` key compressed reports always had (existing generations).
    keys = (
        [f"{key}.gz.part{i:03d}" for i in range(len(chunks))] if len(chunks) > 1 else [f"{key}.gz"]
    )
    return [
        (k, "binaryData", base64.b64encode(chunk).decode(),
         {"packing": PACKING, "part": i, "parts": len(chunks)})
        for i, (k, chunk) in enumerate(zip(keys, chunks, strict=True))
    ]  # fmt: skip


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
        LABEL_PLAN: plan_label(name),
        LABEL_DIGEST: short,
        **(labels or {}),
    }
    shards: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    size = total = 0
    items: list[dict[str, Any]] = []
    owner: dict[str, str] = {}
    for f in plan.files:
        for key, field_name, value, extra in _entries(f.path, f.content):
            if key in owner:
                raise ValueError(f"plan files {owner[key]} and {f.path} share ConfigMap key {key}")
            owner[key] = f.path
            entry_size = len(value.encode()) if field_name == "data" else len(value)
            if current is None or size + entry_size > MAX_CONFIGMAP_BYTES:
                current = {"data": {}, "binaryData": {}}
                shards.append(current)
                size = 0
            current[field_name][key] = value
            size += entry_size + len(key)
            total += entry_size
            items.append({"configMap": content_name(name, short, len(shards) - 1), "key": key,
                          "path": f.path, "sha256": f.digest, **extra})  # fmt: skip
    if total > MAX_PLAN_BYTES:
        raise ValueError(f"plan {name} is {total} bytes as stored, over the {MAX_PLAN_BYTES} a "
                         "generation may hold")  # fmt: skip
    if is_packed(items) and len(index_arg(items)) > MAX_INDEX_BYTES:
        raise ValueError(f"plan {name} lists {len(items)} ConfigMap entries, too many for the "
                         "unpack init container's arguments")  # fmt: skip
    manifests: list[dict[str, Any]] = []
    for index, shard in enumerate(shards):
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": content_name(name, short, index),
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
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    if len(text.encode()) > MAX_CONFIGMAP_BYTES:
        raise ValueError(f"plan {name}: manifest.json is {len(text.encode())} bytes, over the "
                         "ConfigMap limit")  # fmt: skip
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
            "data": {MANIFEST_KEY: text},
        }
    )
    return manifests
