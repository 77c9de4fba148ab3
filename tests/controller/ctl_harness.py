"""A Kubernetes stand-in for the operator's end-to-end tests: KMock plus what a cluster would do.

KMock's KubernetesEmulator stores objects and serves list/watch/get/create/patch/delete over HTTP on
127.0.0.1. It has no controllers, no status subresource, no metadata bookkeeping and no label
filtering. Where a real cluster would act, this harness plays the part explicitly:

* API server: uid, creationTimestamp, generation (bumped on spec change), resourceVersion, and the
  status subresource (PATCH .../status changes only status; the main endpoint ignores status);
  callers are identified by their bearer token, like service accounts. Writes are validated as
  a real API server would (ctl_apiserver.py: names, labels, ConfigMap size and immutability,
  CRD schema and CEL) and refused with 422 (413 for an oversized body) without being stored.
* CRD registration: the CRDs in crds/*.yaml become served resources (apiextensions' job).
* Garbage collector: objects whose every owner is gone (or in another namespace) are deleted
  (background propagation).
* Kubelet + Job controller: a Job's container command runs as a local process; its exit code sets
  the Job's status (Complete/Failed), or a test makes the "node" fail it with a reason. An
  Indexed Job (completionMode Indexed) runs one process per index with JOB_COMPLETION_INDEX set,
  in reverse index order, each retried up to backoffLimitPerIndex times; its status keeps
  completedIndexes/failedIndexes, and it fails with reason FailedIndexes as batch/v1 does.
* kubelet for agents: the agent DaemonSet's pods are not scheduled; tests start agent processes.

Every request is recorded (identity, method, path, verb) for the Helm chart's RBAC test.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import httpx
import kmock
import yaml
from ctl_apiserver import MAX_REQUEST, Validator, load_crds, status_body
from kmock._internal import enums
from kmock._internal.k8s import KubernetesError

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
STANDIN = Path(__file__).resolve().parent / "standin"  # nccl-tests / mpirun stand-ins

CORE = {
    "v1/nodes": ("Node", False),
    "v1/pods": ("Pod", True),
    "v1/configmaps": ("ConfigMap", True),
    "v1/events": ("Event", True),
    "v1/namespaces": ("Namespace", False),
    "v1/serviceaccounts": ("ServiceAccount", True),
    "apps/v1/daemonsets": ("DaemonSet", True),
    "batch/v1/jobs": ("Job", True),
    "events.k8s.io/v1/events": ("Event", True),
    "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations": ("MutatingWebhookConfiguration", False),
    "admissionregistration.k8s.io/v1/validatingwebhookconfigurations": ("ValidatingWebhookConfiguration", False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False),
}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
IDENTITIES = ("operator", "agent", "plan-job", "harness")


def _verb(method: str, name: str | None, params: dict[str, str]) -> str:
    if method == "GET":
        return "watch" if params.get("watch") in ("true", "1") else ("get" if name else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(
        method, "delete" if name else "deletecollection")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cpu_share() -> float:
    """The share of a core a process can expect now: 1 on an idle machine, cores/load under load."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return min(1.0, (os.cpu_count() or 1) / max(load, 1e-9))


class ApiServer(kmock.KubernetesEmulator):  # type: ignore[misc]
    """KubernetesEmulator + the API server duties listed in the module docstring."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.api_log: list[dict[str, Any]] = []
        self.status_subresource: set[str] = set()  # "group/version/plural"
        self.rv = 0
        self.validator = Validator()
        self.validating = True  # off: admit anything, as a cluster with an older CRD would
        self.rejected: list[dict[str, Any]] = []  # the Status bodies of refused writes
        # Faults tests inject: a request whose record a `reset_if` hook accepts loses its
        # connection unserved (as when the API server restarts); `after_served` hooks see each
        # request once it took effect, before the reply goes out (e.g. SIGKILL the caller there).
        self.reset_if: list[Callable[[dict[str, Any]], bool]] = []
        self.after_served: list[Callable[[dict[str, Any]], None]] = []
        self.pod_logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> what its container printed

    def _key(self, request: Any) -> str:
        r = request.resource
        return f"{r.group}/{r.version}/{r.plural}"

    async def _handle(self, request: Any) -> Any:
        # KMock keeps every request for assertions and matches each new one by scanning them all
        # (quadratic over a test). We keep our own log, so trim KMock's to the current request.
        del self._requests[:-1]
        for payload in self._payloads:
            payload._requests.clear()
        auth = request.headers.get("Authorization", "")
        who = auth.removeprefix("Bearer ").strip() or "anonymous"
        record: dict[str, Any] | None = None
        if request.resource is not None and request.resource.plural:  # discovery needs no RBAC
            r = request.resource
            record = {
                "identity": who, "method": str(request.method.value).upper(), "path": request.url.path,
                "verb": _verb(str(request.method.value).upper(), request.name, dict(request.params)),
                "group": r.group or "", "version": r.version, "resource": r.plural,
                "subresource": request.subresource or "", "namespace": request.namespace or "",
            }
            self.api_log.append(record)
            record = {**record, "name": request.name or ""}  # for the hooks only
        if record is not None and any(hook(record) for hook in self.reset_if):
            request._raw_request.transport.abort()
            return aiohttp.web.Response(status=500)  # never delivered: the connection is gone
        r = request.resource
        if r is not None and r.plural == "pods" and request.subresource == "log" and request.name:
            text = self.pod_logs.get((request.namespace or "", request.name))
            if text is None:
                return aiohttp.web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
            return aiohttp.web.Response(text=text)  # kubelet's plain-text log stream
        if request.resource is not None:
            self._play_apiserver(request)
            self._validate(request)
        response = await super()._handle(request)
        if record is not None:
            for served in self.after_served:
                served(record)
        return response

    def _validate(self, request: Any) -> None:
        """Refuse what a real API server would, before KMock stores it."""
        data = request.data
        if request.action not in (enums.action.CREATE, enums.action.UPDATE) or not isinstance(data, dict):
            return
        r = request.resource
        info = self.resources.get(self._key(request))
        kind = getattr(info, "kind", None) or r.plural
        api_version = f"{r.group}/{r.version}" if r.group else r.version
        size = len(json.dumps(data))
        if size > MAX_REQUEST:
            self.rejected.append({"code": 413, "kind": kind, "size": size})
            raise KubernetesError(status=413, reason="RequestEntityTooLarge",
                                  message=f"the request body of {size} bytes is over the server's limit")
        old = None
        new = data
        if request.action == enums.action.UPDATE:
            old = self._current(request)
            if old is None:
                return  # KMock answers 404
            new = _merge(old, data) if str(request.method.value).upper() == "PATCH" else data
        if not self.validating:
            return
        causes = self.validator.check(kind, api_version, r.plural, new, old)
        if old is not None and causes:
            # Ratcheting (Kubernetes >= 1.30): a value that was already invalid and is unchanged
            # does not block an update, e.g. kopf's annotations on an object admitted earlier.
            known = {(c.field, c.message) for c in self.validator.check(kind, api_version, r.plural, old, None)}
            causes = [c for c in causes if (c.field, c.message) not in known]
        if request.subresource == "status":  # the status endpoint answers for status only
            causes = [c for c in causes if c.field.startswith("status")]
        if causes:
            name = (new.get("metadata") or {}).get("name") or request.name or ""
            body = status_body(kind, name, causes)
            self.rejected.append(body)
            raise KubernetesError(status=422, reason="Invalid", message=body["message"],
                                  details=body["details"])

    def _play_apiserver(self, request: Any) -> None:
        data = request.data
        self.rv += 1
        if request.action == enums.action.CREATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["generation"] = 1
            meta["resourceVersion"] = str(self.rv)
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
        elif request.action == enums.action.UPDATE and isinstance(data, dict) and request.name:
            has_status = self._key(request) in self.status_subresource
            if has_status and request.subresource == "status":
                for key in [k for k in data if k not in ("status", "metadata")]:
                    del data[key]
            elif has_status:
                data.pop("status", None)
            current = self._current(request)
            meta = data.setdefault("metadata", {}) if isinstance(data.get("metadata", {}), dict) else {}
            meta["resourceVersion"] = str(self.rv)
            if current is not None and "spec" in data:
                merged = _merge(current.get("spec") or {}, data["spec"])
                if merged != (current.get("spec") or {}):
                    meta["generation"] = int(current.get("metadata", {}).get("generation") or 1) + 1

    def _current(self, request: Any) -> dict[str, Any] | None:
        for (res, ns, name), obj in self.objects.items():
            if res == request.resource and ns == request.namespace and name == request.name and not obj.deleted:
                return dict(obj.raw)
        return None

    def live(self) -> list[tuple[Any, str | None, str, dict[str, Any]]]:
        return [(res, ns, name, obj.raw) for (res, ns, name), obj in list(self.objects.items()) if not obj.deleted]


def _merge(base: Any, patch: Any) -> Any:
    """RFC 7386 merge patch: null deletes, also under a key the target does not have yet."""
    if not isinstance(patch, dict):
        return patch
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


class _ApiHttpServer(aiohttp.test_utils.RawTestServer):
    """aiohttp's 1 MiB body limit is below the API server's: take bodies up to 3 MiB + 1 KiB, so
    the validator answers 413 above 3 MiB and 422 for a ConfigMap over 1 MiB, as a cluster does."""

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()

        def request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
            return aiohttp.web.BaseRequest(message, payload, protocol, writer, task, loop,
                                           client_max_size=MAX_REQUEST + 1024)

        server = aiohttp.web.Server(self._handler, loop=loop, debug=debug, request_factory=request, **kwargs)
        return aiohttp.web.ServerRunner(server, debug=debug, **kwargs)


class Cluster:
    """The emulator in a background thread, a sync client, and the controllers we play."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.server: ApiServer | None = None
        self.port = 0
        self.kubelet = Kubelet(self)
        self.gc_enabled = True
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("KMock did not start")
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": "Bearer harness"}, timeout=30)
        self._register_builtin()

    # -- the emulator thread -------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with ApiServer() as srv, kmock.Server(srv, server_cls=_ApiHttpServer) as server:
            self.server = srv
            self.port = server.port
            self._ready.set()
            tasks = [asyncio.create_task(self._garbage_collector()), asyncio.create_task(self.kubelet.run())]
            await self._stop.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _garbage_collector(self) -> None:
        """Plays kube-controller-manager's garbage collector (background deletion)."""
        assert self.server is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}",
                                     headers={"Authorization": "Bearer harness"}) as client:
            while True:
                await asyncio.sleep(0.2)
                if not self.gc_enabled:
                    continue
                live = self.server.live()
                where = {raw.get("metadata", {}).get("uid"): ns for _, ns, _, raw in live}
                for res, ns, name, raw in live:
                    owners = raw.get("metadata", {}).get("ownerReferences") or []
                    # An owner in another namespace counts as absent, as the real collector
                    # treats it (owner references cannot cross namespaces).
                    if owners and all(o.get("uid") not in where or where[o.get("uid")] not in (None, ns)
                                      for o in owners):
                        await client.delete(_path(res, ns, name))

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.http.close()

    # -- setup ------------------------------------------------------------------------------
    def _register_builtin(self) -> None:
        assert self.server is not None
        for key, (kind, namespaced) in CORE.items():
            self.server.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS)
        self.server.resources["apps/v1/daemonsets"].subresources.add("status")
        self.server.resources["batch/v1/jobs"].subresources.add("status")

    def load_crds(self) -> list[str]:
        """Apply crds/*.yaml and serve them (what apiextensions-apiserver does on a real cluster)."""
        assert self.server is not None
        names = []
        self.server.validator.crds.update(load_crds(sorted(CRDS.glob("*.yaml"))))
        for path in sorted(CRDS.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            self.create(crd)
            spec = crd["spec"]
            for version in spec["versions"]:
                key = f"{spec['group']}/{version['name']}/{spec['names']['plural']}"
                subs = set(version.get("subresources") or {})
                self.server.resources[key] = kmock.ResourceInfo(
                    kind=spec["names"]["kind"], singular=spec["names"]["singular"],
                    namespaced=spec["scope"] == "Namespaced", verbs=VERBS,
                    shortnames=set(spec["names"].get("shortNames") or []), subresources=subs)
                if "status" in subs:
                    self.server.status_subresource.add(key)
            names.append(crd["metadata"]["name"])
        return names

    def install_mpijob_crd(self) -> None:
        """What installing the Kubeflow MPI Operator registers: the MPIJob CRD, kubeflow.org/v2beta1
        (kubeflow/mpi-operator manifests/base/kubeflow.org_mpijobs.yaml; schema left open here)."""
        assert self.server is not None
        self.create({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                     "metadata": {"name": "mpijobs.kubeflow.org"},
                     "spec": {"group": "kubeflow.org", "scope": "Namespaced",
                              "names": {"kind": "MPIJob", "plural": "mpijobs", "singular": "mpijob"},
                              "versions": [{"name": "v2beta1", "served": True, "storage": True,
                                            "subresources": {"status": {}}}]}})
        key = "kubeflow.org/v2beta1/mpijobs"
        self.server.resources[key] = kmock.ResourceInfo(kind="MPIJob", singular="mpijob", namespaced=True,
                                                        verbs=VERBS, subresources={"status"})
        self.server.status_subresource.add(key)

    @contextlib.contextmanager
    def admitting_anything(self) -> Iterator[None]:
        """Writes skip validation meanwhile: objects an older CRD (or none) would have admitted."""
        assert self.server is not None
        self.server.validating = False
        try:
            yield
        finally:
            self.server.validating = True

    def kubeconfig(self, identity: str) -> Path:
        """A kubeconfig whose bearer token names the caller (how the log tells clients apart)."""
        path = self.workdir / f"kubeconfig-{identity}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": identity, "user": {"token": identity}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": identity}}],
        }))
        return path

    # -- a sync client (the harness's own requests are logged as identity "harness") ---------
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        resp = self.http.post(_collection(obj["apiVersion"], _plural(obj), meta.get("namespace")), json=obj)
        _check(resp)
        result: dict[str, Any] = resp.json()
        return result

    def get(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        resp = self.http.get(_collection(api_version, plural, namespace) + f"/{name}")
        if resp.status_code == 404:
            return None
        _check(resp)
        result: dict[str, Any] = resp.json()
        return result

    def list(self, api_version: str, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        resp = self.http.get(_collection(api_version, plural, namespace))
        _check(resp)
        return list(resp.json().get("items") or [])

    def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any],
              namespace: str | None = None, subresource: str = "") -> dict[str, Any]:
        path = _collection(api_version, plural, namespace) + f"/{name}" + (f"/{subresource}" if subresource else "")
        resp = self.http.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
        _check(resp)
        result: dict[str, Any] = resp.json()
        return result

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> None:
        resp = self.http.delete(_collection(api_version, plural, namespace) + f"/{name}")
        if resp.status_code != 404:
            _check(resp)

    def wait(self, what: str, fn: Callable[[], Any], timeout: float = 60, every: float = 0.2) -> Any:
        """Poll `fn` until it returns something true. `timeout` is a hang guard in seconds of
        machine time: a second counts at the share of a core the machine leaves us (`cpu_share`),
        so a loaded machine (the suite beside `stress`) gets longer before a wait fails."""
        spent, last = 0.0, time.monotonic()
        while True:
            value = fn()
            if value:
                return value
            now = time.monotonic()
            spent += (now - last) * cpu_share()
            last = now
            if spent > timeout:
                raise AssertionError(f"timed out after {timeout}s of machine time waiting for {what}")
            time.sleep(every)

    def api_log(self) -> builtins.list[dict[str, Any]]:
        assert self.server is not None
        return list(self.server.api_log)


class Kubelet:
    """Plays kubelet and the Job controller for plan Jobs: runs the container command locally."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.hold = False  # tests hold Jobs pending to act "mid-plan"
        self.fail_with: tuple[str, str] | None = None  # (reason, message) the "node" fails Jobs with
        self.fail_indexes: set[int] = set()  # Indexed Jobs: indexes whose pods the "node" kills
        self.index_runs: dict[str, list[int]] = {}  # Indexed Job -> indexes in the order run
        self.started: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        # Benchmark runs: env for the stand-ins (e.g. CCLTUNE_STANDIN_CLUSTER), started runs, their
        # processes, and the runs a test expired.
        self.standin_env: dict[str, str] = {}
        self.benchmarks: list[str] = []
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.image_files: dict[str, Path] = {}  # a path in an image -> the local file playing it
        self.expired: set[str] = set()

    async def run(self) -> None:
        srv = self.cluster.server
        assert srv is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.cluster.port}",
                                     headers={"Authorization": "Bearer harness"}, timeout=60) as client:
            while True:
                await asyncio.sleep(0.2)
                if self.hold:
                    continue
                for res, ns, name, raw in srv.live():
                    if res.plural not in ("jobs", "mpijobs") or raw.get("status") or f"{ns}/{name}" in self.started:
                        continue
                    self.started.append(f"{ns}/{name}")
                    bench = (raw["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "benchmark"
                    run = self._run_benchmark(client, ns or "", name, raw) if bench else self._run_job(client, ns, name, raw)
                    task = asyncio.create_task(run)
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _run_job(self, client: httpx.AsyncClient, ns: str | None, name: str, job: dict[str, Any]) -> None:
        path = _path_for("batch/v1", "jobs", ns, name) + "/status"
        await client.patch(path, json={"status": {"active": 1, "startTime": _now()}},
                           headers={"Content-Type": "application/merge-patch+json"})
        if self.fail_with is not None:
            reason, message = self.fail_with
            await self._finish(client, path, ok=False, reason=reason, message=message)
            return
        if job["spec"].get("completionMode") == "Indexed":
            await self._run_indexed(client, path, name, job)
            return
        code = await self._run_pod(name, job, {})
        await self._finish(client, path, ok=code == 0, reason="BackoffLimitExceeded",
                           message=f"Job has reached the specified backoff limit (exit code {code})")

    async def _run_pod(self, name: str, job: dict[str, Any], extra_env: dict[str, str]) -> int:
        container = job["spec"]["template"]["spec"]["containers"][0]
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if argv and argv[0] == "python":
            argv[0] = sys.executable
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig("plan-job")), **extra_env}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        suffix = f"-{extra_env['JOB_COMPLETION_INDEX']}" if extra_env else ""
        with open(self.cluster.workdir / f"job-{name}{suffix}.log", "ab") as log:
            proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            return await proc.wait()

    async def _run_indexed(self, client: httpx.AsyncClient, path: str, name: str, job: dict[str, Any]) -> None:
        """Every index's pod, last index first (so completion order differs from index order)."""
        spec = job["spec"]
        retries = int(spec.get("backoffLimitPerIndex", 0))
        done: list[int] = []
        failed: list[int] = []
        runs = self.index_runs.setdefault(name, [])
        for index in reversed(range(int(spec["completions"]))):
            for _attempt in range(retries + 1):
                runs.append(index)
                killed = index in self.fail_indexes
                code = 137 if killed else await self._run_pod(name, job, {"JOB_COMPLETION_INDEX": str(index)})
                if code == 0:
                    break
            (done if code == 0 else failed).append(index)
            status = {"completedIndexes": _index_list(done), "succeeded": len(done), "failed": len(failed),
                      **({"failedIndexes": _index_list(failed)} if failed else {})}
            await client.patch(path, json={"status": status}, headers={"Content-Type": "application/merge-patch+json"})
        cond = ({"type": "Failed", "status": "True", "reason": "FailedIndexes", "message": "Job has failed indexes",
                 "lastTransitionTime": _now()} if failed else
                {"type": "Complete", "status": "True", "lastTransitionTime": _now()})
        await client.patch(path, json={"status": {"active": 0, "conditions": [cond]}},
                           headers={"Content-Type": "application/merge-patch+json"})

    async def _run_benchmark(self, client: httpx.AsyncClient, ns: str, name: str, obj: dict[str, Any]) -> None:
        """Plays the MPI operator (MPIJob -> launcher pod, kubeflow.org/v2beta1 conditions) or the Job
        controller for a benchmark run: the launcher's script runs locally with the stand-in mpirun
        and all_reduce_perf (tests/controller/standin), its output streamed into the pod's log."""
        srv = self.cluster.server
        assert srv is not None
        mpi = obj["kind"] == "MPIJob"
        api = "kubeflow.org/v2beta1" if mpi else "batch/v1"
        path = _path_for(api, "mpijobs" if mpi else "jobs", ns, name) + "/status"
        if mpi:
            template = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
            pod_name = f"{name}-launcher-{uuid.uuid4().hex[:5]}"
            labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": "launcher"}
            running = [{"type": "Created", "status": "True", "lastTransitionTime": _now()},
                       {"type": "Running", "status": "True", "lastTransitionTime": _now()}]
            await client.patch(path, json={"status": {"conditions": running, "startTime": _now()}},
                               headers={"Content-Type": "application/merge-patch+json"})
        else:
            template = obj["spec"]["template"]
            pod_name = f"{name}-{uuid.uuid4().hex[:5]}"
            labels = {"batch.kubernetes.io/job-name": name}
            await client.patch(path, json={"status": {"active": 1, "startTime": _now()}},
                               headers={"Content-Type": "application/merge-patch+json"})
        container = template["spec"]["containers"][0]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": ns, "labels": {**template["metadata"].get("labels", {}), **labels}},
               "spec": {"containers": [container]}, "status": {"phase": "Running"}}
        await client.post(_collection("v1", "pods", ns), json=pod)
        self.benchmarks.append(f"{ns}/{name}")
        # The ranks run in the workers (MPIJob) or the Job's pod: their volumes and init containers.
        ranks = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"] if mpi else template["spec"]
        mounts = await self._pod_volumes(ranks, name)
        container_env = {e["name"]: _mapped(e.get("value", ""), mounts) for e in container.get("env") or []}
        env = {**os.environ, **container_env, **self.standin_env,
               "PATH": f"{STANDIN}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        proc = await asyncio.create_subprocess_exec(*container["command"], *container.get("args", []), env=env,
                                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                    start_new_session=True)
        self.processes[f"{ns}/{name}"] = proc
        key = (ns, pod_name)
        srv.pod_logs[key] = ""
        assert proc.stdout is not None
        async for line in proc.stdout:
            srv.pod_logs[key] += line.decode(errors="replace")
        code = await proc.wait()
        if f"{ns}/{name}" in self.expired:
            return  # expire() wrote the outcome
        if mpi:
            cond = {"type": "Succeeded" if code == 0 else "Failed", "status": "True", "lastTransitionTime": _now(),
                    "reason": "MPIJobSucceeded" if code == 0 else "MPIJobFailed", "message": f"launcher exit code {code}"}
            await client.patch(path, json={"status": {"conditions": [*running, cond], "completionTime": _now()}},
                               headers={"Content-Type": "application/merge-patch+json"})
        else:
            await self._finish(client, path, ok=code == 0, reason="BackoffLimitExceeded",
                               message=f"Job has reached the specified backoff limit (exit code {code})")

    async def _pod_volumes(self, pod: dict[str, Any], run: str) -> dict[str, Path]:
        """Plays the kubelet for a pod's emptyDir volumes (a local directory each) and init
        containers (their command run with mounted paths and image files mapped to local ones).
        Returns mount path -> local directory."""
        dirs = {}
        for vol in pod.get("volumes") or []:
            if "emptyDir" in vol:
                dirs[vol["name"]] = self.cluster.workdir / f"{run}-{vol['name']}"
                dirs[vol["name"]].mkdir(exist_ok=True)
        mounts = {m["mountPath"]: dirs[m["name"]] for c in [*pod.get("initContainers", []), *pod["containers"]]
                  for m in c.get("volumeMounts") or [] if m["name"] in dirs}
        for init in pod.get("initContainers") or []:
            argv = [str(self.image_files.get(a, _mapped(a, mounts))) for a in init["command"]]
            proc = await asyncio.create_subprocess_exec(*argv)
            assert await proc.wait() == 0, f"init container {init['name']} failed: {argv}"
        return mounts

    def expire(self, ns: str, name: str) -> None:
        """The run's activeDeadlineSeconds passed: its controller kills the pods and marks it
        Failed, reason DeadlineExceeded (what batch/v1 and the MPI operator report)."""
        self.expired.add(f"{ns}/{name}")
        proc = self.processes.get(f"{ns}/{name}")
        if proc is not None and proc.returncode is None:
            # coreutils `timeout` puts itself in a new process group: kill the tree by pid.
            for pid in [proc.pid, *_descendants(proc.pid)]:  # the shell first: it starts no more
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        obj = self.cluster.get("kubeflow.org/v2beta1", "mpijobs", name, ns)
        api, plural = ("kubeflow.org/v2beta1", "mpijobs") if obj is not None else ("batch/v1", "jobs")
        cond = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime": _now(),
                "message": "Job was active longer than specified deadline"}
        self.cluster.patch(api, plural, name, {"status": {"conditions": [cond]}}, ns, subresource="status")

    async def _finish(self, client: httpx.AsyncClient, path: str, *, ok: bool, reason: str, message: str) -> None:
        cond = ({"type": "Complete", "status": "True", "lastTransitionTime": _now()} if ok else
                {"type": "Failed", "status": "True", "reason": reason, "message": message,
                 "lastTransitionTime": _now()})
        status = {"active": 0, "succeeded" if ok else "failed": 1, "conditions": [cond]}
        await client.patch(path, json={"status": status}, headers={"Content-Type": "application/merge-patch+json"})


def _mapped(value: str, mounts: dict[str, Path]) -> str:
    """A path inside a pod -> the local path the harness mounted there (other values as they are)."""
    for mount, local in mounts.items():
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return str(local) + value[len(mount.rstrip("/")):]
    return value


class Process:
    """A child process (operator or agent) with its log in the work dir."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers run, as when a node dies or the pod is OOM-killed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()

    def tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def operator_env(cluster: Cluster, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLTUNE_")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.update({
        "KUBECONFIG": str(cluster.kubeconfig("operator")),
        "CCLTUNE_NAMESPACE": "ccltune-system",
        "CCLTUNE_METRICS_PORT": "0",
        "CCLTUNE_WEBHOOK_INSECURE": "true",
        "CCLTUNE_WEBHOOK_ADDR": "127.0.0.1",
        "CCLTUNE_WEBHOOK_PORT": str(free_port()),
        "CCLTUNE_RETRY_SECONDS": "0.5",
        "CCLTUNE_JOB_POLL_SECONDS": "0.5",
        "CCLTUNE_TOPOLOGY_TIMEOUT_SECONDS": "60",
    })
    env.update(overrides)
    return env


def _descendants(root: int) -> list[int]:
    """Every process below `root` (Linux /proc), children first."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    out: list[int] = []
    frontier = [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid in frontier]
        out = kids + out
        frontier = kids
    return out


def _index_list(indexes: list[int]) -> str:
    """The Job status' index list: sorted, runs of three or more collapsed ('0,2-4')."""
    runs: list[list[int]] = []
    for i in sorted(indexes):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_operator(cluster: Cluster, env: dict[str, str], name: str = "operator") -> Process:
    argv = [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces",
            "--log-format=json", "-m", "ccltune.controller.main"]
    return Process(argv, env, cluster.workdir / f"{name}.log")


def save_api_log(entries: list[dict[str, Any]], path: Path) -> None:
    """Merge into the JSON file: a sorted, de-duplicated list of request records."""
    seen: dict[str, dict[str, Any]] = {}
    if path.exists():
        with contextlib.suppress(ValueError):
            for e in json.loads(path.read_text()):
                seen[json.dumps(e, sort_keys=True)] = e
    for e in entries:
        if e["identity"] == "harness":
            continue
        seen[json.dumps(e, sort_keys=True)] = e
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([seen[k] for k in sorted(seen)], indent=1) + "\n")


@contextlib.contextmanager
def cluster_at(workdir: Path) -> Iterator[Cluster]:
    c = Cluster(workdir)
    try:
        yield c
    finally:
        c.close()


def _plural(obj: dict[str, Any]) -> str:
    kind = obj["kind"]
    for key, (k, _) in CORE.items():
        if k == kind and key.rsplit("/", 1)[0] == obj["apiVersion"]:
            return key.rsplit("/", 1)[1]
    return {"CCLTuning": "ccltunings", "NodeTopology": "nodetopologies"}.get(kind, kind.lower() + "s")


def _collection(api_version: str, plural: str, namespace: str | None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def _path_for(api_version: str, plural: str, namespace: str | None, name: str) -> str:
    return _collection(api_version, plural, namespace) + f"/{name}"


def _path(res: Any, ns: str | None, name: str) -> str:
    api_version = f"{res.group}/{res.version}" if res.group else res.version
    return _path_for(api_version, res.plural, ns, name)


def _check(resp: httpx.Response) -> None:
    if resp.status_code >= 400:
        raise AssertionError(f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {resp.text[:300]}")
