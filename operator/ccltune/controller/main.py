"""The operator: `kopf run --standalone -m ccltune.controller.main` (this module only wires handlers).

Handlers: CCLTuning create/update/resume -> reconcile; CCLTuning deleted -> DaemonSet sync and
Job cleanup; agent DaemonSet deleted -> recreate; Pod CREATE -> mutating webhook (admission.py).
Background tasks: reports.py follows NodeTopology changes and re-plans the tunings that used
them; healing.py re-checks published generations and sweeps plan-Job leftovers.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import datetime
from typing import Any

import kopf

from ..api.common import API_GROUP, API_VERSION
from . import admission, daemonset, healing, logs, metrics, reports, webhook
from .config import ConfigError, load_config
from .jobs import LABEL_TUNING_UID
from .kube import KubeClient, connection_from_env
from .reconcile import Context, forget, reconcile

KOPF_PREFIX = f"kopf.{API_GROUP}"
_state: dict[str, Any] = {}  # "ctx": Context, "healer": healing.Healer
_tasks: set[asyncio.Task[None]] = set()


def ctx() -> Context:
    context: Context = _state["ctx"]
    return context


def healer() -> healing.Healer:
    found: healing.Healer = _state["healer"]
    return found


@kopf.on.startup()
async def startup(*, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    try:
        cfg = load_config()
    except ConfigError as exc:
        # One line, no traceback, non-zero exit: kopf would wrap a startup error in three.
        logger.error("configuration: %s", exc)
        logging.shutdown()
        os._exit(2)
    # Our status schema has no room for kopf's own bookkeeping: keep it in annotations, under a
    # prefix of its own (kopf ignores every annotation under its prefix, and ccltune.io/replan
    # must count as a change).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # Events come from condition transitions instead
    settings.execution.max_workers = 4
    server = admission.WebhookServer(
        addr=cfg.webhook_addr, port=cfg.webhook_port, host=cfg.webhook_host,
        certfile=cfg.webhook_certfile, pkeyfile=cfg.webhook_keyfile, insecure=cfg.webhook_insecure)
    server.failure_policy = cfg.webhook_failure_policy
    settings.admission.server = server
    settings.admission.managed = cfg.webhook_managed
    metrics.serve(cfg.metrics_port)
    logs.install(cfg.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per API call is noise
    _state["ctx"] = context = Context(client=KubeClient(connection_from_env()), cfg=cfg)
    _state["healer"] = healing.Healer(context)
    _tasks.add(asyncio.create_task(reports.follow(context), name="nodetopology-watch"))
    _tasks.add(asyncio.create_task(healer().run(), name="healer"))
    logger.info("ccltune operator configured: namespace=%s webhook=%s metrics=%s",
                cfg.namespace, cfg.webhook_port, cfg.metrics_port or "off")


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for task in _tasks:
        task.cancel()
    await asyncio.gather(*_tasks, return_exceptions=True)
    if "ctx" in _state:
        await _state.pop("ctx").client.aclose()


@kopf.on.resume(API_GROUP, API_VERSION, "ccltunings", id="plan")
@kopf.on.create(API_GROUP, API_VERSION, "ccltunings", id="plan")
@kopf.on.update(API_GROUP, API_VERSION, "ccltunings", id="plan")
async def plan(*, body: kopf.Body, started: datetime, logger: kopf.Logger, **_: Any) -> None:
    raw = _raw(body)
    token = logs.TUNING.set(f"{raw['metadata'].get('namespace')}/{raw['metadata'].get('name')}")
    try:
        await reconcile(ctx(), raw, started=started, logger=logger)
    finally:
        logs.TUNING.reset(token)


def _deleted(type: str | None = None, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event(API_GROUP, API_VERSION, "ccltunings", when=_deleted)
async def tuning_gone(*, type: str, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    if type != "DELETED":
        return
    c = ctx()
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    c.inputs.pop(key, None)
    c.waiting.pop(key, None)
    c.published.pop(key, None)
    healer().repaired(key)
    logs.forget(*key)
    forget(*key)
    # Published ConfigMaps go by owner reference; Jobs live in our namespace, so delete them here
    # (their input/result ConfigMaps are owned by the Job).
    uid = meta.get("uid")
    if uid:
        for job in await c.client.list("batch/v1", "jobs", c.cfg.namespace,
                                       label_selector=f"{LABEL_TUNING_UID}={uid}"):
            if (job["metadata"].get("labels") or {}).get(LABEL_TUNING_UID) == uid:
                await c.client.delete("batch/v1", "jobs", job["metadata"]["name"], c.cfg.namespace)
    action = await daemonset.sync(c.client, c.cfg)
    metrics.DAEMONSET_SYNCS.labels(action).inc()
    logger.info("CCLTuning deleted; agent DaemonSet %s", action)


@kopf.on.event("apps", "v1", "daemonsets", labels={"app.kubernetes.io/name": daemonset.NAME}, when=_deleted)
async def agents_gone(*, type: str, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
    c = ctx()
    if type == "DELETED" and namespace == c.cfg.namespace:
        action = await daemonset.sync(c.client, c.cfg)
        metrics.DAEMONSET_SYNCS.labels(f"repair-{action}").inc()
        logger.warning("agent DaemonSet was deleted; %s it", action)


@kopf.index(API_GROUP, API_VERSION, "ccltunings")
def tunings_by_namespace(*, namespace: str | None, name: str, uid: str, spec: kopf.Spec,
                         status: kopf.Status, **_: Any) -> dict[str, webhook.Entry] | None:
    entry = webhook.entry(name, _raw(spec), _raw(status), uid)
    return None if entry is None or namespace is None else {namespace: entry}


@kopf.on.mutate("", "v1", "pods", operations=["CREATE"], id="inject",
                side_effects=True, ignore_failures=True)
async def inject(*, body: kopf.Body, patch: kopf.Patch, namespace: str | None, dryrun: bool,
                 warnings: list[str], **kwargs: Any) -> None:
    index: kopf.Index[str, webhook.Entry] = kwargs["tunings_by_namespace"]
    pod = _raw(body)
    ns = namespace or (pod.get("metadata") or {}).get("namespace") or "default"
    await admission.inject(ctx(), healer(), index.get(ns, []), pod=pod, patch=patch, namespace=ns,
                           dryrun=dryrun, warnings=warnings)


def _raw(obj: Any) -> dict[str, Any]:
    """kopf's read-only mappings -> plain nested dicts."""
    if hasattr(obj, "items"):
        return {k: _raw(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_raw(v) for v in obj]  # type: ignore[return-value]
    return obj
