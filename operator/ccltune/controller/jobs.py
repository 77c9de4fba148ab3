"""Big plans run as batch/v1 Jobs from the operator's own image.

Names derive from the plan input hash, so a restarted operator finds the Job it already started
instead of starting another. The Job reads an input ConfigMap and writes a labeled result
ConfigMap (see planjob.py); both are owned by the Job and go when its TTL removes it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.ccltuning import CCLTuningSpec
from ..api.cluster import ClusterTopology
from ..api.common import API_GROUP
from ..api.plan import Plan
from ..workload import Workload
from .config import OperatorConfig

if TYPE_CHECKING:  # the planning stack loads only where a plan runs
    from ..synth.units import Synthesized

LABEL_INPUT = f"{API_GROUP}/plan-input"
LABEL_ROLE = f"{API_GROUP}/job-role"
LABEL_TUNING_UID = f"{API_GROUP}/tuning-uid"
INPUT_KEY = "input.json"
RESULT_KEY = "plan.json.gz"
PARTS_KEY = "parts"
RESULT_PART_BYTES = 768 * 1024  # base64 characters per result ConfigMap (multiple of 4)
ERROR_KEY = "error.txt"
PLANJOB_MODULE = "ccltune.controller.planjob"
# Bumped when the plan-job wire format changes, so old results are never reused.
FORMAT = 1


def plan_input(spec: CCLTuningSpec, cluster: ClusterTopology, *, name: str,
               profiles: dict[str, str] | None = None, profile_note: str | None = None) -> dict[str, Any]:
    payload = {"format": FORMAT, "name": name, "spec": spec.wire(), "cluster": cluster.wire()}
    if profiles:  # measured profiles to tune on (file name -> text) and where they came from
        payload["profiles"] = dict(sorted(profiles.items()))
        payload["profileNote"] = profile_note or ""
    return payload


def plan_with_profiles(spec: CCLTuningSpec, cluster: ClusterTopology, name: str,
                       profiles: dict[str, str] | None, note: str | None = None,
                       syntheses: Mapping[int, Synthesized] | None = None) -> Plan:  # fmt: skip
    """build_plan, tuned on the measured profiles when there are any (written to a scratch dir,
    which is what ccltune plan --profiles reads), with the syntheses shards ran (if any)."""
    from ..pipeline import build_plan

    if not profiles:
        return build_plan(spec, cluster, name=name, syntheses=syntheses)
    with tempfile.TemporaryDirectory(prefix="ccltune-profiles-") as tmp:
        for file_name, text in profiles.items():
            (Path(tmp) / Path(file_name).name).write_text(text)
        return build_plan(spec, cluster, name=name, profiles=Path(tmp), profile_note=note,
                          syntheses=syntheses)  # fmt: skip


def input_hash(payload: dict[str, Any], namespace: str) -> str:
    canon = json.dumps({"ns": namespace, **payload}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


@dataclass(frozen=True)
class JobNames:
    digest: str

    @property
    def job(self) -> str:
        return f"ccltune-plan-{self.digest[:12]}"

    @property
    def input(self) -> str:
        return f"{self.job}-input"

    @property
    def result(self) -> str:
        return f"{self.job}-result"


def needs_job(spec: CCLTuningSpec, cluster: ClusterTopology, work: Workload, cfg: OperatorConfig) -> str | None:
    """Why this plan should run as a Job, or None to run it in-process."""
    world = cluster.world_size
    if world > cfg.inprocess_max_gpus:
        return f"{world} GPUs > inprocessMaxGpus {cfg.inprocess_max_gpus}"
    if spec.synthesis.enabled and world > cfg.inprocess_max_synth_gpus:
        return f"synthesis over {world} GPUs > inprocessMaxSynthGpus {cfg.inprocess_max_synth_gpus}"
    if work.trials > cfg.inprocess_max_trials:
        return f"{work.trials} tuning trials > inprocessMaxTrials {cfg.inprocess_max_trials}"
    if work.units > cfg.inprocess_max_work:
        return f"estimated work {work.units} > inprocessMaxWork {cfg.inprocess_max_work}"
    return None


def over_limit(work: Workload, cfg: OperatorConfig) -> str | None:
    """Which hard limit the plan exceeds, and by how much; None when it may be planned."""
    if work.units <= cfg.max_plan_work:
        return None
    over = work.units - cfg.max_plan_work
    return (f"estimated work {work.describe()} is over maxPlanWork {cfg.max_plan_work} by {over} "
            f"({work.units / cfg.max_plan_work:.1f}x): narrow the size ranges, plan fewer "
            "collectives or lower spec.tuning.budget")


def _labels(names: JobNames, tuning_uid: str, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "ccltune-operator",
        "app.kubernetes.io/component": "plan-job",
        LABEL_INPUT: names.digest[:63],
        LABEL_ROLE: role,
        LABEL_TUNING_UID: tuning_uid,
    }


def input_configmap(names: JobNames, payload: dict[str, Any], namespace: str, tuning_uid: str) -> dict[str, Any]:
    return packed_input(names.input, payload, namespace, _labels(names, tuning_uid, "input"))


def packed_input(name: str, payload: dict[str, Any], namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    packed = base64.b64encode(gzip.compress(json.dumps(payload).encode(), mtime=0)).decode()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "immutable": True,
        "binaryData": {INPUT_KEY + ".gz": packed},
    }


def job_manifest(names: JobNames, cfg: OperatorConfig, tuning_uid: str, deadline_s: int,
                 extra_args: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    args = ["--namespace", cfg.namespace, "--input", names.input, "--output", names.result,
            "--job", names.job, *(extra_args or [])]  # fmt: skip
    return batch_job(names.job, _labels(names, tuning_uid, "job"), cfg, deadline_s,
                     ["python", "-m", PLANJOB_MODULE], args, {"backoffLimit": cfg.job_backoff_limit})  # fmt: skip


def batch_job(name: str, labels: dict[str, str], cfg: OperatorConfig, deadline_s: int,
              command: list[str], args: list[str], spec: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A Job running the operator's image, non-root, read-only root, /tmp an emptyDir; `spec`
    adds the Job-level fields (backoff, completion mode)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels},
        "spec": {
            **spec,
            "activeDeadlineSeconds": deadline_s,
            "ttlSecondsAfterFinished": cfg.job_ttl_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": cfg.job_service_account,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "plan",
                        "image": cfg.operator_image,
                        "imagePullPolicy": cfg.image_pull_policy,
                        "command": command,
                        "args": args,
                        "resources": cfg.job_resources,
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def owner_ref(obj: dict[str, Any], *, controller: bool = True) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
            "uid": meta.get("uid", ""), "controller": controller, "blockOwnerDeletion": True}


def result_configmaps(name: str, plan: Plan | None, namespace: str, job: dict[str, Any] | None,
                      *, error: str | None = None) -> list[dict[str, Any]]:
    """The Job's output: the Plan (gzipped JSON) or, when planning failed, the error text.

    A plan with synthesized MSCCL files can pass 1 MiB even gzipped (16 GPUs: 38 MB of JSON,
    1.9 MB gzipped), so it is spread over several ConfigMaps (packed_configmaps).
    """
    text = None if plan is None else plan.model_dump_json(by_alias=True)
    return packed_configmaps(name, text, namespace, job, error=error or "plan job failed")


def packed_configmaps(name: str, text: str | None, namespace: str, job: dict[str, Any] | None,
                      *, error: str = "job failed") -> list[dict[str, Any]]:  # fmt: skip
    """`text` gzipped and cut into RESULT_PART_BYTES pieces: `name` holds the first and the
    count, `name-1`, `name-2`... the rest. Write them in list order: `name` comes last, so once
    it exists the whole result does. `text` None: `name` holds `error` instead."""
    labels = dict((job or {}).get("metadata", {}).get("labels") or {})
    labels[LABEL_ROLE] = "result"

    def configmap(cm_name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": cm_name, "namespace": namespace, "labels": labels}
        if job is not None:
            meta["ownerReferences"] = [owner_ref(job)]
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "immutable": True}

    main = configmap(name)
    if text is None:
        main["data"] = {ERROR_KEY: error[:4000]}
        return [main]
    packed = base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()
    pieces = [packed[i : i + RESULT_PART_BYTES] for i in range(0, len(packed), RESULT_PART_BYTES)]
    rest = []
    for index, piece in enumerate(pieces[1:], start=1):
        part = configmap(f"{name}-{index}")
        part["binaryData"] = {RESULT_KEY: piece}
        rest.append(part)
    main["binaryData"] = {RESULT_KEY: pieces[0]}
    main["data"] = {PARTS_KEY: str(len(pieces))}
    return [*rest, main]


def result_part_names(main: dict[str, Any]) -> list[str]:
    """The other ConfigMaps a result is spread over (none for a one-part result)."""
    parts = int((main.get("data") or {}).get(PARTS_KEY, "1"))
    return [f"{main['metadata']['name']}-{i}" for i in range(1, parts)]


def read_result(main: dict[str, Any], parts: list[dict[str, Any] | None]) -> Any:
    """The Plan JSON from the result ConfigMaps (`parts` in result_part_names order)."""
    return json.loads(read_packed(main, parts))


def read_packed(main: dict[str, Any], parts: list[dict[str, Any] | None]) -> bytes:
    """What packed_configmaps packed (`parts` in result_part_names order)."""
    names = result_part_names(main)
    missing = [n for n, cm in zip(names, parts, strict=True) if cm is None]
    if missing:
        raise ValueError(f"result part(s) missing: {', '.join(missing)}")
    pieces = [(cm.get("binaryData") or {}).get(RESULT_KEY, "") for cm in [main, *parts] if cm]
    return gzip.decompress(base64.b64decode("".join(pieces)))


def read_payload(cm: dict[str, Any], key: str) -> Any:
    data = (cm.get("binaryData") or {}).get(key)
    if data is None:
        raise ValueError(f"ConfigMap {cm['metadata']['name']} has no key {key}")
    return json.loads(gzip.decompress(base64.b64decode(data)))


def job_failure(job: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when the Job failed for good, from its Failed condition."""
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return cond.get("reason") or "JobFailed", cond.get("message") or ""
    return None


def job_succeeded(job: dict[str, Any]) -> bool:
    status = job.get("status") or {}
    if any(c.get("type") == "Complete" and c.get("status") == "True" for c in status.get("conditions") or []):
        return True
    return bool(status.get("succeeded"))
