"""The chart's operator config file is what the operator's own loader accepts, and it wires the
names the chart renders (ServiceAccounts, ports, certificate paths) into the operator."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml

from ccltune.controller.config import OperatorConfig, load_config
from ccltune.controller.daemonset import node_terms, render

from . import pss
from .chart import NAMESPACE, PRESETS, Rendered


def operator_config(r: Rendered) -> OperatorConfig:
    dep = r.one("Deployment", "-operator")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    cm_name = next(v["configMap"]["name"] for v in dep["spec"]["template"]["spec"]["volumes"]
                   if v["name"] == "config")
    text = r.one("ConfigMap", cm_name)["data"]["config.yaml"]
    assert Path(env["CCLTUNE_CONFIG"]).parent == Path(mounts["config"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(env["CCLTUNE_CONFIG"]).name
        path.write_text(text)
        return load_config({**env, "CCLTUNE_CONFIG": str(path)})


def _sa(r: Rendered, component: str) -> str | None:
    for sa in r.of_kind("ServiceAccount"):
        if sa["metadata"]["labels"]["app.kubernetes.io/component"] == component:
            name: str = sa["metadata"]["name"]
            return name
    return None


def test_config_loads_and_wires_chart_names(rendered: Rendered) -> None:
    cfg = operator_config(rendered)
    assert cfg.namespace == NAMESPACE
    assert cfg.agent_service_account == _sa(rendered, "agent")
    assert cfg.job_service_account == (_sa(rendered, "jobs") or cfg.job_service_account)
    assert cfg.webhook_managed is None, "the chart owns the MutatingWebhookConfiguration"
    dep = rendered.one("Deployment", "-operator")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert cfg.metrics_port == ports.get("metrics", 0)
    if rendered.of_kind("MutatingWebhookConfiguration"):
        assert cfg.webhook_port == ports["webhook"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        for f in (cfg.webhook_certfile, cfg.webhook_keyfile):
            assert f and Path(f).parent == Path(mounts["webhook-tls"])
        svc = rendered.one("Service", "-webhook")["metadata"]["name"]
        assert cfg.webhook_host == f"{svc}.{NAMESPACE}.svc"
        assert not cfg.webhook_insecure
    else:  # kopf's server still starts; unreachable on loopback, so no certificate is needed
        assert cfg.webhook_addr == "127.0.0.1" and cfg.webhook_insecure
    assert cfg.operator_image == container["image"]


def test_agent_daemonset_from_chart_settings_is_least_privilege(rendered: Rendered) -> None:
    """The DaemonSet the operator builds from these settings: restricted profile except the
    read-only host /sys the probes need; tolerations and GPU label as the values say."""
    cfg = operator_config(rendered)
    ds = render(cfg, node_terms([], cfg.gpu_label))
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    assert pss.violations(pod, allow_host_paths=frozenset({"/sys"})) == []
    assert pod["serviceAccountName"] == _sa(rendered, "agent")
    assert pod["tolerations"] == cfg.agent_tolerations


def test_presets_cover_the_documented_cluster_shapes() -> None:
    names = {p.name for p in PRESETS.glob("*.yaml")}
    assert {"dgx-a100.yaml", "h100-rail.yaml", "ci.yaml"} <= names


def test_agent_reads_the_mounted_host_sysfs(rendered: Rendered) -> None:
    """The args the chart passes make the agent read the host /sys the DaemonSet mounts (the
    container's own /sys shows only its network namespace under /sys/class/net)."""
    from ccltune_agent.cli import parser

    cfg = operator_config(rendered)
    pod = render(cfg, node_terms([], cfg.gpu_label))["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = list(container["args"])
    args = parser().parse_args(argv if argv[:1] == ["run"] else ["run", *argv])
    host_sys = {v["name"] for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/sys"}
    mounts = {m["mountPath"] for m in container["volumeMounts"] if m["name"] in host_sys}
    assert str(Path(args.sysfs_root) / "sys") in mounts
    assert args.interval == rendered.values_merged()["agent"]["probeIntervalSeconds"]
    # The probes the operator puts on the DaemonSet hit the port the agent listens on.
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    assert ports["health"] == int(args.health_addr.rpartition(":")[2])


def test_plan_job_from_chart_settings_is_restricted(rendered: Rendered) -> None:
    """The plan Job the operator builds from these settings meets Pod Security 'restricted' and
    runs as the chart's jobs ServiceAccount with the chart's resources."""
    from ccltune.controller.jobs import JobNames, job_manifest

    cfg = operator_config(rendered)
    job = job_manifest(JobNames("0" * 64), cfg, "uid", 600)
    pod = job["spec"]["template"]["spec"]
    assert pss.violations(pod) == []
    assert pod["serviceAccountName"] == cfg.job_service_account
    jobs_values = rendered.values_merged()["jobs"]
    assert pod["containers"][0]["resources"] == jobs_values["resources"]
    assert job["spec"]["ttlSecondsAfterFinished"] == jobs_values["ttlSecondsAfterFinished"]


# A packed plan: one gzip entry, so the webhook adds the unpack init container.
PACKED_MANIFEST = {"digest": "d" * 64, "items": [
    {"configMap": "t-ccltune-dddddddddd-0", "key": "msccl__a.xml.gz", "path": "msccl/a.xml",
     "packing": "gzip", "part": 0, "parts": 1, "sha256": "a" * 64}]}


def test_unpack_init_container_from_chart_settings_is_restricted(rendered: Rendered) -> None:
    """The init container the webhook adds to pods with packed plan files meets Pod Security
    'restricted' even in a root training pod, with the chart's image and resources."""
    from ccltune.controller import webhook

    cfg = operator_config(rendered)
    pod = {"spec": {"securityContext": {"runAsUser": 0},
                    "containers": [{"name": "train", "image": "pytorch"}]}}
    spec = webhook.injected_pod(pod, PACKED_MANIFEST, "t", cfg)["spec"]
    assert pss.violations({**pod["spec"], **spec, "containers": []}) == []  # the user's are theirs
    (init,) = spec["initContainers"]
    assert init["image"] == cfg.unpack_image == cfg.agent_image  # default: already on the nodes
    assert init["resources"] == rendered.values_merged()["webhook"]["unpack"]["resources"]


def test_images_follow_values(helm: Path) -> None:
    from .chart import CHART, render

    base = render(helm, [CHART / "values.yaml"])
    cfg = operator_config(base)
    assert cfg.agent_image == cfg.operator_image  # one image for every role by default
    pinned = render(helm, [CHART / "values.yaml"], [
        "image.digest=sha256:" + "a" * 64,
        "agent.image.repository=registry.example/agent", "agent.image.tag=9.9",
    ])
    cfg = operator_config(pinned)
    assert cfg.operator_image == "ghcr.io/ccltune/ccltune@sha256:" + "a" * 64
    # The top-level digest belongs to the top-level repository, never to another one.
    assert cfg.agent_image == "registry.example/agent:9.9"
    tag_only = operator_config(render(helm, [CHART / "values.yaml"], ["agent.image.tag=1.2.3"]))
    assert tag_only.agent_image == "ghcr.io/ccltune/ccltune:1.2.3"
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert tag_only.operator_image == f"ghcr.io/ccltune/ccltune:{app_version}"
    # The unpack init container follows the agent image unless given its own.
    assert cfg.unpack_image == cfg.agent_image
    own = operator_config(render(helm, [CHART / "values.yaml"], [
        "webhook.unpack.image.repository=registry.example/unpack", "webhook.unpack.image.tag=v2"]))
    assert own.unpack_image == "registry.example/unpack:v2"
