"""Sharded synthesis on KMock: the tasks' syntheses as one Indexed Job, merged, then published.

The harness plays kubelet and the Job controller (ctl_harness.Kubelet): each index of an Indexed
Job runs `ccltune solve-shard` as a local process with JOB_COMPLETION_INDEX set, last index first,
so the shards finish in an order other than 0, 1, 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ctl_harness import Cluster
from ctl_world import Operator
from test_controller_e2e import (
    GV,
    OPERATOR_NS,
    condition,
    offline_manifests,
    published,
    start_offline_plan,
    wait_condition,
)

from ccltune.controller.jobs import LABEL_ROLE, LABEL_TUNING_UID, read_packed, result_part_names
from ccltune.synth.units import Synthesized, from_json

pytestmark = pytest.mark.slow


def sharded(name: str, ns: str, collectives: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": name}}, "collectives": collectives,
                     "synthesis": {"enabled": True, "shards": 3},
                     "publish": {"inject": True, "runtime": "msccl"}}}  # fmt: skip


def shard_jobs(c: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    uid = c.get(GV, "ccltunings", name, ns)["metadata"]["uid"]  # type: ignore[index]
    return [j for j in c.list("batch/v1", "jobs", OPERATOR_NS)
            if j["metadata"]["labels"].get(LABEL_TUNING_UID) == uid
            and j["metadata"]["labels"].get(LABEL_ROLE) == "synthesis-shard"]  # fmt: skip


def shard_results(c: Cluster, job: str) -> list[Synthesized]:
    """What the pods wrote, read back as the operator reads it."""
    out: list[Synthesized] = []
    for i in range(3):
        main = c.get("v1", "configmaps", f"{job}-result-{i}", OPERATOR_NS)
        assert main is not None, f"shard {i} wrote no result"
        parts = [c.get("v1", "configmaps", n, OPERATOR_NS) for n in result_part_names(main)]
        out += from_json(read_packed(main, parts).decode())
    return out


@pytest.mark.timeout(900)  # a hang guard: three syntheses, a plan Job and the offline plan
def test_three_shards_publish_the_in_process_files(cluster: Cluster, operator: Operator,
                                                  tmp_path: Path) -> None:  # fmt: skip
    ns = "shards"
    doc = sharded("llm", ns, [
        {"op": "allgather", "minBytes": "64M", "maxBytes": "256M"},
        {"op": "allgather", "minBytes": "1M", "maxBytes": "4M", "ranks": 8},
        {"op": "reducescatter", "minBytes": "1M", "maxBytes": "4M", "ranks": 8},
    ])  # fmt: skip
    cluster.create(doc)
    offline = start_offline_plan(cluster, doc, tmp_path)
    wait_condition(cluster, operator, ns, "llm", "Ready", "True", timeout=800)

    [job] = shard_jobs(cluster, ns, "llm")
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert cluster.kubelet.index_runs[job["metadata"]["name"]] == [2, 1, 0]
    # One result per task, each for the sizes its task plans (three per task here).
    results = shard_results(cluster, job["metadata"]["name"])
    assert sorted(r.index for r in results) == [0, 1, 2]
    assert all(len(r.picks) == 3 for r in results)
    # 16 GPUs of synthesis are over the in-process work limit: the plan Job read the shards.
    [plan_job] = [j for j in cluster.list("batch/v1", "jobs", OPERATOR_NS)
                  if j["metadata"]["labels"].get(LABEL_ROLE) == "job"
                  and "--shard-job" in j["spec"]["template"]["spec"]["containers"][0]["args"]]  # fmt: skip
    assert job["metadata"]["name"] in plan_job["spec"]["template"]["spec"]["containers"][0]["args"]

    # Byte for byte what `ccltune plan` writes in one process: MSCCL files (where the model lets
    # a schedule win), the report with every size's synthesized choice and notes.
    expected = offline_manifests(offline)
    assert published(cluster, ns, expected) == expected


def test_a_failed_shard_is_named_and_nothing_is_published(cluster: Cluster,
                                                         operator: Operator) -> None:  # fmt: skip
    ns = "shards-fail"
    # Small enough to plan inside the operator once the shards are in.
    doc = sharded("doomed", ns, [
        {"op": "allgather", "minBytes": "1M", "maxBytes": "4M", "ranks": 8},
        {"op": "reducescatter", "minBytes": "1M", "maxBytes": "4M", "ranks": 8},
        {"op": "allgather", "minBytes": "64K", "maxBytes": "256K", "ranks": 8},
    ])  # fmt: skip
    cluster.kubelet.fail_indexes = {1}
    try:
        cluster.create(doc)
        cond = wait_condition(cluster, operator, ns, "doomed", "Ready", "False",
                              "SynthesisShardFailed", timeout=300)  # fmt: skip
    finally:
        cluster.kubelet.fail_indexes = set()
    [job] = shard_jobs(cluster, ns, "doomed")
    assert f"synthesis shard(s) 1 of 3 (Job {OPERATOR_NS}/{job['metadata']['name']}) failed" in cond["message"]
    assert "FailedIndexes" in cond["message"]
    assert condition(cluster, ns, "doomed", "Synthesized")["reason"] == "SynthesisShardFailed"  # type: ignore[index]
    assert not cluster.list("v1", "configmaps", ns)  # nothing half-written is published
