"""Pod injection: which CCLTuning selects a pod, and the change that mounts its published plan.

Pure functions; main.py wires them into kopf's mutating webhook. The change is expressed as the
desired pod fragments (kopf diffs them into the JSON patch of the AdmissionReview response).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from ..api.ccltuning import CCLTuningSpec, LabelSelector
from ..api.common import API_GROUP
from ..api.plan import PlanFile
from ..publish.configmaps import MANIFEST_KEY
from ..publish.files import injection_env
from .selectors import matches, pod_selector

MOUNT_DIR = "/etc/ccltune"
VOLUME = "ccltune-plan"
ANNOTATION_DIGEST = f"{API_GROUP}/plan-digest"
ANNOTATION_TUNING = f"{API_GROUP}/tuning"


@dataclass(frozen=True)
class Entry:
    """What the webhook needs to know about one CCLTuning (kept in a kopf index)."""

    name: str
    selector: LabelSelector
    inject: bool
    pointer: str  # the pointer ConfigMap's name
    published: bool
    digest: str | None
    uid: str = ""


def entry(name: str, spec: dict[str, Any], status: dict[str, Any], uid: str = "") -> Entry | None:
    try:
        parsed = CCLTuningSpec.model_validate(spec)
    except ValueError:
        return None
    conds = {c.get("type"): c.get("status") for c in (status or {}).get("conditions") or []}
    return Entry(
        name=name,
        selector=pod_selector(parsed),
        inject=parsed.publish.inject,
        pointer=parsed.publish.config_map_name or f"{name}-ccltune",
        published=conds.get("Published") == "True",
        digest=(status or {}).get("planDigest"),
        uid=uid,
    )


def select(labels: dict[str, str], entries: list[Entry]) -> Entry | None:
    """The injecting CCLTuning that selects these labels; by name when several do."""
    chosen = [e for e in entries if e.inject and matches(e.selector, labels)]
    return min(chosen, key=lambda e: e.name) if chosen else None


def read_manifest(pointer: dict[str, Any]) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((pointer.get("data") or {})[MANIFEST_KEY])
    return manifest


def injected_pod(pod: dict[str, Any], manifest: dict[str, Any], tuning: str) -> dict[str, Any]:
    """The fields of `pod` to set (metadata.annotations, spec.volumes, spec.containers).

    User env wins: a variable the container already sets is left alone. Running it on its own
    output changes nothing.
    """
    items: list[dict[str, str]] = manifest["items"]
    by_cm: dict[str, list[dict[str, str]]] = {}
    for item in items:
        by_cm.setdefault(item["configMap"], []).append({"key": item["key"], "path": item["path"]})
    volume: dict[str, Any] = {"name": VOLUME, "projected": {"defaultMode": 0o444, "sources": [
        {"configMap": {"name": cm, "items": sorted(entries, key=lambda e: e["path"])}}
        for cm, entries in sorted(by_cm.items())
    ]}}
    # injection_env only looks at paths; the content lives in the ConfigMaps.
    env = injection_env([PlanFile(path=i["path"], content="", digest="") for i in items], MOUNT_DIR)
    spec = pod.get("spec") or {}
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != VOLUME] + [volume]
    containers = []
    for container in spec.get("containers") or []:
        c = copy.deepcopy(container)
        have = {e.get("name") for e in c.get("env") or []}
        extra = [{"name": k, "value": v} for k, v in sorted(env.items()) if k not in have]
        if extra:
            c["env"] = list(c.get("env") or []) + extra
        mounts = c.get("volumeMounts") or []
        if not any(m.get("name") == VOLUME or m.get("mountPath") == MOUNT_DIR for m in mounts):
            c["volumeMounts"] = [*mounts, {"name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": True}]
        containers.append(c)
    annotations = {ANNOTATION_DIGEST: manifest["digest"], ANNOTATION_TUNING: tuning}
    return {"metadata": {"annotations": annotations},
            "spec": {"volumes": volumes, "containers": containers}}


def changes(pod: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Only the parts that differ, so an already-injected pod gets an empty patch."""
    out: dict[str, Any] = {}
    have_ann = (pod.get("metadata") or {}).get("annotations") or {}
    ann = {k: v for k, v in desired["metadata"]["annotations"].items() if have_ann.get(k) != v}
    if ann:
        out["metadata"] = {"annotations": ann}
    spec = pod.get("spec") or {}
    spec_out = {k: v for k, v in desired["spec"].items() if spec.get(k) != v}
    if spec_out:
        out["spec"] = spec_out
    return out
