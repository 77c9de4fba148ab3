"""The e2e test world: fixture nodes, agent processes, the restartable operator (see ctl_harness.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ctl_harness import (
    REPO,
    Cluster,
    Process,
    free_port,
    start_operator,
)

ARTIFACTS = Path(__file__).parent / "artifacts"
API_LOG = Path(os.environ.get("CCLTUNE_API_LOG") or ARTIFACTS / "api-requests.json")
FIXTURE = REPO / "tests" / "fixtures" / "agent" / "dgx-a100"
GPU_NODES = ("gpu-0", "gpu-1")
LEAF = "ccltune.io/tor"


def node(name: str, gpus: int, **labels: str) -> dict[str, Any]:
    capacity = {"cpu": "96", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "status": {"capacity": capacity}}


def start_agent(cluster: Cluster, node_name: str) -> Process:
    """The agent as the DaemonSet would run it, with recorded sysfs/NVML instead of a GPU node."""
    if shutil.which("ccltune-agent", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("ccltune-agent is not installed")
    argv = [str(Path(sys.executable).parent / "ccltune-agent"), "run", "--node-name", node_name,
            "--sysfs-root", str(FIXTURE / "sysfs"), "--nvml-recording", str(FIXTURE / "nvml.json"),
            "--kubeconfig", str(cluster.kubeconfig("agent")), "--interval", "3600",
            "--health-addr", f"127.0.0.1:{free_port()}"]
    env = {**os.environ, "NODE_NAME": node_name}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return Process(argv, env, cluster.workdir / f"agent-{node_name}.log")


class Operator:
    """The operator process, restartable (SIGKILL + start) by the tests."""

    def __init__(self, cluster: Cluster, env: dict[str, str]) -> None:
        self.cluster, self.env, self.runs = cluster, env, 0
        self.proc = self.start()

    def start(self) -> Process:
        self.runs += 1
        self.proc = start_operator(self.cluster, self.env, name=f"operator-{self.runs}")
        return self.proc

    def kill_and_restart(self) -> None:
        self.proc.kill()
        self.start()

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.env['CCLTUNE_WEBHOOK_PORT']}/inject"

    def logs(self) -> str:
        return self.proc.tail(80)


