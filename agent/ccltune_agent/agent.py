"""The DaemonSet loop: probe, publish, wait for the interval, SIGHUP or a reprobe request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ccltune.api.common import Condition
from ccltune.topology.nccl_xml import write_nccl_xml

from .health import Health, serve
from .kube import ApiError, KubeClient, with_backoff
from .nvml import NvmlSource, RealNvml, ReplayNvml
from .probe import ProbeResult, probe
from .publish import BASE, REPROBE_REQUEST, REPROBE_SERVED, Publisher

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    node_name: str
    sysfs_root: Path = Path("/")
    cpuinfo: Path | None = None  # None: <sysfs_root>/proc/cpuinfo
    nvml_recording: Path | None = None
    no_nvml: bool = False
    interval: float = 300.0
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    owner: str = "node"  # node | pod | none
    pod_name: str | None = None
    pod_uid: str | None = None
    pod_namespace: str | None = None
    xml_out: Path | None = None
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    once: bool = False


def conditions_for(result: ProbeResult) -> list[Condition]:
    if result.nvml_error:
        degraded = Condition(type="Degraded", status="True", reason="NvmlUnavailable",
                             message=f"NVML unavailable: {result.nvml_error}. Published what sysfs gives "
                                     "(PCIe tree, NICs); GPU names, NVLinks and P2P are missing."[:1024])
    elif result.warnings:
        degraded = Condition(type="Degraded", status="True", reason="SysfsEntriesSkipped",
                             message=f"{len(result.warnings)} sysfs entries skipped: "
                                     + "; ".join(result.warnings[:5])[:900])
    else:
        degraded = Condition(type="Degraded", status="False", reason="ProbeComplete",
                             message="NVML and sysfs probes complete")
    spec = result.spec
    ready = Condition(type="Ready", status="True", reason="Published",
                      message=f"{len(spec.gpus)} GPUs, {len(spec.nics)} NICs; {spec.content_hash}")
    return [degraded, ready]


class Agent:
    def __init__(self, cfg: AgentConfig, client: KubeClient) -> None:
        self.cfg = cfg
        self.client = client
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()
        self.requested: str | None = None  # a reprobe request seen on the object, not yet served
        self.served: str | None = None
        self.health = Health(stall_after=max(600.0, 3 * cfg.interval))
        self.publisher: Publisher | None = None

    def nvml(self) -> NvmlSource | None:
        if self.cfg.no_nvml:
            return None
        return ReplayNvml(self.cfg.nvml_recording) if self.cfg.nvml_recording else RealNvml()

    async def owner_ref(self) -> dict[str, Any] | None:
        # A cluster-scoped object may only be owned by a cluster-scoped one (owner-reference-v1-meta);
        # the Node is that owner: its NodeTopology goes when the node goes, not on agent restarts.
        if self.cfg.owner == "node":
            path = f"/api/v1/nodes/{self.cfg.node_name}"

            async def read_node() -> dict[str, Any]:
                try:
                    return await self.client.request("GET", path)
                except ApiError as exc:
                    if exc.status in (403, 404):  # no RBAC on nodes, or a wrong NODE_NAME: publish anyway
                        log.error("cannot read %s for the owner reference (%s); publishing without owner",
                                  path, exc)
                        return {}
                    raise

            node = await with_backoff("read Node", read_node, self.stop, self.cfg.backoff_base,
                                      self.cfg.backoff_cap)
            uid = ((node or {}).get("metadata") or {}).get("uid")
            return {"apiVersion": "v1", "kind": "Node", "name": self.cfg.node_name, "uid": uid} if uid else None
        if self.cfg.owner == "pod" and self.cfg.pod_name and self.cfg.pod_uid:
            return {"apiVersion": "v1", "kind": "Pod", "name": self.cfg.pod_name, "uid": self.cfg.pod_uid,
                    "controller": True, "blockOwnerDeletion": False}
        return None

    def _signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGHUP:
            log.info("SIGHUP: re-probing")
            self.wake.set()
        else:
            log.info("%s: shutting down", sig.name)
            self.stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signal, sig)
        server = await serve(self.health, self.cfg.health_host, self.cfg.health_port)
        watcher: asyncio.Task[None] | None = None
        try:
            owner = await self.owner_ref()
            if self.stop.is_set():
                return 0
            pod = f"{self.cfg.pod_namespace}/{self.cfg.pod_name}" if self.cfg.pod_name else None
            self.publisher = Publisher(self.client, self.cfg.node_name, owner, pod)
            watcher = asyncio.create_task(self.watch())
            while not self.stop.is_set():
                self.health.tick()
                await self.cycle()
                if self.cfg.once:
                    break
                await self.sleep()
        finally:
            if watcher:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            server.close()
            await server.wait_closed()
            await self.client.aclose()
        log.info("agent stopped")
        return 0

    async def sleep(self) -> None:
        waits = [asyncio.create_task(self.wake.wait()), asyncio.create_task(self.stop.wait())]
        await asyncio.wait(waits, timeout=self.cfg.interval, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        self.wake.clear()

    async def cycle(self) -> None:
        request = self.requested
        try:
            result = await asyncio.to_thread(probe, self.cfg.node_name, self.cfg.sysfs_root, self.nvml(),
                                           self.cfg.cpuinfo)
        except Exception:  # a probe bug must not kill the DaemonSet pod; try again next cycle
            log.exception("probe failed; retrying at the next interval")
            self.health.detail = "probe failed"
            return
        if self.cfg.xml_out:
            try:
                self.cfg.xml_out.write_text(write_nccl_xml(result.spec))
            except OSError as exc:
                log.error("cannot write NCCL topology XML to %s: %s", self.cfg.xml_out, exc)
        assert self.publisher is not None
        publisher = self.publisher
        conds = conditions_for(result)
        try:
            done = await with_backoff("publish NodeTopology", lambda: publisher.publish(result.spec, conds),
                                      self.stop, self.cfg.backoff_base, self.cfg.backoff_cap)
        except Exception:  # not an API error: a bug; keep the pod alive and try next cycle
            log.exception("publishing failed; retrying at the next interval")
            return
        if done is None:
            return
        self.health.ready = True
        self.health.detail = f"published {result.spec.content_hash}"
        if request and request != self.served:
            ok = await with_backoff("record reprobe-served", lambda: publisher.mark_served(request),
                                    self.stop, self.cfg.backoff_base, self.cfg.backoff_cap)
            if ok is not None:
                self.served = request
                log.info("served reprobe request %r", request)
                if self.requested == request:
                    self.requested = None

    async def watch(self) -> None:
        """Watch our own NodeTopology for `ccltune.io/reprobe-request` changes (reconnects forever)."""
        params = {"fieldSelector": f"metadata.name={self.cfg.node_name}", "timeoutSeconds": "300"}
        attempt = 0
        while not self.stop.is_set():
            try:
                async for event in self.client.watch(BASE, params):
                    attempt = 0
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        log.warning("watch error event: %.200s", obj.get("message"))
                        break
                    meta = obj.get("metadata") or {}
                    if meta.get("name") != self.cfg.node_name:
                        continue  # servers that ignore fieldSelector send every object
                    if event.get("type") == "DELETED":
                        log.info("NodeTopology %s was deleted; re-publishing", self.cfg.node_name)
                        self.wake.set()
                        continue
                    ann = meta.get("annotations") or {}
                    req, served = ann.get(REPROBE_REQUEST), ann.get(REPROBE_SERVED)
                    if req and req != served and req != self.requested and req != self.served:
                        log.info("reprobe requested: %r", req)
                        self.requested = req
                        self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                attempt += 1
                delay = min(self.cfg.backoff_cap, self.cfg.backoff_base * 2 ** min(attempt, 10))
                log.warning("watch of NodeTopology %s failed: %s; again in %.1fs", self.cfg.node_name, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=delay)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=self.cfg.backoff_base)
