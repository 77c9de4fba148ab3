"""The agent process against the KMock Kubernetes emulator: create, skip, update, degrade, reprobe."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_testlib import FIXTURES, run_fixture
from kmock import KubernetesEmulator, Server

from ccltune.topology.nccl_xml import parse_nccl_xml

RES = "ccltune.io/v1alpha1/nodetopologies"
NODE = "gpu-node-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def emulator() -> KubernetesEmulator:
    k = KubernetesEmulator()
    k.resources[RES] = {}  # type: ignore[assignment]
    k.objects["v1/nodes", None, NODE] = {"apiVersion": "v1", "kind": "Node",
                                         "metadata": {"name": NODE, "uid": "node-uid-1"}}
    return k


class AgentProc:
    def __init__(self, url: str, fixture: Path, tmp: Path, nvml: Path | None, *extra: str) -> None:
        self.health = free_port()
        self.log = tmp / f"agent-{self.health}.log"
        self.args = [sys.executable, "-m", "ccltune_agent", "run", "--api-server", url,
                     "--sysfs-root", str(fixture / "sysfs"), "--interval", "3600",
                     "--health-addr", f"127.0.0.1:{self.health}", "--backoff-max", "0.5", *extra]
        self.args += ["--nvml-recording", str(nvml)] if nvml else ["--no-nvml"]
        self.env = {**os.environ, "NODE_NAME": NODE, "POD_NAME": "agent-x", "POD_UID": "pod-uid-1",
                    "POD_NAMESPACE": "ccltune-system"}
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> AgentProc:
        self.fh = self.log.open("wb")
        self.proc = await asyncio.create_subprocess_exec(*self.args, env=self.env, stdout=self.fh, stderr=self.fh)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.fh.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)


async def until(cond: Callable[[], Any], what: str, proc: AgentProc, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; agent log:\n{proc.text()[-3000:]}")


def stored(k: KubernetesEmulator, name: str = NODE) -> dict[str, Any] | None:
    try:
        obj = k.objects[RES, None, name]
    except KeyError:
        return None
    return None if obj.deleted else obj.raw


def versions(k: KubernetesEmulator) -> int:
    return len(k.objects[RES, None, NODE].history)


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return cond
    return None


@pytest.mark.asyncio
async def test_create_skip_update_reprobe_shutdown(tmp_path: Path, fixture_copy) -> None:
    fx = fixture_copy("v100-sxm2-4")
    expected = run_fixture("v100-sxm2-4", node=NODE).spec.content_hash
    async with emulator() as k, Server(k) as srv, AgentProc(str(srv.url), fx, tmp_path, fx / "nvml.json") as agent:
        obj = await until(lambda: condition(stored(k), "Ready") and stored(k), "NodeTopology with status", agent)
        assert obj["spec"]["contentHash"] == expected and obj["spec"]["nodeName"] == NODE
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1"}]
        assert obj["metadata"]["annotations"]["ccltune.io/agent-pod"] == "ccltune-system/agent-x"
        assert (condition(obj, "Degraded") or {}).get("status") == "False"
        async with httpx.AsyncClient() as http:
            resp = await http.get(f"http://127.0.0.1:{agent.health}/readyz")
            assert resp.status_code == 200 and expected in resp.text
            assert (await http.get(f"http://127.0.0.1:{agent.health}/healthz")).status_code == 200

        # SIGHUP with nothing changed: probed again, not rewritten.
        before = versions(k)
        agent.signal(signal.SIGHUP)
        await until(lambda: agent.text().count("not rewritten") >= 1, "an unchanged re-probe", agent)
        assert versions(k) == before

        # The fixture changes (a rail goes down): the next probe rewrites the spec.
        (fx / "sysfs/sys/class/infiniband/mlx5_1/ports/1/state").write_text("1: DOWN\n")
        agent.signal(signal.SIGHUP)
        obj = await until(lambda: (stored(k) or {}).get("spec", {}).get("contentHash") != expected
                          and stored(k), "an updated spec", agent)
        nic = next(n for n in obj["spec"]["nics"] if n["name"] == "mlx5_1")
        assert nic["ports"][0]["state"] == "DOWN"
        assert obj["spec"]["contentHash"] == run_fixture("v100-sxm2-4", fx.parent, NODE).spec.content_hash

        # The operator asks for a re-probe through the annotation; the agent records it served.
        async with httpx.AsyncClient(base_url=str(srv.url)) as api:
            resp = await api.patch(f"/apis/{RES}/{NODE}", content=b'{"metadata":{"annotations":'
                                   b'{"ccltune.io/reprobe-request":"2026-01-01T00:00:00Z#1"}}}',
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert resp.status_code == 200
        await until(lambda: ((stored(k) or {}).get("metadata", {}).get("annotations", {})
                             .get("ccltune.io/reprobe-served") == "2026-01-01T00:00:00Z#1"), "reprobe-served", agent)
        assert agent.text().count("not rewritten") >= 2  # it did probe again for the request

        # Someone deletes the report: the agent notices on its watch and publishes it again.
        async with httpx.AsyncClient(base_url=str(srv.url)) as api:
            assert (await api.delete(f"/apis/{RES}/{NODE}")).status_code == 200
        obj = await until(lambda: condition(stored(k), "Ready") and stored(k), "the re-created report", agent)
        assert obj["spec"]["nics"][1]["ports"][0]["state"] == "DOWN"

        agent.signal(signal.SIGTERM)
        assert agent.proc is not None
        assert await asyncio.wait_for(agent.proc.wait(), timeout=15) == 0
        assert "agent stopped" in agent.text()


@pytest.mark.asyncio
async def test_degraded_without_nvml(tmp_path: Path) -> None:
    fx = FIXTURES / "a40-pcie-8"
    xml = tmp_path / "topo.xml"
    async with emulator() as k, Server(k) as srv, AgentProc(
            str(srv.url), fx, tmp_path, FIXTURES / "no-nvml.json", "--once", "--xml-out", str(xml)) as agent:
        assert agent.proc is not None
        assert await asyncio.wait_for(agent.proc.wait(), timeout=30) == 0
        obj = stored(k)
        degraded = condition(obj, "Degraded")
        assert degraded and degraded["status"] == "True" and degraded["reason"] == "NvmlUnavailable"
        assert "Driver Not Loaded" in degraded["message"]
        spec = obj["spec"]  # type: ignore[index]
        assert len(spec["gpus"]) == 8 and all((g["uuid"] == "" and "nvlinks" not in g) or g["nvlinks"] == []
                                              for g in spec["gpus"])
        assert len(spec["nics"]) == 3 and spec["nicBinding"]["0"] == "mlx5_0"
        topo = parse_nccl_xml(xml.read_text())  # the NCCL_TOPO_FILE is written even without NVML
        assert len(topo.gpus) == 8 and {n.name for n in topo.nets} == {"mlx5_0", "mlx5_1", "eno1"}


@pytest.mark.asyncio
async def test_retries_until_api_server_appears(tmp_path: Path) -> None:
    port = free_port()
    fx = FIXTURES / "hgx-h100"
    async with AgentProc(f"http://127.0.0.1:{port}", fx, tmp_path, fx / "nvml.json", "--owner", "pod") as agent:
        await until(lambda: agent.text().count("retrying in") >= 2, "failed attempts", agent)
        async with emulator() as k, Server(k, port=port):
            obj = await until(lambda: condition(stored(k), "Ready") and stored(k), "NodeTopology", agent)
            owner = obj["metadata"]["ownerReferences"][0]
            assert owner["kind"] == "Pod" and owner["uid"] == "pod-uid-1"
            agent.signal(signal.SIGTERM)  # before the server goes: it waits for open watches
            assert agent.proc is not None
            assert await asyncio.wait_for(agent.proc.wait(), timeout=15) == 0


@pytest.mark.asyncio
async def test_unknown_node_publishes_without_owner(tmp_path: Path) -> None:
    fx = FIXTURES / "v100-sxm2-4"
    async with emulator() as k, Server(k) as srv, AgentProc(
            str(srv.url), fx, tmp_path, fx / "nvml.json", "--once", "--node-name", "ghost") as agent:
        assert agent.proc is not None
        assert await asyncio.wait_for(agent.proc.wait(), timeout=30) == 0
        obj = stored(k, "ghost")
        assert obj and obj["spec"]["nodeName"] == "ghost" and "ownerReferences" not in obj["metadata"]
        assert "publishing without owner" in agent.text()


@pytest.mark.asyncio
async def test_sigterm_while_api_is_down_exits_cleanly(tmp_path: Path) -> None:
    fx = FIXTURES / "v100-sxm2-4"
    async with AgentProc(f"http://127.0.0.1:{free_port()}", fx, tmp_path, fx / "nvml.json") as agent:
        await until(lambda: "retrying in" in agent.text(), "a failed API call", agent)
        async with httpx.AsyncClient() as http:
            resp = await http.get(f"http://127.0.0.1:{agent.health}/readyz")
            assert resp.status_code == 503  # nothing published yet
            assert (await http.get(f"http://127.0.0.1:{agent.health}/healthz")).status_code == 200
            assert (await http.get(f"http://127.0.0.1:{agent.health}/nope")).status_code == 404
        agent.signal(signal.SIGTERM)
        assert agent.proc is not None
        assert await asyncio.wait_for(agent.proc.wait(), timeout=10) == 0
        assert "Traceback" not in agent.text()
