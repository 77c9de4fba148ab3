"""What a real API server checks before it stores a write, for the KMock harness (ctl_harness.py).

KMock stores whatever it is sent; a real cluster refuses a lot of it, and the operator must cope
with those refusals. `Validator.check(kind, new, old)` returns the causes a real API server would
give for the object that a create or update would store:

* object names: an RFC 1123 subdomain (<= 253) for most kinds; an RFC 1123 label (<= 63) for
  Namespaces and Jobs (a Job's name becomes a label on its pods);
* labels: keys `[prefix/]name` (prefix a subdomain <= 253, name <= 63), values <= 63 characters,
  alphanumeric at both ends with `-_.` inside; annotations at most 256 KiB in total;
* ConfigMaps: keys `[-._a-zA-Z0-9]+`, data plus binaryData at most 1 MiB; once `immutable` is
  true, data, binaryData and `immutable` itself cannot change;
* custom resources: the CRD's structural schema (crds/*.yaml, as jsonschema) and its CEL rules
  (`x-kubernetes-validations`, evaluated with cel-python: `self` at each schema node, `oldSelf`
  on updates for transition rules).

Limits as the Kubernetes API documents them (https://kubernetes.io/docs/concepts/overview/
working-with-objects/names/, .../labels/, https://kubernetes.io/docs/concepts/configuration/
configmap/). The harness answers 422 Invalid with these causes (413 for a request body over the
API server's 3 MiB limit), in the shape of a metav1.Status.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

MAX_NAME = 253
MAX_LABEL = 63
MAX_ANNOTATIONS = 256 * 1024
MAX_CONFIGMAP = 1024 * 1024
MAX_REQUEST = 3 * 1024 * 1024
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_TEXT = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
LABEL_NAMED = {"Namespace", "Job"}


@dataclass(frozen=True)
class Cause:
    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def wire(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


def _invalid(field: str, value: Any, why: str) -> Cause:
    return Cause(field, f"Invalid value: {json.dumps(value)[:200]}: {why}")


def check_name(kind: str, name: Any) -> list[Cause]:
    if not isinstance(name, str) or not name:
        return [Cause("metadata.name", "Required value: name or generateName is required",
                      "FieldValueRequired")]
    if kind in LABEL_NAMED:
        if len(name) > MAX_LABEL or not DNS_LABEL.fullmatch(name):
            return [_invalid("metadata.name", name, f"must be an RFC 1123 label of at most {MAX_LABEL} "
                             "lowercase alphanumerics or '-', alphanumeric at both ends")]
        return []
    if len(name) > MAX_NAME or not SUBDOMAIN.fullmatch(name):
        return [_invalid("metadata.name", name, f"must be an RFC 1123 subdomain of at most {MAX_NAME} "
                         "lowercase alphanumerics, '-' or '.', alphanumeric at both ends")]
    return []


def check_labels(labels: Any, field: str = "metadata.labels") -> list[Cause]:
    causes: list[Cause] = []
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > MAX_NAME or not SUBDOMAIN.fullmatch(prefix)):
            causes.append(_invalid(field, key, "a label key's prefix must be an RFC 1123 subdomain"))
        if len(name) > MAX_LABEL or not LABEL_TEXT.fullmatch(name):
            causes.append(_invalid(field, key, f"a label key's name must be at most {MAX_LABEL} "
                                   "characters, alphanumeric at both ends, '-_.' inside"))
        if not isinstance(value, str) or len(value) > MAX_LABEL or (value and not LABEL_TEXT.fullmatch(value)):
            causes.append(_invalid(f"{field}", value, f"a label value must be at most {MAX_LABEL} "
                                   "characters, empty or alphanumeric at both ends, '-_.' inside"))
    return causes


def check_annotations(annotations: Any) -> list[Cause]:
    total = sum(len(k) + len(str(v)) for k, v in (annotations or {}).items())
    if total > MAX_ANNOTATIONS:
        return [Cause("metadata.annotations", f"Too long: may not be more than {MAX_ANNOTATIONS} "
                      f"bytes (got {total})", "FieldValueTooLong")]
    return []


def configmap_bytes(cm: dict[str, Any]) -> int:
    data = sum(len(k) + len(str(v).encode()) for k, v in (cm.get("data") or {}).items())
    binary = sum(len(k) + len(base64.b64decode(v)) for k, v in (cm.get("binaryData") or {}).items())
    return data + binary


def check_configmap(new: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    causes: list[Cause] = []
    for field in ("data", "binaryData"):
        for key in new.get(field) or {}:
            if len(key) > MAX_NAME or not CONFIG_KEY.fullmatch(key):
                causes.append(_invalid(f"{field}[{key}]", key, "a ConfigMap key must be made of "
                                       "alphanumerics, '-', '_' or '.'"))
    size = configmap_bytes(new)
    if size > MAX_CONFIGMAP:
        causes.append(Cause("", f"Too long: must have at most {MAX_CONFIGMAP} bytes (got {size})",
                            "FieldValueTooLong"))
    if old is not None and old.get("immutable"):
        for field in ("data", "binaryData", "immutable"):
            if (new.get(field) or None) != (old.get(field) or None):
                causes.append(Cause(field, "Forbidden: field is immutable when `immutable` is set",
                                    "FieldValueForbidden"))
    return causes


# -- custom resources ---------------------------------------------------------------------------

Path_ = tuple[str, ...]  # property names; "[]" = every list item, "{}" = every map value


@dataclass(frozen=True)
class _Rule:
    path: Path_
    rule: str
    message: str
    program: Any


def _rules(schema: dict[str, Any], env: celpy.Environment, path: Path_ = ()) -> Iterator[_Rule]:
    for v in schema.get("x-kubernetes-validations", []):
        yield _Rule(path, v["rule"], v.get("message", v["rule"]), env.program(env.compile(v["rule"])))
    for name, sub in (schema.get("properties") or {}).items():
        yield from _rules(sub, env, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from _rules(schema["items"], env, (*path, "[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _rules(schema["additionalProperties"], env, (*path, "{}"))


def _values_at(obj: Any, path: Path_) -> Iterator[tuple[list[str], Any]]:
    if not path:
        yield [], obj
        return
    head, rest = path[0], path[1:]
    if head == "[]" and isinstance(obj, list):
        for i, item in enumerate(obj):
            for sub, v in _values_at(item, rest):
                yield [f"[{i}]", *sub], v
    elif head == "{}" and isinstance(obj, dict):
        for k, item in obj.items():
            for sub, v in _values_at(item, rest):
                yield [f"[{k}]", *sub], v
    elif isinstance(obj, dict) and head in obj:
        for sub, v in _values_at(obj[head], rest):
            yield [f".{head}", *sub], v


def _old_at(old: Any, concrete: list[str]) -> tuple[bool, Any]:
    for step in concrete:
        key = step[1:] if step.startswith(".") else step[1:-1]
        if isinstance(old, list):
            if not key.isdigit() or int(key) >= len(old):
                return False, None
            old = old[int(key)]
        elif isinstance(old, dict) and key in old:
            old = old[key]
        else:
            return False, None
    return True, old


class CustomResource:
    """One served version of a CRD: its structural schema and CEL rules."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.validator = jsonschema.Draft7Validator(schema)
        self.rules = list(_rules(schema, celpy.Environment()))

    def check(self, new: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
        causes = []
        for err in self.validator.iter_errors(new):
            field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
            causes.append(_invalid(field.lstrip("."), err.instance if not isinstance(err.instance, dict | list)
                                   else "object", err.message.split("\n")[0][:300]))
        if causes:
            return causes  # CEL runs only on structurally valid objects
        for rule in self.rules:
            for concrete, value in _values_at(new, rule.path):
                act = {"self": celpy.json_to_cel(value)}
                if "oldSelf" in rule.rule:
                    found, old_value = _old_at(old, concrete) if old is not None else (False, None)
                    if not found:
                        continue
                    act["oldSelf"] = celpy.json_to_cel(old_value)
                if not bool(rule.program.evaluate(act)):
                    field = "".join(concrete).lstrip(".") or "<root>"
                    causes.append(_invalid(field, value if not isinstance(value, dict | list) else "object",
                                           rule.message))
        return causes


def load_crds(paths: list[Path]) -> dict[tuple[str, str], CustomResource]:
    """(group/version, plural) -> its validator, for every served version in the CRD files."""
    out = {}
    for path in paths:
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            out[(f"{spec['group']}/{version['name']}", spec["names"]["plural"])] = CustomResource(schema)
    return out


class Validator:
    def __init__(self, crds: dict[tuple[str, str], CustomResource] | None = None) -> None:
        self.crds = dict(crds or {})

    def check(self, kind: str, api_version: str, plural: str, new: dict[str, Any],
              old: dict[str, Any] | None) -> list[Cause]:
        meta = new.get("metadata") or {}
        causes = check_name(kind, meta.get("name"))
        causes += check_labels(meta.get("labels"))
        causes += check_annotations(meta.get("annotations"))
        if kind == "ConfigMap":
            causes += check_configmap(new, old)
        crd = self.crds.get((api_version, plural))
        if crd is not None:
            causes += crd.check(new, old)
        return causes


def status_body(kind: str, name: str, causes: list[Cause]) -> dict[str, Any]:
    """A metav1.Status for 422 Invalid, as the API server answers a failed validation."""
    text = "; ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": 422,
            "reason": "Invalid", "message": f'{kind} "{name}" is invalid: {text}',
            "details": {"name": name, "kind": kind, "causes": [c.wire() for c in causes]}}
