"""A small RBAC authorizer over rendered Roles/Bindings, for the recorded API requests.

Semantics follow Kubernetes RBAC (https://kubernetes.io/docs/reference/access-authn-authz/rbac/):
rules only add permissions; a RoleBinding grants its role's rules in its own namespace only; a
ClusterRoleBinding grants them everywhere and for cluster-scoped resources; a subresource is
matched as "resource/subresource"; resourceNames restrict get/update/patch/delete to names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ANY_NAMESPACE = "*"


@dataclass(frozen=True)
class Request:
    identity: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str  # "" for cluster-scoped requests and all-namespace list/watch
    name: str = ""

    @property
    def target(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " (cluster-wide)"
        return f"{self.identity}: {self.verb} {self.group or 'core'}/{self.target}{where}"


@dataclass(frozen=True)
class Atom:
    """One (role, namespace scope, group, resource, verb) permission a rendered rule grants."""

    role: str
    scope: str  # a namespace, or ANY_NAMESPACE for cluster-wide grants
    group: str
    resource: str
    verb: str
    names: tuple[str, ...] = ()

    def allows(self, req: Request) -> bool:
        if self.scope != ANY_NAMESPACE and req.namespace != self.scope:
            return False
        if self.names and (req.verb in ("list", "watch", "create", "deletecollection")
                           or req.name not in self.names):
            return False
        return (self.group, self.resource, self.verb) == (req.group, req.target, req.verb)

    def __str__(self) -> str:
        where = "cluster-wide" if self.scope == ANY_NAMESPACE else f"in {self.scope}"
        return f"{self.role}: {self.verb} {self.group or 'core'}/{self.resource} {where}"


def _rules_by_role(docs: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in docs:
        if d["kind"] in ("ClusterRole", "Role"):
            out[(d["kind"], d["metadata"]["name"])] = d.get("rules") or []
    return out


def grants(docs: list[dict[str, Any]], sa_name: str, sa_namespace: str) -> list[Atom]:
    """Every permission atom bound to the ServiceAccount."""
    roles = _rules_by_role(docs)
    atoms: list[Atom] = []
    for b in docs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s["name"] == sa_name
                   and s.get("namespace") == sa_namespace for s in b.get("subjects") or []):
            continue
        ref = b["roleRef"]
        rules = roles.get((ref["kind"], ref["name"]))
        assert rules is not None, f"{b['kind']} {b['metadata']['name']} refers to a missing {ref}"
        scope = ANY_NAMESPACE if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        for rule in rules:
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule["verbs"]:
                        atoms.append(Atom(ref["name"], scope, group, resource, verb,
                                          tuple(rule.get("resourceNames") or ())))
    return atoms


def request_from_record(rec: dict[str, Any]) -> Request:
    """A record of tests/controller/harness.py's API log (identity, verb, group, resource...)."""
    parts = rec.get("path", "").strip("/").split("/")
    name = ""
    plural = rec["resource"]
    if plural in parts:
        i = parts.index(plural)
        if i + 1 < len(parts):
            name = parts[i + 1]
    return Request(rec["identity"], rec["verb"], rec.get("group") or "", plural,
                   rec.get("subresource") or "", rec.get("namespace") or "", name)
