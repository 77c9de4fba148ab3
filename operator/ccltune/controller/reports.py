"""Follow NodeTopology changes and re-plan the CCLTunings that use them.

Our own streaming watch instead of a kopf handler: reports are large (~40 KB of JSON each) and
kopf would hold every one of them at startup; here one event is in memory at a time and only a
content hash per node is kept (in Context.inputs).
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from .kube import ApiError
from .reconcile import GROUP_VERSION, Context, nodes_changed, report_hash, request_replan

log = logging.getLogger("ccltune.reports")


async def follow(ctx: Context) -> None:
    backoff = 1.0
    while True:
        try:
            async for kind, obj in ctx.client.watch(GROUP_VERSION, "nodetopologies"):
                backoff = 1.0
                if not (ctx.inputs or ctx.waiting):
                    continue  # no tuning has used or awaited a report yet
                meta = obj.get("metadata") or {}
                node = (obj.get("spec") or {}).get("nodeName") or meta.get("name", "")
                content = None if kind == "DELETED" else report_hash(obj)
                for key in await nodes_changed(ctx, node, content):
                    log.info("NodeTopology of %s changed (%s): re-planning %s/%s", node, content, *key)
                    await request_replan(ctx, key, f"{node}@{content or 'deleted'}")
        except asyncio.CancelledError:
            raise
        except (ApiError, httpx.HTTPError, ValueError) as exc:
            log.warning("NodeTopology watch ended (%s); reconnecting in %.0fs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)
