"""The Pod webhook's request path: inject a published plan, and never deny a pod for our failure.

kopf answers `allowed: false` (code 500) whenever a mutating handler raises, and an HTTP error
when the review itself is malformed; `failurePolicy: Ignore` covers neither (the webhook did
answer). So every failure here (API errors, a connection reset while reading the pointer, a
corrupt manifest, a damaged generation, a malformed review, a bug) admits the pod untuned, with
a warning in the AdmissionReview response, an Event and a metric — unless the operator is
configured with `webhook_failure_policy: Fail`, then the pod is denied, as asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any

import aiohttp.web
import httpx
import kopf

try:  # kopf's errors for a review it cannot serve (not exported; only labels the metric)
    from kopf._core.engines.admission import WebhookError as _KopfReviewError
except ImportError:  # another kopf layout: those count as "internal"
    _KopfReviewError = LookupError  # type: ignore[misc,assignment]

from ..api.common import API_GROUP, API_VERSION
from . import healing, metrics, webhook
from .kube import ApiError, event_body
from .logs import TUNING
from .reconcile import Context

log = logging.getLogger("ccltune.webhook")
COMPONENT = "ccltune-webhook"
WARNING_CHARS = 256  # the API server may truncate longer warnings
_background: set[asyncio.Task[None]] = set()


class Untuned(Exception):
    """The pod cannot be injected for a reason worth telling (reason: a metric label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def classify(exc: BaseException) -> tuple[str, str]:
    """(metric reason, one-line message) for a failure inside the admission path."""
    if isinstance(exc, Untuned):
        return exc.reason, str(exc)
    if isinstance(exc, TimeoutError):
        return "timeout", "the API server did not answer in time"
    if isinstance(exc, ApiError):
        return "api-error", str(exc)
    if isinstance(exc, httpx.HTTPError):
        return "api-unreachable", f"{type(exc).__name__}: {exc or 'connection failed'}"
    return "internal", f"{type(exc).__name__}: {exc}"


def pod_label(pod: dict[str, Any], namespace: str) -> str:
    meta = pod.get("metadata") or {}
    return f"{namespace}/{meta.get('name') or (meta.get('generateName') or '') + '*'}"


async def inject(ctx: Context, healer: healing.Healer, entries: Iterable[webhook.Entry], *,
                 pod: dict[str, Any], patch: kopf.Patch, namespace: str, dryrun: bool,
                 warnings: list[str]) -> None:
    """kopf's mutating handler body: sets `patch` or, on any failure, leaves the pod alone."""
    chosen: webhook.Entry | None = None
    token = TUNING.set(None)
    try:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        chosen = webhook.select(labels, list(entries))
        if chosen is None:
            metrics.INJECTIONS.labels("unselected").inc()
            return
        TUNING.set(f"{namespace}/{chosen.name}")
        if not chosen.published:
            metrics.INJECTIONS.labels("no-plan").inc()
            _event_later(ctx, dryrun, _tuning_ref(chosen, namespace), "PodNotInjected",
                         f"pod {pod_label(pod, namespace)} admitted unchanged: no published plan yet")
            return
        async with asyncio.timeout(ctx.cfg.webhook_api_timeout_seconds):
            delta = await _delta(ctx, healer, chosen, pod, namespace)
    except Exception as exc:  # every failure: the pod is admitted untuned (or denied, if asked)
        reason, message = classify(exc)
        _failed(ctx, pod, namespace, chosen, reason, message, dryrun, warnings,
                traceback=reason == "internal")
        return
    finally:
        TUNING.reset(token)
    for key, value in delta.items():
        patch[key] = value
    metrics.INJECTIONS.labels("injected" if delta else "already-injected").inc()


async def _delta(ctx: Context, healer: healing.Healer, chosen: webhook.Entry, pod: dict[str, Any],
                 namespace: str) -> dict[str, Any]:
    key = (namespace, chosen.name)
    pointer = await ctx.client.get("v1", "configmaps", chosen.pointer, namespace)
    if pointer is None:
        damage = healing.Damage("pointer-missing", f"pointer ConfigMap {namespace}/{chosen.pointer} is missing")
        _heal_later(healer, key, damage)
        raise Untuned("plan-damaged", damage.message)
    try:
        manifest = webhook.read_manifest(pointer)
    except ValueError as exc:
        damage = healing.Damage("pointer-corrupt", f"pointer ConfigMap {namespace}/{chosen.pointer}: {exc}")
        _heal_later(healer, key, damage)
        raise Untuned("corrupt-pointer", damage.message) from None
    missing = await healing.missing_content(ctx.client, chosen.pointer, manifest, namespace)
    if missing is not None:  # mounting it would leave the pod in ContainerCreating
        _heal_later(healer, key, missing)
        raise Untuned("plan-damaged", missing.message)
    healer.repaired(key)
    try:
        desired = webhook.injected_pod(pod, manifest, chosen.name, ctx.cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise Untuned("corrupt-pointer", f"{namespace}/{chosen.pointer}: unusable manifest "
                      f"({type(exc).__name__}: {exc})") from None  # fmt: skip
    return webhook.changes(pod, desired)


def _failed(ctx: Context, pod: dict[str, Any], namespace: str, chosen: webhook.Entry | None,
            reason: str, message: str, dryrun: bool, warnings: list[str], *, traceback: bool) -> None:
    deny = ctx.cfg.webhook_failure_policy == "Fail"
    metrics.WEBHOOK_FAILURES.labels(reason).inc()
    metrics.INJECTIONS.labels("denied" if deny else "untuned").inc()
    who = pod_label(pod, namespace)
    verdict = "denied (failurePolicy Fail)" if deny else "admitted untuned"
    text = f"ccltune: pod {who} {verdict}: {message}"
    (log.exception if traceback else log.warning)("%s", text)
    ref = _tuning_ref(chosen, namespace) if chosen is not None else _pod_ref(pod, namespace)
    _event_later(ctx, dryrun, ref, "PodNotInjected" if not deny else "PodDenied", text)
    if deny:
        raise kopf.AdmissionError(text[:1024], code=500)
    warnings.append(text[:WARNING_CHARS])


def _tuning_ref(chosen: webhook.Entry, namespace: str) -> dict[str, Any]:
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "CCLTuning", "name": chosen.name,
            "namespace": namespace, "uid": chosen.uid}


def _pod_ref(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The pod's controller (Job, ReplicaSet...) when it has one: the pod itself does not exist yet."""
    meta = pod.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if isinstance(owner, dict) and owner.get("kind") and owner.get("name"):
            return {k: owner.get(k) for k in ("apiVersion", "kind", "name", "uid")} | {"namespace": namespace}
    name = meta.get("name") or meta.get("generateName") or "pod"
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}


def _spawn(coro: Any) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


def _event_later(ctx: Context, dryrun: bool, ref: dict[str, Any], reason: str, message: str) -> None:
    """Post in the background: the pod's answer must not wait on (or fail with) the API server."""
    if dryrun:  # sideEffects: NoneOnDryRun
        return

    async def post() -> None:
        event = event_body(ref, "Warning", reason, message, component=COMPONENT)
        try:
            async with asyncio.timeout(10):
                await ctx.client.create("v1", "events", event, ref["namespace"])
        except (ApiError, httpx.HTTPError, TimeoutError) as exc:
            log.warning("could not post the %s event: %s", reason, exc)

    _spawn(post())


def _heal_later(healer: healing.Healer, key: tuple[str, str], damage: healing.Damage) -> None:
    _spawn(healer.reported_by_webhook(key, damage))


class WebhookServer(kopf.WebhookServer):
    """kopf's webhook server, but a review kopf itself cannot serve (not JSON, no `request`, an
    unknown resource, a bug) is answered too: admitted with a warning, or denied under Fail."""

    failure_policy: str = "Ignore"

    async def _serve(self, fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        data: Any = None
        try:
            data = json.loads(await request.text())
            peer = request.transport.get_extra_info("peercert") if request.transport else None
            response = await fn(data, webhook=request.match_info.get("id"), sslpeer=peer,
                                headers=dict(request.headers))
            return aiohttp.web.json_response(response)
        except Exception as exc:
            malformed = isinstance(exc, (ValueError, LookupError, TypeError, _KopfReviewError))
            reason = "malformed-review" if malformed else "internal"
            return aiohttp.web.json_response(self.fallback(data, reason, f"{type(exc).__name__}: {exc}"))

    def fallback(self, data: Any, reason: str, message: str) -> dict[str, Any]:
        review = data if isinstance(data, dict) else {}
        request = review.get("request")
        request = request if isinstance(request, dict) else {}
        deny = self.failure_policy == "Fail"
        metrics.WEBHOOK_FAILURES.labels(reason).inc()
        text = f"ccltune: admission review not served ({reason}): {message}"
        log.warning("%s", text)
        answer: dict[str, Any] = {"uid": str(request.get("uid") or ""), "allowed": not deny}
        if deny:
            answer["status"] = {"code": 500, "message": text[:1024]}
        else:
            answer["warnings"] = [text[:WARNING_CHARS]]
        return {"apiVersion": str(review.get("apiVersion") or "admission.k8s.io/v1"),
                "kind": "AdmissionReview", "response": answer}
