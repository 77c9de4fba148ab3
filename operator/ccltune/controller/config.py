"""Operator configuration: a YAML file (CCLTUNE_CONFIG) overlaid by CCLTUNE_* env vars.

The Helm chart sets these; docs/operator.md lists every key. Bad values fail at startup with one
message naming the variable or key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..api.errors import InputError


class ConfigError(InputError):
    pass


class OperatorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str = "ccltune-system"  # where the agent DaemonSet and plan Jobs run
    operator_image: str = "ghcr.io/ccltune/ccltune:0.1.0"
    agent_image: str = "ghcr.io/ccltune/ccltune:0.1.0"
    image_pull_policy: str = Field("IfNotPresent", pattern="^(Always|IfNotPresent|Never)$")
    agent_service_account: str = "ccltune-agent"
    agent_resources: dict[str, Any] = {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }
    agent_tolerations: list[dict[str, Any]] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    agent_priority_class: str | None = None
    # The agent reads the host's /sys mounted at /host/sys (see daemonset.py); /proc/cpuinfo in the
    # container already lists the host's CPUs, so it needs no mount.
    agent_args: list[str] = ["run", "--sysfs-root", "/host", "--cpuinfo", "/proc/cpuinfo",
                             "--health-addr", "0.0.0.0:8081"]
    agent_health_port: int | None = Field(8081, ge=1, le=65535)  # None: no probes
    # A node counts as a GPU node when it carries this label (GPU Feature Discovery sets it).
    gpu_node_label: str = "nvidia.com/gpu.present=true"
    job_service_account: str = "ccltune-plan-job"
    job_resources: dict[str, Any] = {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "4", "memory": "8Gi"},
    }
    # Image of the `ccltune-unpack` init container of pods whose plan has packed (large) files;
    # None: the agent image, which every GPU node already has.
    unpack_image: str | None = None
    # requests == limits, so the init container never lowers a Guaranteed pod's QoS class.
    unpack_resources: dict[str, Any] = {
        "requests": {"cpu": "250m", "memory": "128Mi"},
        "limits": {"cpu": "250m", "memory": "128Mi"},
    }
    # profiler live: nccl-tests image used when spec.tuning.benchmarkImage is unset (None: required
    # in the spec), the GPU resource its pods request, and the slack past a run's deadline after
    # which the operator deletes a run its controller has not ended.
    benchmark_image: str | None = None
    benchmark_gpu_resource: str = "nvidia.com/gpu"
    benchmark_grace_seconds: float = Field(300, ge=0)
    # Plans bigger than these run as batch/v1 Jobs instead of inside the operator.
    inprocess_max_gpus: int = Field(512, ge=0)
    inprocess_max_synth_gpus: int = Field(16, ge=0)
    inprocess_max_trials: int = Field(2000, ge=0)
    inprocess_concurrency: int = Field(1, ge=1, le=64)  # plans running in the operator at once
    # Estimated work (units of ~1 ms, ccltune/workload.py) above which a plan runs as a Job, so
    # in-process plans stay within seconds and never hold the queue for long.
    inprocess_max_work: int = Field(5000, ge=0)
    # Hard limit: a spec estimated above this is not planned at all (condition PlanTooLarge).
    max_plan_work: int = Field(5_000_000, ge=1)
    topology_timeout_seconds: float = Field(300, gt=0)
    retry_seconds: float = Field(5, gt=0)
    job_poll_seconds: float = Field(15, gt=0)  # how often a pass re-checks a running plan Job
    job_backoff_limit: int = Field(0, ge=0)
    job_ttl_seconds: int = Field(3600, ge=0)
    # Sharded synthesis (controller/shardjob.py): at most this many pods per plan, and, when
    # spec.synthesis.shards is unset, one per this much estimated synthesis work (workload.py).
    synthesis_max_shards: int = Field(8, ge=1, le=64)
    synthesis_shard_work: int = Field(100_000, ge=1)
    metrics_port: int = Field(8080, ge=0, le=65535)  # 0 turns the metrics endpoint off
    webhook_port: int = Field(9443, ge=1, le=65535)
    webhook_addr: str = "0.0.0.0"
    webhook_host: str | None = None  # Service DNS name put into the webhook configuration
    webhook_certfile: str | None = None
    webhook_keyfile: str | None = None
    webhook_insecure: bool = False  # plain HTTP: only for tests and local debugging
    # Name of the MutatingWebhookConfiguration kopf keeps in step; None: the chart owns it.
    webhook_managed: str | None = None
    # What the webhook answers when it fails inside: Ignore admits the pod untuned (with a warning,
    # an Event and a metric); Fail denies it. Mirrors the chart's webhook.failurePolicy.
    webhook_failure_policy: str = Field("Ignore", pattern="^(Ignore|Fail)$")
    # Budget for the webhook's API reads; below the webhook's timeoutSeconds so the pod gets our
    # answer (admitted untuned) rather than the API server's timeout.
    webhook_api_timeout_seconds: float = Field(3, gt=0, le=30)
    # Every published generation is re-checked (pointer, content ConfigMaps, digests) at startup
    # and this often; plan-Job ConfigMaps left without an owner are adopted or deleted.
    heal_interval_seconds: float = Field(300, gt=0)
    # json: one JSON object per line; text: plain lines. Both name the CCLTuning each line is about.
    log_format: str = Field("json", pattern="^(json|text)$")

    @property
    def gpu_label(self) -> tuple[str, str]:
        key, _, value = self.gpu_node_label.partition("=")
        return key, value


_JSON_KEYS = {"agent_resources", "agent_tolerations", "agent_args", "job_resources",
              "unpack_resources"}


def _env_name(key: str) -> str:
    return "CCLTUNE_" + key.upper()


def load_config(env: Mapping[str, str] | None = None) -> OperatorConfig:
    """File first, then env vars; raises ConfigError naming the offending key or variable."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    path = env.get("CCLTUNE_CONFIG")
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"CCLTUNE_CONFIG={path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"CCLTUNE_CONFIG={path}: expected a mapping of settings")
        raw.update({str(k).replace("-", "_"): v for k, v in loaded.items()})
    for key in OperatorConfig.model_fields:
        name = _env_name(key)
        if name not in env:
            continue
        text = env[name]
        if key in _JSON_KEYS:
            try:
                raw[key] = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{name}: not valid JSON ({exc.msg})") from None
        else:
            raw[key] = text if text != "" else None
    try:
        return OperatorConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "?"
        where = _env_name(key) if _env_name(key) in env else f"{key} (in {path or 'defaults'})"
        raise ConfigError(f"{where}: {err['msg']}") from None
