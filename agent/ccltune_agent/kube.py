"""A small Kubernetes REST client on httpx: get/create/merge-patch/watch, with capped backoff.

The agent needs four verbs on one resource, so it speaks the REST API directly instead of pulling
in the generated client. Auth: in-cluster service account, a kubeconfig, or an explicit URL.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

log = logging.getLogger(__name__)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class ConfigError(ValueError):
    """No usable way to reach the API server; the message says what was tried."""


class KubeClient:
    def __init__(self, server: str, *, token: str | None = None, token_file: Path | None = None,
                 verify: bool | str | ssl.SSLContext = True, timeout: float = 30.0) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._token_file = token_file
        self._http = httpx.AsyncClient(base_url=self.server, verify=verify,
                                       timeout=httpx.Timeout(timeout, read=None))
        self._timeout = timeout

    @classmethod
    def from_environment(cls, api_server: str | None = None, kubeconfig: str | None = None,
                         token_file: Path | None = None) -> KubeClient:
        """Explicit URL > in-cluster service account > KUBECONFIG / ~/.kube/config."""
        if api_server:
            return cls(api_server, token_file=token_file)
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port and (SA_DIR / "token").exists():
            ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
            host = f"[{host}]" if ":" in host else host
            # Bound service-account tokens rotate: re-read the file for every request.
            return cls(f"https://{host}:{port}", token_file=SA_DIR / "token", verify=ctx)
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(
            Path.home() / ".kube" / "config")
        if not Path(path).exists():
            raise ConfigError("no API server: not in a cluster (KUBERNETES_SERVICE_HOST unset), no "
                              f"kubeconfig at {path}, and no --api-server given")
        return cls._from_kubeconfig(Path(path))

    @classmethod
    def _from_kubeconfig(cls, path: Path) -> KubeClient:
        try:
            cfg = yaml.safe_load(path.read_text()) or {}
            ctx_name = cfg["current-context"]
            ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
            cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
            user: dict[str, Any] = next((u["user"] for u in cfg.get("users", []) if u["name"] == ctx.get("user")), {}) or {}
            server = cluster["server"]
        except (OSError, yaml.YAMLError, KeyError, StopIteration, TypeError) as exc:
            raise ConfigError(f"kubeconfig {path}: cannot find server of the current context ({exc!r})") from None
        verify: bool | ssl.SSLContext = not cluster.get("insecure-skip-tls-verify", False)
        if verify:
            sslctx = ssl.create_default_context()
            if cluster.get("certificate-authority-data"):
                sslctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
            elif cluster.get("certificate-authority"):
                sslctx.load_verify_locations(cafile=cluster["certificate-authority"])
            cert = _material(user, "client-certificate")
            key = _material(user, "client-key")
            if cert and key:
                sslctx.load_cert_chain(cert, key)
            verify = sslctx
        token_file = Path(user["tokenFile"]) if user.get("tokenFile") else None
        return cls(server, token=user.get("token"), token_file=token_file, verify=verify)

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._token
        if self._token_file is not None:
            try:
                token = self._token_file.read_text().strip()
            except OSError as exc:
                log.warning("cannot read token file %s: %s", self._token_file, exc)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      params: dict[str, str] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        resp = await self._http.request(method, path, content=data, params=params, timeout=self._timeout,
                                        headers=self._headers(content_type if data is not None else None))
        if resp.status_code >= 400:
            raise _error(resp.status_code, resp.text)
        return resp.json() if resp.content else {}

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events (JSON lines) until the server ends the stream."""
        query = {**params, "watch": "true"}
        async with self._http.stream("GET", path, params=query, headers=self._headers()) as resp:
            if resp.status_code >= 400:
                raise _error(resp.status_code, (await resp.aread()).decode(errors="replace"))
            async for line in resp.aiter_lines():
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError:
                        log.warning("ignoring a watch line that is not JSON: %.80s", line)

    async def aclose(self) -> None:
        await self._http.aclose()


def _material(user: dict[str, Any], key: str) -> str | None:
    """A kubeconfig client cert/key as a file path (inline *-data is written to a 0600 temp file)."""
    if user.get(f"{key}-data"):
        fd, name = tempfile.mkstemp(prefix="ccltune-agent-", suffix=".pem")
        with os.fdopen(fd, "wb") as fh:
            fh.write(base64.b64decode(user[f"{key}-data"]))
        return name
    value = user.get(key)
    return str(value) if value else None


def _error(status: int, text: str) -> ApiError:
    try:
        doc = json.loads(text)
        return ApiError(status, str(doc.get("reason", "")), str(doc.get("message", ""))[:500])
    except ValueError:
        return ApiError(status, "", text[:500])


def retryable(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError | ApiError)


async def with_backoff(what: str, fn: Callable[[], Awaitable[T]], stop: asyncio.Event,
                       base: float = 1.0, cap: float = 60.0) -> T | None:
    """Run fn until it succeeds or `stop` is set; waits grow 2x to `cap` (full jitter).

    Every API error is retried: a 403 from missing RBAC or a 422 from an old CRD is fixed by an
    operator, not by exiting, and exiting would only crash-loop the DaemonSet pod.
    """
    attempt = 0
    while not stop.is_set():
        try:
            return await fn()
        except Exception as exc:
            if not retryable(exc):
                raise
            delay = random.uniform(0, min(cap, base * (2 ** attempt))) if attempt else min(cap, base) / 2
            attempt += 1
            log.warning("%s failed (attempt %d): %s; retrying in %.1fs", what, attempt, exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
    return None
