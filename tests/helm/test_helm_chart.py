"""The chart lints strictly and renders what the issue asks for, for every values file in CI."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import pss
from .chart import CHART, NAMESPACE, VALUES_FILES, Rendered, render, render_error, run_helm
from .tls_check import handshake

RECOMMENDED = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "app.kubernetes.io/component",
    "helm.sh/chart",
)
CLUSTER_SCOPED = {
    "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
    "CustomResourceDefinition",
}


def _templated(r: Rendered) -> list[dict[str, Any]]:
    return [d for d in r.docs if d["kind"] != "CustomResourceDefinition"]


def _operator_pod(r: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = r.one("Deployment", "-operator")["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
def test_lint_strict(helm: Path, values: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_renders_crds_and_every_component(rendered: Rendered) -> None:
    kinds = {d["kind"] for d in rendered.docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole",
            "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap"} <= kinds
    crds = {d["metadata"]["name"] for d in rendered.of_kind("CustomResourceDefinition")}
    assert crds == {"ccltunings.ccltune.io", "nodetopologies.ccltune.io"}


def test_recommended_labels(rendered: Rendered) -> None:
    for doc in _templated(rendered):
        labels = doc["metadata"].get("labels", {})
        missing = [k for k in RECOMMENDED if k not in labels]
        assert not missing, f"{doc['kind']}/{doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_namespaced_objects_in_release_namespace(rendered: Rendered) -> None:
    """Everything lives in the release namespace, except the operator's RoleBindings in the
    namespaces it watches (namespaced mode)."""
    watched = set(rendered.values_merged()["operator"]["watchNamespaces"])
    for doc in _templated(rendered):
        ns = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert ns is None, f"{doc['kind']} is cluster-scoped"
        elif doc["kind"] == "RoleBinding" and ns in watched:
            assert doc["metadata"]["name"].endswith("-operator-tenant")
        else:
            assert ns == NAMESPACE, f"{doc['kind']}/{doc['metadata']['name']} in {ns}"


def test_operator_deployment(rendered: Rendered) -> None:
    dep = rendered.one("Deployment", "-operator")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pss.violations(pod) == [], "operator pod must meet Pod Security 'restricted'"
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports, probe
    res = container["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]
    sa_names = {d["metadata"]["name"] for d in rendered.of_kind("ServiceAccount")}
    assert pod["serviceAccountName"] in sa_names
    selector = dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    mounted = {v["name"]: v for v in pod["volumes"]}
    config_maps = {d["metadata"]["name"] for d in rendered.of_kind("ConfigMap")}
    assert mounted["config"]["configMap"]["name"] in config_maps


def test_operator_command_parses_with_kopf(rendered: Rendered) -> None:
    """The Deployment's `kopf run` arguments, parsed by kopf's own CLI (click), name the
    controller module, a health endpoint on the probed port, and no peering."""
    from kopf import cli

    (container,) = _operator_pod(rendered)["containers"]
    assert container["command"] == ["kopf", "run"]
    params = cli.run.make_context("run", list(container["args"])).params
    assert params["modules"] == ("ccltune.controller.main",)
    assert params["standalone"], "one replica, no peering objects to grant RBAC for"
    assert bool(params["clusterwide"]) != bool(params["namespaces"])
    if params["namespaces"]:
        assert NAMESPACE in params["namespaces"], "the agent DaemonSet repair handler lives there"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    endpoint = params["liveness_endpoint"]
    assert endpoint == f"http://0.0.0.0:{ports['health']}{container['livenessProbe']['httpGet']['path']}"


def _webhook_parts(r: Rendered) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    mwc = r.one("MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    svc_ref = hook["clientConfig"]["service"]
    svc = r.one("Service", svc_ref["name"])
    return mwc, hook, svc


def test_webhook_configuration(rendered: Rendered) -> None:
    if not rendered.of_kind("MutatingWebhookConfiguration"):
        assert not rendered.of_kind("Service") or all(
            not d["metadata"]["name"].endswith("-webhook") for d in rendered.of_kind("Service"))
        return
    _mwc, hook, svc = _webhook_parts(rendered)
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] <= 10, "pods wait on it at creation"
    assert hook["objectSelector"], "only labelled pods may be sent to the webhook"
    ns_exprs = hook["namespaceSelector"]["matchExpressions"]
    never = [set(e["values"]) for e in ns_exprs
             if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
    assert any({NAMESPACE, "kube-system"} <= v for v in never), (
        "the operator must never gate its own pods, nor the control plane's")
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                              "operations": ["CREATE"], "scope": "Namespaced"}]
    svc_ref = hook["clientConfig"]["service"]
    assert svc_ref["namespace"] == NAMESPACE
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == svc_ref["port"]]
    pod = _operator_pod(rendered)
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert svc_port["targetPort"] in ports
    labels = rendered.one("Deployment", "-operator")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    secret_vol = [v for v in pod["volumes"] if "secret" in v]
    assert secret_vol, "webhook TLS must be mounted"


def _kopf_mutating_handlers() -> list[object]:
    """The operator's admission handlers, as kopf registered them (importing main registers)."""
    import kopf

    import ccltune.controller.main  # noqa: F401

    registry = kopf.get_default_registry()
    return [h for h in registry._webhooks.get_all_handlers()
            if str(getattr(h, "reason", "")) == "mutating"]


def test_webhook_matches_the_operators_kopf_handler(rendered: Rendered) -> None:
    """Path, operations, side effects and failure policy as kopf would build them for the handler
    (kopf/_core/engines/admission.py build_webhooks), so the chart-owned configuration and the
    operator cannot drift apart."""
    if not rendered.of_kind("MutatingWebhookConfiguration"):
        return
    _mwc, hook, _svc = _webhook_parts(rendered)
    handlers = _kopf_mutating_handlers()
    assert len(handlers) == 1, f"expected one mutating handler, found {handlers}"
    (h,) = handlers
    assert hook["clientConfig"]["service"]["path"] == f"/{h.id}"  # type: ignore[attr-defined]
    assert set(hook["rules"][0]["operations"]) == set(h.operations or ["*"])  # type: ignore[attr-defined]
    side_effects = "NoneOnDryRun" if h.side_effects else "None"  # type: ignore[attr-defined]
    assert hook["sideEffects"] == side_effects
    if h.ignore_failures:  # type: ignore[attr-defined]
        assert hook["failurePolicy"] == "Ignore"


def test_generated_ca_signs_the_serving_cert(helm: Path) -> None:
    r = render(helm, [VALUES_FILES[0]])
    _mwc, hook, svc = _webhook_parts(r)
    secret = r.one("Secret", "-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = base64.b64decode(hook["clientConfig"]["caBundle"])
    assert ca == data["ca.crt"]
    host = f"{svc['metadata']['name']}.{NAMESPACE}.svc"
    handshake(data["tls.crt"], data["tls.key"], ca, host)
    with pytest.raises(ssl.SSLError):
        handshake(data["tls.crt"], data["tls.key"], ca, f"other.{NAMESPACE}.svc")


def test_cert_manager_default_issuer_chain(helm: Path) -> None:
    r = render(helm, [VALUES_FILES[0]], ["webhook.certificate.source=certManager"])
    assert not r.of_kind("Secret"), "cert-manager owns the TLS Secret"
    mwc, hook, _svc = _webhook_parts(r)
    assert "caBundle" not in hook["clientConfig"]
    serving = r.one("Certificate", "-webhook")
    ns, name = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    assert (ns, name) == (NAMESPACE, serving["metadata"]["name"])
    issuer = r.one("Issuer", serving["spec"]["issuerRef"]["name"])
    ca_cert = r.one("Certificate", "-ca")
    assert issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    assert ca_cert["spec"]["isCA"] is True
    root = r.one("Issuer", ca_cert["spec"]["issuerRef"]["name"])
    assert "selfSigned" in root["spec"]
    pod = _operator_pod(r)
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert serving["spec"]["secretName"] in secrets
    assert f"{_svc['metadata']['name']}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]


def test_rbac_has_no_wildcards_or_escalation(rendered: Rendered) -> None:
    for doc in rendered.of_kind("ClusterRole") + rendered.of_kind("Role"):
        for rule in doc["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"{doc['metadata']['name']}: {rule}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "secrets" not in rule["resources"], "nothing here needs Secrets"
            assert "nonResourceURLs" not in rule


def test_each_component_has_its_own_service_account(rendered: Rendered) -> None:
    bound: dict[str, set[str]] = {}
    for binding in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding"):
        for subject in binding["subjects"]:
            bound.setdefault(subject["name"], set()).add(binding["roleRef"]["name"])
    roles = {d["metadata"]["name"] for d in rendered.of_kind("ClusterRole") + rendered.of_kind("Role")}
    for binding in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding"):
        assert binding["roleRef"]["name"] in roles
    operator_sa = _operator_pod(rendered)["serviceAccountName"]
    assert operator_sa in bound
    others = [names for sa, names in bound.items() if sa != operator_sa]
    for names in others:
        assert not names & bound[operator_sa], "agent/jobs must not share the operator's roles"


@pytest.mark.parametrize(
    ("sets", "expect"),
    [
        (["webhook.failurePolicy=Maybe"], "failurePolicy"),
        (["webhook.timeoutSeconds=60"], "timeoutSeconds"),
        (["securityContext.allowPrivilegeEscalation=true"], "allowPrivilegeEscalation"),
        (["podSecurityContext.runAsNonRoot=false"], "runAsNonRoot"),
        (["securityContext.capabilities.add={SYS_ADMIN}"], "add"),
        (["replicas=2"], "replicas"),
        (["image.digest=latest"], "digest"),
        (["webhook.certificate.source=vault"], "source"),
        (["agent.gpuNodeLabel=not a label"], "gpuNodeLabel"),
        (["webhook.certificate.source=secret"], "webhook.certificate.secretName is required"),
    ],
)
def test_bad_values_fail_with_a_message_naming_the_field(
    helm: Path, sets: list[str], expect: str
) -> None:
    err = render_error(helm, [VALUES_FILES[0]], sets)
    assert expect in err, err
    assert "panic" not in err and "goroutine" not in err


def test_refuses_clusters_older_than_the_crds_need(helm: Path) -> None:
    proc = run_helm(helm, "template", "x", str(CHART), "--kube-version", "1.28.0")
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr, proc.stderr


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
def test_notes_render_with_next_steps(helm: Path, values: Path) -> None:
    proc = run_helm(helm, "install", "ccltune", str(CHART), "--dry-run=client", "-n", NAMESPACE,
                    "-f", str(values))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply --server-side" in notes, "the CRD upgrade step must be in NOTES"
    assert "<no value>" not in notes


def test_packaged_chart_renders_the_same(helm: Path, tmp_path: Path) -> None:
    """`helm package` keeps crds/, the schema and every template (.helmignore drops nothing
    needed)."""
    proc = run_helm(helm, "package", str(CHART), "-d", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (tgz,) = tmp_path.glob("ccltune-*.tgz")
    packed = run_helm(helm, "template", "ccltune", str(tgz), "-n", NAMESPACE, "--include-crds")
    assert packed.returncode == 0, packed.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(packed.stdout) if d)
    direct = sorted(d["kind"] for d in render(helm, [VALUES_FILES[0]]).docs)
    assert kinds == direct
    bad = run_helm(helm, "template", "x", str(tgz), "--set", "webhook.failurePolicy=Maybe")
    assert bad.returncode != 0, "values.schema.json must travel with the package"


def test_helm_test_pod_is_restricted_and_runs_valid_python(rendered: Rendered) -> None:
    """`helm test` smoke Pod: Pod Security 'restricted', never injected, and its script compiles."""
    pods = [p for p in rendered.of_kind("Pod")
            if p["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    values = rendered.values_merged()
    if not values["webhook"]["enabled"] and not values["operator"]["metricsPort"]:
        assert not pods
        return
    (pod,) = pods
    assert pss.violations(pod["spec"]) == []
    assert pod["metadata"]["labels"]["ccltune.io/inject"] == "false"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    compile(container["args"][0], "smoke-test", "exec")
    if "/metrics" in container["args"][0]:
        svc = rendered.one("Service", "-metrics")["metadata"]["name"]
        assert f"http://{svc}:" in container["args"][0]
