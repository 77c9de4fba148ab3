"""Least privilege, checked both ways against what ccltune really calls.

The operator's end-to-end tests run the operator, agents and plan Jobs against the KMock emulator,
which records every API request with the caller's identity (tests/controller/harness.py) into
tests/controller/artifacts/api-requests.json (committed; or $CCLTUNE_API_LOG). A full test run
refreshes it before these tests read it (tests/controller sorts before tests/helm).

1. Every recorded request is allowed by the rendered RBAC of the caller's ServiceAccount.
2. Every permission the chart grants is used by some recorded request, or is listed in
   DOCUMENTED below with the reason no end-to-end test exercises it.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

import pytest

from .chart import NAMESPACE, VALUES_FILES, Rendered, render_cached
from .helm_binary import REPO_ROOT
from .rbac import Atom, Request, grants, request_from_record

LIVE_LOG = Path(os.environ.get("CCLTUNE_API_LOG")
                or REPO_ROOT / "tests" / "controller" / "artifacts" / "api-requests.json")
# Recorded identity -> chart component whose ServiceAccount it runs as.
COMPONENTS = {"operator": "operator", "agent": "agent", "plan-job": "jobs"}
# CCLTUNE_NAMESPACE in tests/controller/harness.operator_env; the chart's is the release namespace.
RECORDED_NAMESPACE = "ccltune-system"

# (component, apiGroup, resource, verb) -> why it is granted though no e2e request uses it.
DOCUMENTED: dict[tuple[str, str, str, str], str] = {
    ("operator", "ccltune.io", "nodetopologies", "list"):
        "reconcile lists all reports when a CCLTuning targets more than 64 nodes (e2e uses 2), "
        "and kopf lists before it watches",
    ("operator", "", "namespaces", "list"):
        "operator.watchNamespaces: kopf lists namespaces to match its --namespace patterns",
    ("operator", "", "namespaces", "watch"):
        "operator.watchNamespaces: kopf follows namespaces created after start",
    ("operator", "ccltune.io", "ccltunings/finalizers", "update"):
        "rbac.ownerReferencesPermissionEnforcement: blockOwnerDeletion on published ConfigMaps",
    ("operator", "batch", "jobs/finalizers", "update"):
        "rbac.ownerReferencesPermissionEnforcement: blockOwnerDeletion on input ConfigMaps",
    ("jobs", "", "configmaps", "delete"):
        "rbac.ownerReferencesPermissionEnforcement: only deleters may set ownerReferences",
    ("jobs", "batch", "jobs/finalizers", "update"):
        "rbac.ownerReferencesPermissionEnforcement: blockOwnerDeletion on the result ConfigMap",
}


def _logs() -> list[str]:
    """The recording a run just wrote, plus the committed one (read with `git show`): a partial
    run (`pytest -k ...`) rewrites the file with a subset of the calls, which alone would make
    rules look unused."""
    texts = [LIVE_LOG.read_text()] if LIVE_LOG.exists() else []
    try:
        rel = LIVE_LOG.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:  # $CCLTUNE_API_LOG outside the repository
        rel = ""
    if rel:
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"HEAD:{rel}"],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            texts.append(proc.stdout)
    assert texts, (
        f"{LIVE_LOG} is missing: run `.venv/bin/pytest tests/controller/test_controller_e2e.py` "
        "to record the API requests the RBAC is checked against")
    return texts


@cache
def recorded() -> tuple[Request, ...]:
    records = []
    for text in _logs():
        loaded = json.loads(text)
        assert isinstance(loaded, list) and loaded, f"{LIVE_LOG}: expected a non-empty JSON list"
        records += loaded
    out = set()
    for rec in records:
        req = request_from_record(rec)
        if req.namespace == RECORDED_NAMESPACE:
            req = Request(req.identity, req.verb, req.group, req.resource, req.subresource,
                          NAMESPACE, req.name)
        out.add(req)
    return tuple(sorted(out, key=str))


def _sa_names(r: Rendered) -> dict[str, str]:
    """component -> ServiceAccount name, as the pods (and the operator's config) use them."""
    from .test_helm_config import operator_config

    cfg = operator_config(r)
    dep = r.one("Deployment", "-operator")
    return {"operator": dep["spec"]["template"]["spec"]["serviceAccountName"],
            "agent": cfg.agent_service_account, "jobs": cfg.job_service_account}


# Cluster-scoped kinds in the recording; every other resource is namespaced.
CLUSTER_SCOPED = {"nodes", "namespaces", "nodetopologies", "customresourcedefinitions"}
# Cluster-wide lists the operator's own code makes in any mode (daemonset.sync lists every
# CCLTuning); other cluster-wide list/watch calls are kopf's watches, which kopf makes per
# namespace when it runs with --namespace.
OPERATOR_CLUSTER_LISTS = {("ccltune.io", "ccltunings", "list")}


def _in_scope(r: Rendered, reqs: tuple[Request, ...]) -> list[Request]:
    """The recording ran with --all-namespaces; in namespaced mode (operator.watchNamespaces) the
    same work happens in a watched namespace instead of the test's own namespaces."""
    watched = r.values_merged()["operator"]["watchNamespaces"]
    if not watched:
        return list(reqs)
    out = []
    for req in reqs:
        if req.resource in CLUSTER_SCOPED or req.namespace == NAMESPACE:
            out.append(req)
            continue
        if not req.namespace and (req.group, req.resource, req.verb) in OPERATOR_CLUSTER_LISTS:
            out.append(req)
        namespaces = [watched[0], NAMESPACE] if not req.namespace else [watched[0]]
        out += [Request(req.identity, req.verb, req.group, req.resource, req.subresource, ns,
                        req.name) for ns in namespaces]
    return out


def _grants(r: Rendered) -> dict[str, list[Atom]]:
    return {comp: grants(r.docs, sa, NAMESPACE) for comp, sa in _sa_names(r).items()}


def test_every_recorded_request_is_allowed(rendered: Rendered) -> None:
    by_component = _grants(rendered)
    denied = []
    for req in _in_scope(rendered, recorded()):
        component = COMPONENTS.get(req.identity)
        if component is None:
            denied.append(f"{req}  <- unknown identity (unauthenticated?)")
            continue
        if not any(a.allows(req) for a in by_component[component]):
            denied.append(str(req))
    assert not denied, "requests the chart's RBAC would deny:\n" + "\n".join(denied)


def test_every_rule_is_used_or_documented(rendered: Rendered) -> None:
    """A rule is used when some request goes through it in any namespace its role is bound in."""
    reqs = _in_scope(rendered, recorded())
    unused = []
    for component, atoms in _grants(rendered).items():
        mine = [r for r in reqs if COMPONENTS.get(r.identity) == component]
        rules: dict[tuple[str, str, str, str], list[Atom]] = {}
        for atom in atoms:
            rules.setdefault((atom.role, atom.group, atom.resource, atom.verb), []).append(atom)
        for (role, group, resource, verb), bound in rules.items():
            if any(a.allows(r) for a in bound for r in mine):
                continue
            if (component, group, resource, verb) in DOCUMENTED:
                continue
            unused.append(f"{role}: {verb} {group or 'core'}/{resource}")
    assert not unused, ("granted but never requested in the end-to-end tests; remove the rule or "
                        "add it to DOCUMENTED with the reason:\n" + "\n".join(unused))


def test_documented_rules_exist(helm: Path) -> None:
    """A DOCUMENTED entry whose rule left the chart is stale."""
    atoms: set[tuple[str, str, str, str]] = set()
    for values in VALUES_FILES:
        r = render_cached(helm, values)
        for component, granted in _grants(r).items():
            atoms |= {(component, a.group, a.resource, a.verb) for a in granted}
    stale = sorted(set(DOCUMENTED) - atoms)
    assert not stale, f"DOCUMENTED lists rules no values file renders: {stale}"


def test_release_namespace_rules_stay_there(rendered: Rendered) -> None:
    """Writes to the agent DaemonSet and Jobs are only granted in the release namespace."""
    for component, atoms in _grants(rendered).items():
        for a in atoms:
            if a.resource in ("daemonsets", "jobs") and a.verb not in ("list", "watch"):
                assert a.scope == NAMESPACE, f"{component}: {a}"


@pytest.mark.parametrize(
    "req",
    [
        Request("agent", "delete", "ccltune.io", "nodetopologies", "", ""),
        Request("agent", "list", "", "pods", "", ""),
        Request("operator", "get", "", "secrets", "", "train"),
        Request("operator", "create", "apps", "daemonsets", "", "train"),
        Request("plan-job", "get", "", "configmaps", "", "train"),
        Request("plan-job", "patch", "ccltune.io", "ccltunings", "status", "train"),
    ],
    ids=str,
)
def test_checker_denies_what_the_chart_does_not_grant(rendered: Rendered, req: Request) -> None:
    atoms = _grants(rendered)[COMPONENTS[req.identity]]
    assert not any(a.allows(req) for a in atoms)


def test_recording_covers_every_component() -> None:
    identities = {r.identity for r in recorded()}
    assert set(COMPONENTS) <= identities, f"recorded identities: {sorted(identities)}"

