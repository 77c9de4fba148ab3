"""Fixtures for the operator's end-to-end tests on the KMock emulator (ctl_harness.py, ctl_world.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ctl_harness import Cluster, Process, cluster_at, free_port, operator_env, save_api_log
from ctl_world import API_LOG, GPU_NODES, LEAF, Operator, node, start_agent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster_at(tmp_path_factory.mktemp("kmock")) as c:
        c.load_crds()
        try:
            yield c
        finally:
            save_api_log(c.api_log(), API_LOG)


@pytest.fixture(scope="module")
def agents(cluster: Cluster) -> Iterator[list[Process]]:
    for name in GPU_NODES:
        cluster.create(node(name, 8, **{"nvidia.com/gpu.present": "true", LEAF: "t0"}))
    cluster.create(node("cpu-0", 0))
    procs = [start_agent(cluster, name) for name in GPU_NODES]
    try:
        cluster.wait("agents' NodeTopology", lambda: len(cluster.list("ccltune.io/v1alpha1", "nodetopologies"))
                     == len(GPU_NODES), timeout=60)
        yield procs
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def operator(cluster: Cluster, agents: list[Process]) -> Iterator[Operator]:
    # Tunings with tuning enabled exceed this trial budget, so they plan in Jobs.
    op = Operator(cluster, operator_env(cluster, CCLTUNE_INPROCESS_MAX_TRIALS="50",
                                        CCLTUNE_TOPOLOGY_TIMEOUT_SECONDS="3",
                                        CCLTUNE_METRICS_PORT=str(free_port())))
    try:
        yield op
    finally:
        op.proc.stop()
