"""CustomResourceDefinitions generated from the pydantic models (structural OpenAPI v3 schemas)."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from .ccltuning import CCLTuning
from .common import API_GROUP, API_VERSION
from .nodetopology import NodeTopology

_DROP = {"title", "default", "examples", "propertyNames"}
_MAX_MAP_ENTRIES = 64  # bounds CEL cost estimates over maps


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline $refs, collapse Optional, drop keys Kubernetes' structural schemas reject."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {**copy.deepcopy(target), **{k: v for k, v in schema.items() if k != "$ref"}}
        return _structural(merged, defs)
    any_of = schema.get("anyOf")
    if any_of is not None:
        options = [s for s in any_of if s.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in schema.items() if k != "anyOf"}
            return _structural({**options[0], **rest}, defs)
        raise ValueError(f"cannot express a union in a structural schema: {any_of}")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]  # structural schemas prune unknown fields anyway
    elif isinstance(out.get("additionalProperties"), dict):
        out.setdefault("maxProperties", _MAX_MAP_ENTRIES)
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    return _structural(raw, raw.get("$defs", {}))


def _object_schema(model: type[BaseModel]) -> dict[str, Any]:
    body = openapi_schema(model)
    props = body.get("properties", {})
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            **props,
        },
        "required": ["spec"],
    }


def _crd(
    model: type[BaseModel],
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    scope: str,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["ccltune"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": _object_schema(model)},
                }
            ],
        },
    }


def _condition_column(name: str, condition: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{condition}")].status',
    }


_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD manifest."""
    ccltuning = _crd(
        CCLTuning,
        kind="CCLTuning",
        plural=CCLTuning.PLURAL,
        short_names=["cclt"],
        scope="Namespaced",
        columns=[
            _condition_column("Ready", "Ready"),
            {"name": "GPUs", "type": "integer", "jsonPath": ".status.topology.gpus"},
            {"name": "Speedup", "type": "string", "jsonPath": ".status.speedup"},
            _AGE,
        ],
    )
    nodetopology = _crd(
        NodeTopology,
        kind="NodeTopology",
        plural=NodeTopology.PLURAL,
        short_names=["ntopo"],
        scope="Cluster",
        columns=[
            {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName"},
            {"name": "GPU", "type": "string", "jsonPath": ".spec.gpus[0].name"},
            _condition_column("Degraded", "Degraded"),
            {"name": "Probed", "type": "date", "jsonPath": ".spec.probedAt"},
            _AGE,
        ],
    )
    return {
        f"{CCLTuning.PLURAL}.{API_GROUP}.yaml": ccltuning,
        f"{NodeTopology.PLURAL}.{API_GROUP}.yaml": nodetopology,
    }
