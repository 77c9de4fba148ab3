"""The plan Job's command: `python -m ccltune.controller.planjob --namespace NS --input CM
--output CM [--job NAME]`.

Reads the plan input (spec, ClusterTopology, name) from the input ConfigMap, runs the same
`build_plan` as `ccltune plan`, and writes the Plan to the output ConfigMap(s) (owned by the Job; jobs.result_configmaps).
On a planning error it writes `error.txt` there instead and exits 1, so the operator can put the
pipeline's own message into the CCLTuning's condition.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from pydantic import ValidationError

from ..api.ccltuning import CCLTuningSpec
from ..api.cluster import ClusterTopology
from ..api.errors import InputError, one_line
from .jobs import INPUT_KEY, plan_with_profiles, read_payload, result_configmaps
from .kube import ApiError, KubeClient, connection_from_env


async def run(namespace: str, input_cm: str, output_cm: str, job_name: str | None) -> int:
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
            plan = await asyncio.to_thread(plan_with_profiles, spec, cluster, payload["name"],
                                           payload.get("profiles"), payload.get("profileNote"))
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
    args = parser.parse_args(argv)
    return asyncio.run(run(args.namespace, args.input, args.output, args.job))


if __name__ == "__main__":
    sys.exit(main())
