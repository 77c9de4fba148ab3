"""The CRDs' CEL rules (x-kubernetes-validations), evaluated with cel-python the way the API
server applies them: at each schema node, with `self` bound to the value there and `oldSelf` to
the previous value on updates (transition rules only run when an old value exists).
Examples are also checked against the structural schema, so a rejection can only come from CEL,
and against the pydantic models, so the CRD and the Python API agree."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import celpy
import jsonschema
import pydantic
import pytest
import yaml

from ccltune.api.ccltuning import CCLTuning
from ccltune.api.nodetopology import NodeTopology

from .chart import CHART
from .helm_binary import REPO_ROOT

Path_ = tuple[str, ...]  # property names; "[]" = every list item, "{}" = every map value


@dataclass(frozen=True)
class Rule:
    crd: str
    path: Path_
    rule: str
    message: str

    @property
    def transition(self) -> bool:
        return "oldSelf" in self.rule

    def __str__(self) -> str:
        return f"{self.crd}:{'.'.join(self.path) or '<root>'}: {self.rule}"


def _rules(crd: str, schema: dict[str, Any], path: Path_ = ()) -> Iterator[Rule]:
    for v in schema.get("x-kubernetes-validations", []):
        yield Rule(crd, path, v["rule"], v.get("message", v["rule"]))
    for name, sub in schema.get("properties", {}).items():
        yield from _rules(crd, sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from _rules(crd, schema["items"], (*path, "[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _rules(crd, schema["additionalProperties"], (*path, "{}"))


def _load_crds() -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(p.read_text())
        out[crd["spec"]["names"]["kind"]] = crd
    return out


CRDS = _load_crds()


def _schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


RULES = [r for kind in CRDS for r in _rules(kind, _schema(kind))]
_ENV = celpy.Environment()
_PROGRAMS = {r.rule: _ENV.program(_ENV.compile(r.rule)) for r in RULES}


def _values_at(obj: Any, path: Path_) -> Iterator[tuple[Path_, Any]]:
    """(concrete path, value) for every value the schema path reaches in obj."""
    if not path:
        yield (), obj
        return
    head, rest = path[0], path[1:]
    if head == "[]" and isinstance(obj, list):
        for i, item in enumerate(obj):
            for sub, v in _values_at(item, rest):
                yield (str(i), *sub), v
    elif head == "{}" and isinstance(obj, dict):
        for k, item in obj.items():
            for sub, v in _values_at(item, rest):
                yield (k, *sub), v
    elif isinstance(obj, dict) and head in obj:
        for sub, v in _values_at(obj[head], rest):
            yield (head, *sub), v


def _get(obj: Any, concrete: Path_) -> tuple[bool, Any]:
    for key in concrete:
        if isinstance(obj, list):
            idx = int(key)
            if idx >= len(obj):
                return False, None
            obj = obj[idx]
        elif isinstance(obj, dict) and key in obj:
            obj = obj[key]
        else:
            return False, None
    return True, obj


def evaluate(kind: str, new: dict[str, Any], old: dict[str, Any] | None = None
             ) -> tuple[list[str], set[tuple[Rule, bool]]]:
    """Messages of failed rules, and which rules ran with which outcome (for coverage)."""
    failed: list[str] = []
    ran: set[tuple[Rule, bool]] = set()
    for rule in (r for r in RULES if r.crd == kind):
        for concrete, value in _values_at(new, rule.path):
            act = {"self": celpy.json_to_cel(value)}
            if rule.transition:
                if old is None:
                    continue
                found, old_value = _get(old, concrete)
                if not found:
                    continue
                act["oldSelf"] = celpy.json_to_cel(old_value)
            result = _PROGRAMS[rule.rule].evaluate(act)
            assert isinstance(result, celpy.celtypes.BoolType), f"{rule}: evaluated to {result!r}"
            ok = bool(result)
            ran.add((rule, ok))
            if not ok:
                failed.append(rule.message)
    return failed, ran


# --- examples --------------------------------------------------------------------------------

def _tuning() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples" / "ccltuning.yaml").read_text())
    return doc


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *parents, leaf = path.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return out


_DELETE = object()

NODE = {
    "apiVersion": "ccltune.io/v1alpha1", "kind": "NodeTopology",
    "metadata": {"name": "gpu-node-1"},
    "spec": {
        "nodeName": "gpu-node-1", "agentVersion": "0.1.0",
        "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3",
                  "pciBusId": "0000:18:00.0", "numaNode": 0}],
        "nics": [{"name": "mlx5_0", "pciBusId": "0000:19:00.0",
                  "ports": [{"port": 1, "rateGbps": 400, "state": "ACTIVE", "linkLayer": "InfiniBand"}]}],
    },
}

# (name, kind, new, old or None, expected failure messages)
CASES: list[tuple[str, str, dict[str, Any], dict[str, Any] | None, list[str]]] = [
    ("example-as-shipped", "CCLTuning", _tuning(), None, []),
    ("parallelism-only", "CCLTuning",
     _with(_with(_tuning(), "spec.collectives", _DELETE), "spec.parallelism", {"tp": 8, "dp": 4}),
     None, []),
    ("replay-with-configmap", "CCLTuning",
     _with(_tuning(), "spec.tuning", {"enabled": True, "profiler": "replay",
                                      "replayConfigMap": "nccl-sweep"}), None, []),
    ("nothing-to-plan", "CCLTuning", _with(_tuning(), "spec.collectives", _DELETE), None,
     ["spec needs collectives or parallelism to know what to plan"]),
    ("empty-collectives", "CCLTuning", _with(_tuning(), "spec.collectives", []), None,
     ["spec needs collectives or parallelism to know what to plan"]),
    ("replay-without-configmap", "CCLTuning",
     _with(_tuning(), "spec.tuning", {"enabled": True, "profiler": "replay"}), None,
     ["tuning.replayConfigMap is required when tuning.profiler is replay"]),
    ("max-bytes-at-limit", "CCLTuning",
     _with(_tuning(), "spec.collectives", [{"op": "allreduce", "minBytes": "0.015625T", "maxBytes": "16G"}]),
     None, []),
    ("max-bytes-1T", "CCLTuning",
     _with(_tuning(), "spec.collectives", [{"op": "allreduce", "maxBytes": "1T"}]), None,
     ["maxBytes must be at most 16G (the largest single collective ccltune plans for)"]),
    ("min-bytes-huge", "CCLTuning",
     _with(_tuning(), "spec.collectives", [{"op": "allreduce", "minBytes": "999999999999999T",
                                            "maxBytes": "999999999999999T"}]), None,
     ["minBytes must be at most 16G (the largest single collective ccltune plans for)",
      "maxBytes must be at most 16G (the largest single collective ccltune plans for)"]),
    ("node-create", "NodeTopology", NODE, None, []),
    ("node-update-same-name", "NodeTopology", _with(NODE, "spec.agentVersion", "0.2.0"), NODE, []),
    ("node-rename", "NodeTopology", _with(NODE, "spec.nodeName", "gpu-node-2"), NODE,
     ["spec.nodeName is immutable"]),
]
MODELS: dict[str, type[pydantic.BaseModel]] = {"CCLTuning": CCLTuning, "NodeTopology": NodeTopology}


@pytest.mark.parametrize(("name", "kind", "new", "old", "expected"), CASES, ids=[c[0] for c in CASES])
def test_cel_rules(name: str, kind: str, new: dict[str, Any], old: dict[str, Any] | None,
                   expected: list[str]) -> None:
    jsonschema.validate(new, _schema(kind))  # structurally valid: only CEL may reject it
    failed, _ = evaluate(kind, new, old)
    assert sorted(failed) == sorted(expected)


@pytest.mark.parametrize(("name", "kind", "new", "old", "expected"),
                         [c for c in CASES if c[3] is None], ids=[c[0] for c in CASES if c[3] is None])
def test_models_agree_with_cel(name: str, kind: str, new: dict[str, Any], old: Any,
                               expected: list[str]) -> None:
    body = {k: v for k, v in new.items() if k in ("spec", "status")}
    if not expected:
        MODELS[kind].model_validate(body)
        return
    with pytest.raises(pydantic.ValidationError) as err:
        MODELS[kind].model_validate(body)
    assert all(m in str(err.value) for m in expected), str(err.value)


def test_every_rule_is_exercised_both_ways() -> None:
    """A CEL rule added to the CRDs needs a passing and a failing example above."""
    assert RULES, "the CRDs carry no CEL rules at all"
    seen: set[tuple[Rule, bool]] = set()
    for _name, kind, new, old, _exp in CASES:
        seen |= evaluate(kind, new, old)[1]
    missing = [f"{r} ({'pass' if ok else 'fail'})" for r in RULES for ok in (True, False)
               if (r, ok) not in seen]
    assert not missing, "CEL rules without examples:\n" + "\n".join(missing)
