"""Chart values for the webhook's failure policy, healing and log format reach the operator."""

from __future__ import annotations

from pathlib import Path

from .chart import CHART, Rendered, render, render_error
from .test_helm_config import operator_config

DEFAULTS = [CHART / "values.yaml"]


def _kopf_args(r: Rendered) -> list[str]:
    dep = r.one("Deployment", "-operator")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args


def test_defaults_admit_on_failure_and_log_json(helm: Path) -> None:
    r = render(helm, DEFAULTS)
    cfg = operator_config(r)
    hook = r.one("MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["failurePolicy"] == cfg.webhook_failure_policy == "Ignore"
    # The operator answers (untuned) before the API server would give up on it.
    assert 0 < cfg.webhook_api_timeout_seconds < hook["timeoutSeconds"]
    assert cfg.heal_interval_seconds == 300
    assert cfg.log_format == "json" and "--log-format=json" in _kopf_args(r)


def test_explicit_fail_and_text_logs(helm: Path) -> None:
    r = render(helm, DEFAULTS, ["webhook.failurePolicy=Fail", "operator.logFormat=text",
                                "operator.healIntervalSeconds=60", "webhook.timeoutSeconds=1"])
    cfg = operator_config(r)
    assert r.one("MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    assert cfg.webhook_failure_policy == "Fail"
    assert cfg.webhook_api_timeout_seconds == 1
    assert cfg.heal_interval_seconds == 60
    assert cfg.log_format == "text" and "--log-format=full" in _kopf_args(r)


def test_bad_values_are_refused(helm: Path) -> None:
    assert "logFormat" in render_error(helm, DEFAULTS, ["operator.logFormat=xml"])
    assert "healIntervalSeconds" in render_error(helm, DEFAULTS, ["operator.healIntervalSeconds=0"])
