"""The plan Job's command: `python -m ccltune.controller.planjob --namespace NS --input CM
--output CM [--job NAME] [--shard-job NAME --shards N]`.

Reads the plan input (spec, ClusterTopology, name) from the input ConfigMap, runs the same
`build_plan` as `ccltune plan`, and writes the Plan to the output ConfigMap(s) (owned by the Job; jobs.result_configmaps).
On a planning error it writes `error.txt` there instead and exits 1, so the operator can put the
pipeline's own message into the CCLTuning's condition. With `--shard-job` the tasks' syntheses
come from that Indexed Job's results (shardjob.py); any it cannot read are synthesized here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from pydantic import ValidationError

from ..api.ccltuning import CCLTuningSpec
from ..api.cluster import ClusterTopology
from ..api.errors import InputError, one_line
from ..synth.units import Synthesized
from .jobs import INPUT_KEY, plan_with_profiles, read_payload, result_configmaps
from .kube import ApiError, KubeClient, connection_from_env
from .shardjob import ShardNames, read_results


async def run(namespace: str, input_cm: str, output_cm: str, job_name: str | None,
              shard_job: str | None = None, shards: int = 0) -> int:  # fmt: skip
    client = KubeClient(connection_from_env())
    try:
        cm = await client.get("v1", "configmaps", input_cm, namespace)
        if cm is None:
            print(f"plan-job: input ConfigMap {namespace}/{input_cm} not found", file=sys.stderr)
            return 2
        job = await client.get("batch/v1", "jobs", job_name, namespace) if job_name else None
        try:
            payload = read_payload(cm, INPUT_KEY + ".gz")
            spec = CCLTuningSpec.model_validate(payload["spec"])
            cluster = ClusterTopology.model_validate(payload["cluster"])
            syntheses = await _shard_results(client, shard_job, shards, namespace)
            plan = await asyncio.to_thread(plan_with_profiles, spec, cluster, payload["name"],
                                           payload.get("profiles"), payload.get("profileNote"),
                                           syntheses)  # fmt: skip
        except ValidationError as exc:
            return await _fail(client, output_cm, namespace, job, f"bad plan input: {one_line(exc)}")
        except InputError as exc:  # the pipeline's error goes to the CCLTuning, not a traceback
            return await _fail(client, output_cm, namespace, job, str(exc))
        except Exception as exc:
            return await _fail(client, output_cm, namespace, job,
                               f"internal error (a ccltune bug): {type(exc).__name__}: {exc}")
        try:
            for body in result_configmaps(output_cm, plan, namespace, job):
                await _write(client, body, namespace)
        except ApiError as exc:
            print(f"plan-job: cannot write the result {namespace}/{output_cm}: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(f"plan-job: wrote {namespace}/{output_cm} (plan digest {plan.digest[:12]})")
        return 0
    finally:
        await client.aclose()


async def _shard_results(client: KubeClient, shard_job: str | None, shards: int,
                         namespace: str) -> dict[int, Synthesized] | None:  # fmt: skip
    if not shard_job:
        return None
    got = await read_results(client, ShardNames.of_job(shard_job, shards), namespace)
    if got.merged is None:  # gone (the shard Job's TTL) or broken: synthesized here instead
        why = got.errors or f"shards {got.missing} missing"
        print(f"plan-job: results of {namespace}/{shard_job} unreadable ({why}); synthesizing here",
              file=sys.stderr)  # fmt: skip
    return got.merged


async def _write(client: KubeClient, body: dict, namespace: str) -> None:
    try:
        await client.create("v1", "configmaps", body, namespace)
    except ApiError as exc:
        if exc.status != 409:  # a retried pod may find its own earlier result: keep it
            raise


async def _fail(client: KubeClient, name: str, namespace: str, job: dict | None, message: str) -> int:
    print(f"plan-job: {message}", file=sys.stderr)
    for body in result_configmaps(name, None, namespace, job, error=message):
        await _write(client, body, namespace)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ccltune-plan-job", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--input", required=True, help="input ConfigMap name")
    parser.add_argument("--output", required=True, help="result ConfigMap name")
    parser.add_argument("--job", default=None, help="this Job's name (to own the result)")
    parser.add_argument("--shard-job", default=None, help="the Indexed Job that ran the syntheses")
    parser.add_argument("--shards", type=int, default=0, help="its number of indexes")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.namespace, args.input, args.output, args.job, args.shard_job,
                           args.shards))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
