"""Liveness and readiness over plain HTTP (GET /healthz, GET /readyz) for the kubelet probes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Health:
    """live: the agent loop ticked recently. ready: a NodeTopology has been published."""

    def __init__(self, stall_after: float) -> None:
        self.stall_after = stall_after
        self.last_tick = time.monotonic()
        self.ready = False
        self.detail = "starting"

    def tick(self) -> None:
        self.last_tick = time.monotonic()

    def live(self) -> bool:
        return time.monotonic() - self.last_tick < self.stall_after


async def serve(health: Health, host: str, port: int) -> asyncio.Server:
    routes: dict[str, Callable[[], tuple[bool, str]]] = {
        "/healthz": lambda: (health.live(), "ok" if health.live() else "agent loop stalled"),
        "/livez": lambda: (health.live(), "ok" if health.live() else "agent loop stalled"),
        "/readyz": lambda: (health.ready, health.detail),
    }

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b"\n", b""):
                pass  # drain headers
            parts = line.decode(errors="replace").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            if path in routes:
                ok, text = routes[path]()
                status = "200 OK" if ok else "503 Service Unavailable"
            else:
                status, text = "404 Not Found", "not found"
            body = (text + "\n").encode()
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    log.info("health endpoints on %s", ", ".join(str(s.getsockname()) for s in server.sockets))
    return server
