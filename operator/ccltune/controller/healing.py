"""Self-healing: published generations are re-checked, and plan-Job ConfigMaps never leak.

At startup and every `heal_interval_seconds`:

* every generation this operator published (Context.published) is checked: the pointer exists and
  its manifest parses, every content ConfigMap exists, every file's bytes match the sha256 the
  manifest records, and those add up to the plan digest. A damaged one gets the CCLTuning
  re-planned (`ccltune.io/replan`); the pass that follows finds the damage itself (reconcile's
  up-to-date check runs the same check) and republishes. The planner is deterministic, so the
  same ConfigMaps come back (a plan Job's result is reused while the Job is kept).
* plan-Job ConfigMaps in the operator's namespace without an owner are adopted by their Job, or
  deleted when their CCLTuning is gone or when they were already ownerless and Job-less at the
  previous sweep (a plan abandoned between writing its input and creating its Job). Jobs of
  deleted CCLTunings (deleted while the operator was down) are deleted too.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from ..api.common import API_GROUP, API_VERSION
from ..api.plan import PlanFile
from ..publish.configmaps import LABEL_DIGEST
from ..publish.files import plan_digest
from ..publish.unpack import UnpackError, by_path, extract, read_configmaps
from . import jobs, metrics
from .kube import ApiError, KubeClient
from .logs import TUNING
from .webhook import read_manifest

if TYPE_CHECKING:
    from .reconcile import Context

log = logging.getLogger("ccltune.healing")
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"


@dataclass(frozen=True)
class Damage:
    """What is wrong with a published generation; `reason` is a metric label."""

    reason: str  # pointer-missing, pointer-corrupt, content-missing, content-corrupt
    message: str


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


async def check_generation(client: KubeClient, pointer_name: str, namespace: str, *,
                           digests: bool = True) -> Damage | None:
    """None when the generation the pointer names is whole. Without `digests` only existence is
    checked (the webhook's check: it must answer within its timeout)."""
    pointer = await client.get("v1", "configmaps", pointer_name, namespace)
    if pointer is None:
        return Damage("pointer-missing", f"pointer ConfigMap {namespace}/{pointer_name} is missing")
    try:
        manifest = read_manifest(pointer)
    except ValueError as exc:
        return Damage("pointer-corrupt", f"pointer ConfigMap {namespace}/{pointer_name}: {exc}")
    if not digests:
        return await missing_content(client, pointer_name, manifest, namespace)
    names = content_names(manifest)
    found = dict(zip(names, await asyncio.gather(
        *(client.get("v1", "configmaps", n, namespace) for n in names)), strict=True))
    missing = [n for n, cm in found.items() if cm is None]
    if missing:
        return _missing(pointer_name, missing, namespace)
    annotated = ((pointer.get("metadata") or {}).get("annotations") or {}).get(LABEL_DIGEST)
    try:
        groups = by_path(manifest["items"])
        files = [PlanFile(path=p, content="", digest=str(e[0].get("sha256") or "")) for p, e in groups.items()]
        if plan_digest(files) != manifest["digest"] or annotated not in (None, manifest["digest"]):
            raise UnpackError(f"file digests do not add up to plan digest {manifest['digest'][:12]}")
        read = read_configmaps([cm for cm in found.values() if cm is not None])
        for path, entries in groups.items():
            extract(path, entries, read, _Discard())  # type: ignore[arg-type]
    except ValueError as exc:  # UnpackError, or base64 that does not decode
        return Damage("content-corrupt", f"{namespace}/{pointer_name}: {exc}")
    return None


def content_names(manifest: dict[str, Any]) -> list[str]:
    return sorted({i["configMap"] for i in manifest["items"]} | set(manifest["configMaps"]))


def _missing(pointer_name: str, missing: list[str], namespace: str) -> Damage:
    return Damage("content-missing", f"content ConfigMap(s) {', '.join(missing)} named by "
                  f"{namespace}/{pointer_name} are missing")  # fmt: skip


async def missing_content(client: KubeClient, pointer_name: str, manifest: dict[str, Any],
                          namespace: str) -> Damage | None:
    """Damage when a content ConfigMap the manifest names does not exist (metadata reads only)."""
    names = content_names(manifest)
    found = await asyncio.gather(*(client.get_metadata("v1", "configmaps", n, namespace) for n in names))
    missing = [n for n, meta in zip(names, found, strict=True) if meta is None]
    return _missing(pointer_name, missing, namespace) if missing else None


@dataclass
class Healer:
    ctx: Context
    # Plan-Job ConfigMaps seen ownerless and Job-less at the last sweep (deleted if still so).
    suspects: set[str] = field(default_factory=set)
    # Damage the webhook reported, per tuning: one damage asks for one re-plan, not one per pod.
    reported: dict[tuple[str, str], str] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except (ApiError, httpx.HTTPError) as exc:
                log.warning("healing pass cut short: %s", exc)
            except Exception:  # a bug here must not stop later passes
                log.exception("healing pass failed")
            await asyncio.sleep(self.ctx.cfg.heal_interval_seconds)

    async def once(self) -> None:
        await self.sweep()
        for key, pointer in sorted(self.ctx.published.items()):
            await self.check(key, pointer)

    async def check(self, key: tuple[str, str], pointer: str) -> Damage | None:
        ns, name = key
        token = TUNING.set(f"{ns}/{name}")
        try:
            damage = await check_generation(self.ctx.client, pointer, ns)
            if damage is None:
                return None
            await self.repair(key, damage, source="healer")
            return damage
        finally:
            TUNING.reset(token)

    async def repair(self, key: tuple[str, str], damage: Damage, *, source: str) -> None:
        """Ask for a re-plan of this tuning: its next pass republishes the generation."""
        from .reconcile import request_replan

        metrics.HEALS.labels(damage.reason).inc()
        log.warning("%s: %s; re-planning to republish", source, damage.message)
        await request_replan(self.ctx, key, f"heal-{damage.reason}-{uuid.uuid4().hex[:8]}")

    async def reported_by_webhook(self, key: tuple[str, str], damage: Damage) -> None:
        if self.reported.get(key) == damage.message:
            return
        self.reported[key] = damage.message
        try:
            await self.repair(key, damage, source="webhook")
        except (ApiError, httpx.HTTPError) as exc:
            self.reported.pop(key, None)
            log.warning("could not ask for a re-plan of %s/%s: %s", *key, exc)

    def repaired(self, key: tuple[str, str]) -> None:
        self.reported.pop(key, None)

    async def sweep(self) -> None:
        c = self.ctx
        jns = c.cfg.namespace
        selector = "app.kubernetes.io/component=plan-job"
        job_list = await c.client.list("batch/v1", "jobs", jns, label_selector=selector)
        configmaps = await c.client.list("v1", "configmaps", jns, label_selector=selector)
        # Listed after the Jobs: a Job's CCLTuning existed before it, so it is in this list.
        live_uids = {t["metadata"].get("uid") for t in await c.client.list(GROUP_VERSION, "ccltunings")}
        by_name = {j["metadata"]["name"]: j for j in job_list}
        for job in job_list:
            uid = (job["metadata"].get("labels") or {}).get(jobs.LABEL_TUNING_UID)
            if uid and uid not in live_uids:
                log.info("deleting plan Job %s/%s: its CCLTuning is gone", jns, job["metadata"]["name"])
                await c.client.delete("batch/v1", "jobs", job["metadata"]["name"], jns)
                metrics.SWEPT.labels("job").inc()
        seen = set()
        for cm in configmaps:
            meta = cm["metadata"]
            labels = meta.get("labels") or {}
            if meta.get("ownerReferences") or labels.get("app.kubernetes.io/component") != "plan-job":
                continue
            name = meta["name"]
            owner_job = by_name.get(jobs.JobNames(labels.get(jobs.LABEL_INPUT, "")).job)
            uid = labels.get(jobs.LABEL_TUNING_UID)
            if owner_job is not None and uid in live_uids:
                owner = jobs.owner_ref({**owner_job, "apiVersion": "batch/v1", "kind": "Job"})
                await c.client.patch("v1", "configmaps", name, {"metadata": {"ownerReferences": [owner]}}, jns)
                metrics.SWEPT.labels("adopted").inc()
            elif uid not in live_uids or name in self.suspects:
                log.info("deleting ownerless plan ConfigMap %s/%s", jns, name)
                await c.client.delete("v1", "configmaps", name, jns)
                metrics.SWEPT.labels("configmap").inc()
            else:
                seen.add(name)
        self.suspects = seen
