"""Prometheus metrics (served on CCLTUNE_METRICS_PORT; 0 turns the endpoint off)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "ccltune_reconciles_total", "CCLTuning reconcile passes by outcome", ["outcome"])
RECONCILE_SECONDS = Histogram(
    "ccltune_reconcile_duration_seconds", "Wall time of one CCLTuning reconcile pass",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800))
PLAN_SECONDS = Histogram(
    "ccltune_plan_duration_seconds", "Wall time of build_plan, by where it ran", ["where"],
    buckets=(0.01, 0.1, 0.5, 1, 5, 10, 60, 300, 1800, 7200))
JOBS = Counter("ccltune_plan_jobs_total", "Plan Jobs by outcome (created, succeeded, failed)",
               ["outcome"])
PUBLISHED = Counter("ccltune_published_plans_total", "Plan generations published")
INJECTIONS = Counter("ccltune_webhook_pods_total", "Pods seen by the webhook by outcome",
                     ["outcome"])
READY = Gauge("ccltune_tunings_ready", "CCLTunings whose Ready condition is True")
WEBHOOK_FAILURES = Counter(
    "ccltune_webhook_failures_total",
    "Admission requests the webhook could not serve, by reason (the pod was admitted untuned "
    "unless failurePolicy is Fail)", ["reason"])
HEALS = Counter("ccltune_publication_repairs_total",
                "Damaged published generations found (and republished), by what was wrong", ["reason"])
SWEPT = Counter("ccltune_plan_job_leftovers_total",
                "Plan-Job objects the healer adopted or deleted (job, configmap, adopted)", ["what"])
DAEMONSET_SYNCS = Counter("ccltune_agent_daemonset_syncs_total", "Agent DaemonSet syncs by action",
                          ["action"])


def serve(port: int) -> None:
    if port:
        start_http_server(port)
