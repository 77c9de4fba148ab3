"""A small async Kubernetes REST client (httpx) for what kopf does not do for us.

Credentials: in-cluster service account, else the kubeconfig (via the kubernetes package's
loader). Only merge patches and plain verbs: the same calls work on a real API server and on the
KMock emulator used in tests.
"""

from __future__ import annotations

import builtins
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

USER_AGENT = "ccltune-operator/0.1"
# Server-side conversion to metadata only (what kubectl and client-go's metadata client ask for);
# plain JSON is the fallback a server without it answers with.
_METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status


@dataclass
class Connection:
    server: str
    token: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    _token_read: float = field(default=0.0, repr=False)

    def bearer(self) -> str | None:
        # Projected service-account tokens rotate: re-read the file once a minute.
        if self.token_file and time.monotonic() - self._token_read > 60:
            self.token = Path(self.token_file).read_text().strip()
            self._token_read = time.monotonic()
        return self.token


def connection_from_env() -> Connection:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if host and port and (_SA_DIR / "token").exists():
        return Connection(
            server=f"https://{host}:{port}",
            token_file=str(_SA_DIR / "token"),
            ca_file=str(_SA_DIR / "ca.crt"),
        )
    from kubernetes import client, config  # only for its kubeconfig parser

    cfg = client.Configuration()
    config.load_kube_config(client_configuration=cfg)
    token = None
    # The key name differs across kubernetes-client versions ("authorization", "BearerToken").
    for value in (cfg.api_key or {}).values():
        if value:
            token = str(value).removeprefix("Bearer ").strip()
            break
    return Connection(
        server=cfg.host,
        token=token,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        insecure=not cfg.verify_ssl,
    )


def path_for(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{quote(namespace)}")
    parts.append(plural)
    if name:
        parts.append(quote(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


class KubeClient:
    def __init__(self, conn: Connection, *, timeout: float = 30.0) -> None:
        verify: Any = False if conn.insecure else (conn.ca_file or True)
        cert = (conn.cert_file, conn.key_file) if conn.cert_file and conn.key_file else None
        self._conn = conn
        self._http = httpx.AsyncClient(
            base_url=conn.server, verify=verify, cert=cert, timeout=timeout,
            headers={"User-Agent": USER_AGENT},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      accept: str | None = None) -> Any:
        headers = {"Content-Type": content_type}
        if accept:
            headers["Accept"] = accept
        token = self._conn.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        resp = await self._http.request(method, path, params=params, json=body, headers=headers)
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", resp.text)
            except ValueError:
                message = resp.text
            raise ApiError(resp.status_code, method, path, str(message)[:300])
        return resp.json() if resp.content else None

    async def get(self, api_version: str, plural: str, name: str, namespace: str | None = None
                  ) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self.request("GET", path_for(api_version, plural, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def pod_log(self, name: str, namespace: str, container: str | None = None) -> str | None:
        """The pod's log as text; None when the pod (or its log) is gone."""
        token = self._conn.bearer()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        params = {"container": container} if container else None
        path = path_for("v1", "pods", namespace, name, "log")
        resp = await self._http.get(path, params=params, headers=headers)
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, "GET", path, resp.text[:300])
        return resp.text

    async def get_metadata(self, api_version: str, plural: str, name: str, namespace: str | None = None
                           ) -> dict[str, Any] | None:
        """Only the object's metadata (PartialObjectMetadata): existence checks without the data."""
        try:
            result: dict[str, Any] = await self.request(
                "GET", path_for(api_version, plural, namespace, name), accept=_METADATA_ONLY)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list(self, api_version: str, plural: str, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        body = await self.request("GET", path_for(api_version, plural, namespace), params=params)
        return list(body.get("items") or [])

    async def pages(self, api_version: str, plural: str, namespace: str | None = None,
                    limit: int = 100) -> AsyncIterator[builtins.list[dict[str, Any]]]:
        """List in chunks (limit/continue) so big collections never sit in memory at once."""
        token = None
        while True:
            params = {"limit": str(limit)}
            if token:
                params["continue"] = token
            body = await self.request("GET", path_for(api_version, plural, namespace), params=params)
            yield list(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return

    async def watch(self, api_version: str, plural: str, *, timeout_s: int = 300
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) events, parsed one line at a time. A watch without resourceVersion
        starts with an ADDED event per existing object, streamed rather than listed."""
        headers = {}
        token = self._conn.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        path = path_for(api_version, plural)
        params = {"watch": "true", "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "true"}
        timeout = httpx.Timeout(30.0, read=timeout_s + 30.0)
        async with self._http.stream("GET", path, params=params, headers=headers, timeout=timeout) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                raise ApiError(resp.status_code, "GET", path, resp.text[:300])
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                if kind == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(int(status.get("code") or 500), "WATCH", path, str(status.get("message")))
                if kind != "BOOKMARK":
                    yield kind, event.get("object") or {}

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "POST", path_for(api_version, plural, namespace), body=body)
        return result

    async def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                    namespace: str | None = None, subresource: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "PATCH", path_for(api_version, plural, namespace, name, subresource), body=body,
            content_type="application/merge-patch+json")
        return result

    async def delete(self, api_version: str, plural: str, name: str,
                     namespace: str | None = None) -> bool:
        try:
            await self.request("DELETE", path_for(api_version, plural, namespace, name),
                               body={"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def ensure(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None) -> tuple[dict[str, Any], bool]:
        """Create, or merge-patch when it exists; returns (object, created)."""
        name = body["metadata"]["name"]
        try:
            return await self.create(api_version, plural, body, namespace), True
        except ApiError as exc:
            if exc.status != 409:
                raise
        patch = {k: v for k, v in body.items() if k not in ("apiVersion", "kind")}
        return await self.patch(api_version, plural, name, patch, namespace), False


def event_body(ref: dict[str, Any], type_: str, reason: str, message: str, *, component: str) -> dict[str, Any]:
    """A core/v1 Event about `ref` (apiVersion, kind, name, namespace, uid)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{ref['name']}.", "namespace": ref["namespace"]},
        "involvedObject": ref, "type": type_, "reason": reason, "message": message[:1024],
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
