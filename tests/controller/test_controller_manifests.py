"""The DaemonSet and Job the operator writes: strict schema validation and affinity from targets."""

from __future__ import annotations

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ccltune.api.ccltuning import CCLTuningSpec
from ccltune.controller import daemonset, jobs
from ccltune.controller.config import load_config

K8S = kubernetes_validate.latest_version()
GPU = ("nvidia.com/gpu.present", "true")


def spec(**nodes: object) -> CCLTuningSpec:
    return CCLTuningSpec.model_validate({"collectives": [{"op": "allreduce"}], "nodes": nodes})


def test_daemonset_validates_strict() -> None:
    cfg = load_config({"CCLTUNE_AGENT_PRIORITY_CLASS": "system-node-critical"})
    terms = daemonset.node_terms([spec(names=["b", "a"]), spec(selector={"pool": "h100"}), spec()], GPU)
    body = daemonset.render(cfg, terms)
    kubernetes_validate.validate(body, K8S, strict=True)
    pod = body["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["volumes"][0]["hostPath"]["path"] == "/sys"


def test_strict_validation_catches_a_typo() -> None:
    body = daemonset.render(load_config({}), daemonset.node_terms([spec()], GPU))
    body["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(body, K8S, strict=True)


def test_terms_per_target_kind() -> None:
    terms = daemonset.node_terms([spec(names=["n2", "n1", "n1"]), spec(selector={"rack": "r1", "pool": "a"})], GPU)
    assert {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]} in terms
    assert {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]},
                                 {"key": "rack", "operator": "In", "values": ["r1"]}]} in terms
    assert daemonset.node_terms([spec(), spec()], GPU) == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]


def _selected(terms: list[dict], node: str, labels: dict[str, str]) -> bool:
    """nodeSelectorTerms semantics: terms ORed, requirements inside a term ANDed."""
    def req_ok(r: dict, value: str | None) -> bool:
        return value is not None and value in r["values"]
    for term in terms:
        ok = all(req_ok(r, node) for r in term.get("matchFields", []))
        ok = ok and all(req_ok(r, labels.get(r["key"])) for r in term.get("matchExpressions", []))
        if ok:
            return True
    return False


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(
    st.lists(st.sampled_from([f"n{i}" for i in range(6)]), min_size=1, max_size=3).map(lambda n: ("names", n)),
    st.sampled_from(["r0", "r1"]).map(lambda r: ("selector", {"rack": r})),
), min_size=1, max_size=4))
def test_affinity_covers_exactly_the_targets(targets: list[tuple[str, object]]) -> None:
    nodes = {f"n{i}": {"rack": f"r{i % 2}"} for i in range(6)}
    specs = [spec(**{kind: value}) for kind, value in targets]
    terms = daemonset.node_terms(specs, GPU)
    expected = set()
    for kind, value in targets:
        if kind == "names":
            expected |= set(value)  # type: ignore[arg-type]
        else:
            expected |= {n for n, lab in nodes.items() if lab["rack"] == value["rack"]}  # type: ignore[index]
    assert {n for n, lab in nodes.items() if _selected(terms, n, lab)} == expected
    kubernetes_validate.validate(daemonset.render(load_config({}), terms), K8S, strict=True)


def test_job_manifest_is_deterministic_and_valid() -> None:
    cfg = load_config({})
    payload = {"format": 1, "name": "t", "spec": {"a": 1}, "cluster": {"b": 2}}
    names = jobs.JobNames(jobs.input_hash(payload, "ns"))
    assert names == jobs.JobNames(jobs.input_hash(dict(reversed(payload.items())), "ns"))
    assert names != jobs.JobNames(jobs.input_hash(payload, "other"))
    body = jobs.job_manifest(names, cfg, "uid-1", 3600)
    kubernetes_validate.validate(body, K8S, strict=True)
    kubernetes_validate.validate(jobs.input_configmap(names, payload, "ccltune-system", "uid-1"), K8S, strict=True)
    assert body["metadata"]["name"] == names.job and len(names.job) <= 63
    assert body["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "ccltune.controller.planjob"


def test_job_failure_reads_the_failed_condition() -> None:
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                         "message": "too long"}]}}
    assert jobs.job_failure(failed) == ("DeadlineExceeded", "too long")
    assert jobs.job_failure({"status": {"active": 1}}) is None
    assert jobs.job_succeeded({"status": {"succeeded": 1}})


def test_needs_job_thresholds() -> None:
    from ccltune.api.cluster import ClusterNode, ClusterTopology

    cluster = ClusterTopology(name="c", gpus_per_node=8,
                              nodes=[ClusterNode(name=f"n{i}", gpus=8) for i in range(4)])  # 32 GPUs
    from ccltune.workload import Workload

    cfg = load_config({"CCLTUNE_INPROCESS_MAX_GPUS": "64", "CCLTUNE_INPROCESS_MAX_SYNTH_GPUS": "16",
                       "CCLTUNE_INPROCESS_MAX_TRIALS": "500", "CCLTUNE_INPROCESS_MAX_WORK": "1000"})
    plain = spec()
    assert jobs.needs_job(plain, cluster, Workload(3, 60, 0, 0), cfg) is None
    synth = CCLTuningSpec.model_validate({"collectives": [{"op": "allreduce"}], "synthesis": {"enabled": True}})
    assert "synthesis over 32 GPUs" in (jobs.needs_job(synth, cluster, Workload(1, 21, 0, 0), cfg) or "")
    tuned = CCLTuningSpec.model_validate({"collectives": [{"op": "allreduce"}], "tuning": {"enabled": True, "budget": 200}})
    assert jobs.needs_job(tuned, cluster, Workload(1, 2, 400, 0), cfg) is None
    assert "600 tuning trials" in (jobs.needs_job(tuned, cluster, Workload(1, 3, 600, 0), cfg) or "")
    assert "estimated work 1001" in (jobs.needs_job(plain, cluster, Workload(9, 20, 0, baseline=1001), cfg) or "")
    small = load_config({"CCLTUNE_INPROCESS_MAX_GPUS": "16"})
    assert "32 GPUs" in (jobs.needs_job(plain, cluster, Workload(1, 21, 0, 0), small) or "")


def test_big_results_are_spread_over_configmaps_and_read_back() -> None:
    import os

    import yaml

    from ccltune.api.plan import Plan
    from ccltune.publish.files import plan_file, with_files

    # Incompressible content, so the gzipped plan needs several ConfigMaps.
    noise = os.urandom(1_200_000).hex()
    plan = with_files(Plan(name="p", cluster="c", world_size=16, nodes=2, tasks=[]),
                      [plan_file("msccl/big.xml", noise), plan_file("nccl.conf", "A=1\n")])
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "j", "uid": "u", "labels": {"a": "b"}}}
    cms = jobs.result_configmaps("r", plan, "ccltune-system", job)
    assert len(cms) >= 3 and cms[-1]["metadata"]["name"] == "r"  # the main one is written last
    for cm in cms:
        kubernetes_validate.validate(cm, K8S, strict=True)
        assert len(yaml.safe_dump(cm).encode()) < 1024 * 1024
        assert cm["metadata"]["ownerReferences"][0]["uid"] == "u"
    main = cms[-1]
    names = jobs.result_part_names(main)
    assert names == [cm["metadata"]["name"] for cm in cms[:-1]]
    by_name = {cm["metadata"]["name"]: cm for cm in cms}
    assert Plan.model_validate(jobs.read_result(main, [by_name[n] for n in names])) == plan
    with pytest.raises(ValueError, match="r-1"):
        jobs.read_result(main, [None, *[by_name[n] for n in names[1:]]])
    # A small plan and an error stay in one ConfigMap.
    small = with_files(Plan(name="p", cluster="c", world_size=1, nodes=1, tasks=[]), [])
    assert len(jobs.result_configmaps("r", small, "ns", None)) == 1
    err = jobs.result_configmaps("r", None, "ns", None, error="boom")
    assert err[0]["data"] == {jobs.ERROR_KEY: "boom"} and jobs.result_part_names(err[0]) == []
