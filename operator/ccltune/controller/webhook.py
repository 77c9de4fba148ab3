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
from ..publish.configmaps import MANIFEST_KEY, pointer_name
from ..publish.files import TUNER_PLUGIN_DIR, TUNER_PLUGIN_PATH, TUNER_TABLE, injection_env
from ..publish.unpack import index_arg, is_packed
from .config import OperatorConfig
from .selectors import matches, pod_selector

MOUNT_DIR = "/etc/ccltune"
VOLUME = "ccltune-plan"
# Packed plans: the ConfigMaps go to the init container only, which writes the files to VOLUME.
PACKED_DIR = "/var/run/ccltune/packed"
PACKED_VOLUME = "ccltune-plan-packed"
UNPACK_CONTAINER = "ccltune-unpack"
UNPACK_UID = 65532  # the ccltune image's USER
# ccltune's NCCL tuner plugin: built into the image (Dockerfile), copied by the init container
# into an emptyDir the training containers mount read-only at TUNER_PLUGIN_DIR.
PLUGIN_VOLUME = "ccltune-plugin"
IMAGE_PLUGIN = "/opt/ccltune/nccl/libccltune-tuner.so"
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
        pointer=pointer_name(name, parsed.publish.config_map_name),
        published=conds.get("Published") == "True",
        digest=(status or {}).get("planDigest"),
        uid=uid,
    )


def select(labels: dict[str, str], entries: list[Entry]) -> Entry | None:
    """The injecting CCLTuning that selects these labels; by name when several do."""
    chosen = [e for e in entries if e.inject and matches(e.selector, labels)]
    return min(chosen, key=lambda e: e.name) if chosen else None


def read_manifest(pointer: dict[str, Any]) -> dict[str, Any]:
    """The pointer's manifest.json; ValueError (one line) when it is absent or malformed."""
    text = (pointer.get("data") or {}).get(MANIFEST_KEY)
    if not isinstance(text, str):
        raise ValueError(f"{MANIFEST_KEY} is missing")
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{MANIFEST_KEY} is not valid JSON ({exc.msg})") from None
    items = manifest.get("items") if isinstance(manifest, dict) else None
    well_formed = (
        isinstance(items, list) and isinstance(manifest.get("configMaps"), list)
        and all(isinstance(n, str) for n in manifest["configMaps"])
        and isinstance(manifest.get("digest"), str)
        and all(isinstance(i, dict) and all(isinstance(i.get(k), str) for k in ("configMap", "key", "path"))
                for i in items)
    )  # fmt: skip
    if not well_formed:
        raise ValueError(f"{MANIFEST_KEY} lacks a digest, configMaps or well-formed items")
    result: dict[str, Any] = manifest
    return result


def injected_pod(pod: dict[str, Any], manifest: dict[str, Any], tuning: str,
                 cfg: OperatorConfig | None = None) -> dict[str, Any]:
    """The fields of `pod` to set (metadata.annotations, spec.volumes, spec.containers and, when
    the plan has packed files, spec.initContainers).

    Plain plans: the content ConfigMaps projected at MOUNT_DIR. Packed plans: an emptyDir at
    MOUNT_DIR that the `ccltune-unpack` init container fills from the ConfigMaps (projected at
    PACKED_DIR, for it only). Plans with a tuner table: the same init container also copies
    ccltune's tuner plugin into an emptyDir mounted at TUNER_PLUGIN_DIR. User env wins: a
    variable the container already sets is left alone. Running it on its own output changes
    nothing.
    """
    cfg = cfg or OperatorConfig()
    items: list[dict[str, Any]] = manifest["items"]
    packed = is_packed(items)
    plugin = any(i["path"] == TUNER_TABLE for i in items)
    spec = pod.get("spec") or {}
    ours = {VOLUME, PACKED_VOLUME, PLUGIN_VOLUME}
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") not in ours]
    init = [c for c in spec.get("initContainers") or [] if c.get("name") != UNPACK_CONTAINER]
    if packed:
        # Each entry at its own key: the init container's index names entries by key.
        volumes += [{"name": VOLUME, "emptyDir": {}}, _projected(PACKED_VOLUME, items, "key")]
    else:
        volumes.append(_projected(VOLUME, items, "path"))
    if plugin:
        volumes.append({"name": PLUGIN_VOLUME, "emptyDir": {}})
    if packed or plugin:
        init = [_unpack_container(spec, items, cfg, packed=packed, plugin=plugin), *init]
    # injection_env only looks at paths; the content lives in the ConfigMaps.
    env = injection_env([PlanFile(path=i["path"], content="", digest="") for i in items], MOUNT_DIR)
    containers = []
    for container in spec.get("containers") or []:
        c = copy.deepcopy(container)
        have = {e.get("name") for e in c.get("env") or []}
        extra = [{"name": k, "value": v} for k, v in sorted(env.items()) if k not in have]
        if extra:
            c["env"] = list(c.get("env") or []) + extra
        mounts = c.get("volumeMounts") or []
        if not any(m.get("name") == VOLUME or m.get("mountPath") == MOUNT_DIR for m in mounts):
            mounts = c["volumeMounts"] = [*mounts, {"name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": True}]
        if plugin and not any(m.get("name") == PLUGIN_VOLUME or m.get("mountPath") == TUNER_PLUGIN_DIR
                              for m in mounts):  # fmt: skip
            c["volumeMounts"] = [*mounts, {"name": PLUGIN_VOLUME, "mountPath": TUNER_PLUGIN_DIR, "readOnly": True}]
        containers.append(c)
    annotations = {ANNOTATION_DIGEST: manifest["digest"], ANNOTATION_TUNING: tuning}
    desired_spec: dict[str, Any] = {"volumes": volumes, "containers": containers}
    if packed or plugin or init != (spec.get("initContainers") or []):  # plain plans: as before
        desired_spec["initContainers"] = init
    return {"metadata": {"annotations": annotations}, "spec": desired_spec}


def _projected(name: str, items: list[dict[str, Any]], path_field: str) -> dict[str, Any]:
    """The content ConfigMaps as one projected volume; each key at its item's `path_field`."""
    by_cm: dict[str, list[dict[str, str]]] = {}
    for item in items:
        by_cm.setdefault(item["configMap"], []).append(
            {"key": item["key"], "path": item[path_field]})
    return {"name": name, "projected": {"defaultMode": 0o444, "sources": [
        {"configMap": {"name": cm, "items": sorted(entries, key=lambda e: e["path"])}}
        for cm, entries in sorted(by_cm.items())
    ]}}


def _unpack_container(spec: dict[str, Any], items: list[dict[str, Any]], cfg: OperatorConfig, *,
                      packed: bool = True, plugin: bool = False) -> dict[str, Any]:
    """Unpacks packed plan files into VOLUME and/or copies the tuner plugin into PLUGIN_VOLUME."""
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # Training pods often run as root: then ours runs as the image's user. Otherwise leave the
    # uid to the pod (or the platform, e.g. OpenShift's assigned range).
    if (spec.get("securityContext") or {}).get("runAsUser") == 0:
        security["runAsUser"] = UNPACK_UID
    unpack = ["ccltune", "unpack", "--from", PACKED_DIR, "--to", MOUNT_DIR, "--items", index_arg(items)]
    copy_plugin = ["cp", IMAGE_PLUGIN, TUNER_PLUGIN_PATH]
    if packed and plugin:  # both, no quoting: the paths and the unpack command are sh's arguments
        command = ["sh", "-c", 'cp "$1" "$2" && shift 2 && exec "$@"', "sh", IMAGE_PLUGIN, TUNER_PLUGIN_PATH,
                   *unpack]
    else:
        command = unpack if packed else copy_plugin
    mounts = [
        {"name": PACKED_VOLUME, "mountPath": PACKED_DIR, "readOnly": True},
        {"name": VOLUME, "mountPath": MOUNT_DIR},
    ] if packed else []
    if plugin:
        mounts.append({"name": PLUGIN_VOLUME, "mountPath": TUNER_PLUGIN_DIR})
    container = {
        "name": UNPACK_CONTAINER,
        "image": cfg.unpack_image or cfg.agent_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": command,
        "resources": copy.deepcopy(cfg.unpack_resources),
        "securityContext": security,
        "terminationMessagePolicy": "FallbackToLogsOnError",  # its one-line error in the status
        "volumeMounts": mounts,
    }
    # Keep ours as the API server returned it (with its defaults) when nothing we set differs.
    for have in spec.get("initContainers") or []:
        if have.get("name") == UNPACK_CONTAINER and all(have.get(k) == v for k, v in container.items()):
            return have
    return container


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
