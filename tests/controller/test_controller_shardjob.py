"""Sharded synthesis without a cluster: how many shards, the Indexed Job, the pod's input checks,
what the operator makes of the Job's state."""

from __future__ import annotations

import asyncio

import kubernetes_validate
import pytest

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.controller import jobs, shardjob
from ccltune.controller.config import load_config
from ccltune.pipeline import synthesis_units
from ccltune.synth.units import Synthesized, to_json
from ccltune.topology.load import load_cluster
from ccltune.workload import preflight

K8S = kubernetes_validate.latest_version()
TOPO = load_cluster("dgx-a100-2")


def _spec(shards: int | None = None, tasks: int = 3, runtime: str = "msccl") -> CCLTuningSpec:
    ops = [{"op": op, "minBytes": "1M", "maxBytes": "1G"}
           for op in ("allgather", "reducescatter", "allreduce")[:tasks]]  # fmt: skip
    return CCLTuningSpec.model_validate({"collectives": ops, "publish": {"runtime": runtime},
                                         "synthesis": {"enabled": True, "shards": shards}})  # fmt: skip


def _count(spec: CCLTuningSpec, **cfg: str) -> int:
    _keys, work = preflight(spec, TOPO)
    env = {f"CCLTUNE_{k.upper()}": v for k, v in cfg.items()}
    return shardjob.shard_count(spec, synthesis_units(spec, TOPO), work, load_config(env))


def test_shard_count_follows_spec_work_tasks_and_the_cap() -> None:
    assert _count(_spec(shards=3)) == 3
    assert _count(_spec(shards=5)) == 3  # never more shards than tasks
    assert _count(_spec(shards=3), synthesis_max_shards="2") == 2
    assert _count(_spec(shards=1)) == 1
    _keys, work = preflight(_spec(), TOPO)
    per = work.synthesis // 2  # unset: one shard per synthesisShardWork of estimated work
    assert _count(_spec(), synthesis_shard_work=str(per)) == 2
    assert _count(_spec(), synthesis_shard_work=str(work.synthesis + 1)) == 1
    assert _count(_spec(shards=3, runtime="nccl")) == 1  # stock NCCL: nothing is synthesized


def test_indexed_job_manifest_is_valid_and_deterministic() -> None:
    cfg = load_config({})
    spec = _spec(shards=3)
    _keys, work = preflight(spec, TOPO)
    planned = shardjob.plan_shards(spec, TOPO, work, cfg, "llm", "default")
    assert planned is not None and planned == shardjob.plan_shards(spec, TOPO, work, cfg, "llm", "default")
    names, payload = planned
    assert sorted(i for s in payload["shards"] for i in s) == [0, 1, 2]
    body = shardjob.job_manifest(names, cfg, "uid-1", 1500)
    kubernetes_validate.validate(body, K8S, strict=True)
    job = body["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 3, 3)
    assert job["backoffLimitPerIndex"] == cfg.job_backoff_limit and "backoffLimit" not in job
    container = job["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "ccltune", "solve-shard"]
    assert container["args"][container["args"].index("--output") + 1] + "-0" == names.result(0)
    assert body["metadata"]["labels"][jobs.LABEL_TUNING_UID] == "uid-1"
    # A plan Job that continues from these shards names them in its arguments.
    plan_job = jobs.job_manifest(jobs.JobNames("d" * 64), cfg, "uid-1", 900,
                                 ["--shard-job", names.job, "--shards", "3"])  # fmt: skip
    kubernetes_validate.validate(plan_job, K8S, strict=True)
    assert shardjob.ShardNames.of_job(names.job, 3).result(2) == names.result(2)


def test_completed_index_lists_are_read_as_the_job_writes_them() -> None:
    assert shardjob._indexes("0,2-4,7") == {0, 2, 3, 4, 7}
    assert shardjob._indexes(None) == set()


def test_a_shard_refuses_an_index_or_input_it_does_not_have() -> None:
    payload = shardjob.shard_input(_spec(shards=2), TOPO, "llm", ((0, 2), (1,)))
    with pytest.raises(ValueError, match=r"shard index 2 not in 0\.\.1"):
        shardjob.solve(payload, 2)
    with pytest.raises(ValueError, match="format"):
        shardjob.solve({**payload, "format": 99}, 0)
    with pytest.raises(ValueError, match="names tasks"):
        shardjob.solve({**payload, "shards": [[0, 5]]}, 0)


class FakeClient:
    """Just the reads and writes shardjob.syntheses makes, on a dict of objects."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}

    async def get(self, _api: str, plural: str, name: str, _ns: str | None = None) -> dict | None:
        return self.objects.get((plural, name))

    async def create(self, _api: str, plural: str, body: dict, _ns: str | None = None) -> dict:
        self.objects[(plural, body["metadata"]["name"])] = body
        return body

    async def patch(self, _api: str, plural: str, name: str, body: dict, _ns: str | None = None) -> dict:
        self.objects[(plural, name)]["metadata"].update(body["metadata"])
        return self.objects[(plural, name)]


def _sharded_run(client: FakeClient) -> tuple[object, shardjob.ShardNames]:
    cfg = load_config({})
    spec = _spec(shards=3)
    _keys, work = preflight(spec, TOPO)
    planned = shardjob.plan_shards(spec, TOPO, work, cfg, "llm", "default")
    assert planned is not None

    async def call() -> object:
        return await shardjob.syntheses(client, cfg, spec, TOPO, work, "llm", "default", "uid-1")  # type: ignore[arg-type]

    return call, planned[0]


def test_the_operator_waits_then_names_the_shard_that_failed() -> None:
    client = FakeClient()
    call, names = _sharded_run(client)
    with pytest.raises(shardjob.ShardsRunning, match="indexes done: none"):
        asyncio.run(call())  # type: ignore[operator]
    job = client.objects[("jobs", names.job)]
    assert client.objects[("configmaps", names.input)]["metadata"]["ownerReferences"][0]["name"] == names.job
    # Index 2 wrote its result, index 0 an error; 1 is still running: the error is reported now.
    ok = Synthesized(2, (1,), (), (), (), (), True)
    for body in jobs.packed_configmaps(names.result(2), to_json([ok]), "ccltune-system", job):
        asyncio.run(client.create("v1", "configmaps", body))
    for body in jobs.packed_configmaps(names.result(0), None, "ccltune-system", job, error="bad shard input: x"):
        asyncio.run(client.create("v1", "configmaps", body))
    with pytest.raises(shardjob.ShardFailed, match=r"synthesis shard 0 of 3 \(Job .*\) failed: bad shard input: x"):
        asyncio.run(call())  # type: ignore[operator]
    # Without the error: the Job ends Complete while index 0 wrote nothing (killed, evicted...).
    del client.objects[("configmaps", names.result(0))]
    job["status"] = {"succeeded": 2, "completedIndexes": "1,2",
                     "conditions": [{"type": "Complete", "status": "True"}]}
    with pytest.raises(shardjob.ShardFailed, match=r"synthesis shard\(s\) 0, 1 of 3 .* NoResult"):
        asyncio.run(call())  # type: ignore[operator]
    # status.succeeded alone (indexes end one by one) does not mean the Job finished.
    job["status"] = {"succeeded": 1, "completedIndexes": "2"}
    with pytest.raises(shardjob.ShardsRunning, match="indexes done: 2"):
        asyncio.run(call())  # type: ignore[operator]
