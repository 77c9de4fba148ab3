"""Every rendered manifest, CRDs included, validates in strict mode against a pinned Kubernetes."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kv_utils
import pytest

from .chart import KUBE_VERSION, KUBE_VERSIONS, Rendered

# Kinds from other projects' CRDs, which kubernetes-validate does not know. Checked against the
# part of their published schemas the chart uses (cert-manager.io/v1 API reference,
# prometheus-operator monitoring.coreos.com/v1 API reference); unknown fields are rejected.
_ISSUER_REF = {"type": "object", "required": ["name"], "additionalProperties": False,
               "properties": {"name": {"type": "string"}, "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                              "group": {"type": "string"}}}
_THIRD_PARTY: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Issuer"): {
        "type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
        "properties": {"selfSigned": {"type": "object"},
                       "ca": {"type": "object", "required": ["secretName"],
                              "properties": {"secretName": {"type": "string"}}}},
    },
    ("cert-manager.io/v1", "Certificate"): {
        "type": "object", "required": ["secretName", "issuerRef"], "additionalProperties": False,
        "properties": {
            "secretName": {"type": "string"}, "commonName": {"type": "string", "maxLength": 64},
            "dnsNames": {"type": "array", "items": {"type": "string"}}, "isCA": {"type": "boolean"},
            "duration": {"type": "string"}, "renewBefore": {"type": "string"},
            "usages": {"type": "array", "items": {"enum": ["server auth", "client auth", "digital signature",
                                                            "key encipherment", "cert sign"]}},
            "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]}, "size": {"type": "integer"},
                "rotationPolicy": {"enum": ["Never", "Always"]}}},
            "issuerRef": _ISSUER_REF,
        },
    },
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
        "properties": {"selector": {"type": "object"}, "endpoints": {"type": "array", "items": {
            "type": "object", "properties": {"port": {"type": "string"}, "interval": {"type": "string"}}}}},
    },
}


# kubernetes-validate re-reads its (multi-MB) schema files on every call; they never change
# within a run, and jsonschema does not mutate them, so read each once.
kv_utils.schema_contents = functools.lru_cache(maxsize=None)(kv_utils.schema_contents)


def _name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_manifest_validates_strictly(rendered: Rendered, kube_version: str) -> None:
    errors = []
    for doc in rendered.docs:
        third_party = _THIRD_PARTY.get((doc["apiVersion"], doc["kind"]))
        try:
            if third_party is not None:
                jsonschema.validate(doc["spec"], third_party)
            else:
                kubernetes_validate.validate(doc, kube_version, strict=True)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{_name(doc)}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{_name(doc)}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_validator_is_strict() -> None:
    """Guard against a validator that accepts anything: a typo'd field must fail."""
    bad = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"},
           "automountServiceAcountToken": True}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)
