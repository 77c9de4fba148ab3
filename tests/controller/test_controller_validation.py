"""Specs the operator cannot plan end as a condition naming the field: refused at admission by
the CRD (the emulator validates like an API server), or stopped at the start of reconcile before
any planning work; never InternalError, never a retry loop, never a traceback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ctl_harness import Cluster
from ctl_world import Operator
from test_controller_e2e import condition, tuning, wait_condition

from ccltune.publish.configmaps import LABEL_PLAN

pytestmark = pytest.mark.slow
GV = "ccltune.io/v1alpha1"
# The cluster of the e2e world: 2 nodes x 8 GPUs reported by the agents.
WORLD = 16


def writes(c: Cluster, ns: str) -> list[str]:
    """The operator's writes in a namespace, but Events (posted once per condition transition,
    asynchronously): every reconcile pass writes the status, so a retry loop shows here."""
    return [f"{r['method']} {r['path']}" for r in c.api_log() if r["namespace"] == ns
            and r["identity"] == "operator" and r["method"] in ("POST", "PATCH", "PUT", "DELETE")
            and r["resource"] != "events"]


def plans_in_operator(op: Operator) -> float:
    """How many plans the operator built in-process so far (its own histogram count)."""
    url = f"http://127.0.0.1:{op.env['CCLTUNE_METRICS_PORT']}/metrics"
    text = ""
    for _ in range(300):  # the endpoint comes up with the operator
        try:
            text = httpx.get(url, timeout=10).text
            break
        except httpx.ConnectError:
            assert op.proc.proc.poll() is None, op.logs()
            time.sleep(0.1)
    for line in text.splitlines():
        if line.startswith('ccltune_plan_duration_seconds_count{where="operator"}'):
            return float(line.split()[-1])
    return 0.0


class LogWindow:
    """The operator log written from now on."""

    def __init__(self, op: Operator) -> None:
        self.path = op.proc.log_path
        self.start = self.path.stat().st_size

    def text(self) -> str:
        with self.path.open("rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")


@pytest.fixture
def witness(cluster: Cluster, operator: Operator) -> Iterator[Any]:
    """A well-formed CCLTuning planned to Ready: the clock for "no retry since" (by work done,
    not by seconds: its plan spans many of the operator's retry intervals)."""
    made: list[tuple[str, str]] = []

    def run(ns: str) -> None:
        name = f"witness-{len(made)}"
        cluster.create(tuning(name, ns))
        made.append((ns, name))
        wait_condition(cluster, operator, ns, name, "Ready", "True", timeout=120)

    yield run
    for ns, name in made:
        cluster.delete(GV, "ccltunings", name, ns)


def stopped_once(cluster: Cluster, op: Operator, witness: Any, ns: str, name: str, reason: str,
                 field: str, log: LogWindow) -> dict[str, Any]:
    """Ready=False with `reason`, the message starting with `field`; then quiet; no traceback."""
    cond = wait_condition(cluster, op, ns, name, "Ready", "False", reason, timeout=120)
    assert cond["message"].startswith(field), cond["message"]
    # The first witness lets the pass that set the condition finish its own writes (kopf's
    # annotations may land after the status under load); the second is the clock for "no retry".
    witness(f"{ns}-w")
    settled = writes(cluster, ns)
    witness(f"{ns}-w")
    assert writes(cluster, ns) == settled, f"the operator kept working on a spec it had stopped: {settled}"
    assert condition(cluster, ns, name, "Ready") == cond
    text = log.text()
    assert "Traceback" not in text and "InternalError" not in text, text[-3000:]
    return cond


def test_parallelism_that_does_not_fit_the_cluster(cluster: Cluster, operator: Operator, witness: Any) -> None:
    log, ns = LogWindow(operator), "par"
    planned = plans_in_operator(operator)
    body = tuning("tp3dp5", ns)
    del body["spec"]["collectives"]
    body["spec"]["parallelism"] = {"tp": 3, "dp": 5}  # the CRD admits it: only the cluster says no
    cluster.create(body)
    cond = stopped_once(cluster, operator, witness, ns, "tp3dp5", "InvalidSpec", "spec.parallelism", log)
    assert "dp communicator" in cond["message"] and "8 GPUs per node" in cond["message"]
    assert plans_in_operator(operator) == planned + 2  # only the two witnesses were planned


@pytest.mark.parametrize("size", ["1T", "999999999999999T"])
def test_max_bytes_over_the_limit_is_refused_at_admission(cluster: Cluster, size: str) -> None:
    body = tuning("huge", "sizes")
    body["spec"]["collectives"][0]["maxBytes"] = size
    resp = cluster.http.post(f"/apis/{GV}/namespaces/sizes/ccltunings", json=body)
    assert resp.status_code == 422
    causes = resp.json()["details"]["causes"]
    assert [c["field"] for c in causes] == ["spec.collectives[0].maxBytes"]
    assert "at most 16G" in causes[0]["message"]


def test_max_bytes_over_the_limit_admitted_by_an_old_crd_stops(cluster: Cluster, operator: Operator,
                                                              witness: Any) -> None:
    log, ns = LogWindow(operator), "sizes-old"
    body = tuning("huge", ns)
    body["spec"]["collectives"][0]["maxBytes"] = "999999999999999T"
    with cluster.admitting_anything():  # a cluster still serving the CRD without the rule
        cluster.create(body)
    cond = stopped_once(cluster, operator, witness, ns, "huge", "InvalidSpec",
                        "spec.collectives[0].maxBytes", log)
    assert "at most 16G" in cond["message"]


def test_config_map_name_must_be_a_dns_name(cluster: Cluster, operator: Operator, witness: Any) -> None:
    body = tuning("umlaut", "names", publish={"configMapName": "plän-ü"})
    resp = cluster.http.post(f"/apis/{GV}/namespaces/names/ccltunings", json=body)
    assert resp.status_code == 422
    assert [c["field"] for c in resp.json()["details"]["causes"]] == ["spec.publish.configMapName"]
    # Admitted anyway (older CRD): the operator stops with the field named, and never writes
    # a ConfigMap the API server would refuse.
    assert cluster.server is not None
    refused = len(cluster.server.rejected)
    log, ns = LogWindow(operator), "names-old"
    body["metadata"]["namespace"] = ns
    with cluster.admitting_anything():
        cluster.create(body)
    stopped_once(cluster, operator, witness, ns, "umlaut", "InvalidSpec", "spec.publish.configMapName", log)
    assert cluster.server.rejected[refused:] == [], "the operator wrote what the API server refuses"


def test_a_63_character_name_publishes(cluster: Cluster, operator: Operator) -> None:
    ns, name = "longname", ("llama-pretrain-" * 5)[:62] + "a"
    assert len(name) == 63  # the most a Job-owned or label-referenced name can be
    log = LogWindow(operator)
    cluster.create(tuning(name, ns))
    wait_condition(cluster, operator, ns, name, "Ready", "True", timeout=120)
    status = cluster.get(GV, "ccltunings", name, ns)["status"]  # type: ignore[index]
    pointer = f"{name}-ccltune"
    cms = {cm["metadata"]["name"]: cm for cm in cluster.list("v1", "configmaps", ns)}
    assert pointer in cms and [c["name"] for c in status["configMaps"]][-1] == pointer
    for cm in status["configMaps"]:
        labels = cms[cm["name"]]["metadata"]["labels"]
        assert all(len(v) <= 63 for v in labels.values())
    # The label names the pointer, hash-shortened to fit; the same value every time.
    plan_label = cms[pointer]["metadata"]["labels"][LABEL_PLAN]
    assert len(plan_label) == 63 and plan_label.startswith(name[:40])
    assert "Traceback" not in log.text()


def test_overlapping_task_keys_are_refused_before_any_work(cluster: Cluster, operator: Operator,
                                                           witness: Any) -> None:
    log, ns = LogWindow(operator), "overlap"
    planned = plans_in_operator(operator)
    # Planned, this would be thousands of trials over 1K..16G; refused, it costs nothing.
    body = tuning("overlap", ns, tuning={"enabled": True, "budget": 1000},
                  collectives=[{"op": "allreduce", "minBytes": "1K", "maxBytes": "16G"},
                               {"op": "allgather", "minBytes": "64K", "maxBytes": "1M"},
                               {"op": "allreduce", "minBytes": "1M", "maxBytes": "2M"}])
    cluster.create(body)
    cond = stopped_once(cluster, operator, witness, ns, "overlap", "InvalidSpec", "spec.collectives[2]", log)
    assert "overlaps spec.collectives[0]" in cond["message"]
    assert plans_in_operator(operator) == planned + 2  # the two witnesses only
    assert not [j for j in cluster.list("batch/v1", "jobs", "ccltune-system")
                if j["metadata"]["labels"].get("ccltune.io/tuning-uid")
                == cluster.get(GV, "ccltunings", "overlap", ns)["metadata"]["uid"]]  # type: ignore[index]


def test_spec_over_the_hard_limit_says_which_and_by_how_much(cluster: Cluster, operator: Operator,
                                                            witness: Any) -> None:
    log, ns = LogWindow(operator), "limits"
    body = tuning("enormous", ns, tuning={"enabled": True, "budget": 100000},
                  collectives=[{"op": op, "minBytes": "1K", "maxBytes": "16G"}
                               for op in ("allreduce", "allgather", "reducescatter")])
    cluster.create(body)
    cond = stopped_once(cluster, operator, witness, ns, "enormous", "PlanTooLarge", "estimated work", log)
    # 3 tasks x 25 buckets x (100000 trials + 5 checks) + 75 size points x 16 ranks x 3
    assert "7503975 work units" in cond["message"]
    assert "over maxPlanWork 5000000 by 2503975 (1.5x)" in cond["message"]
    assert condition(cluster, ns, "enormous", "Tuned")["reason"] == "PlanTooLarge"  # type: ignore[index]


# -- offline: `ccltune plan` runs the same preflight before any work ---------------------------

@pytest.mark.parametrize(("spec", "field"), [
    ({"tuning": {"enabled": True, "budget": 100000}, "synthesis": {"enabled": True},
      "collectives": [{"op": "allreduce", "minBytes": "1K", "maxBytes": "16G"},
                      {"op": "allreduce", "minBytes": "1M", "maxBytes": "2M"}]}, "spec.collectives[1]"),
    ({"tuning": {"enabled": True, "budget": 100000}, "parallelism": {"tp": 3, "dp": 5}}, "spec.parallelism"),
], ids=["overlap", "tp3dp5"])
def test_offline_plan_refuses_before_any_work(tmp_path: Any, spec: dict[str, Any], field: str) -> None:
    import subprocess
    import sys

    import yaml

    doc = {"apiVersion": GV, "kind": "CCLTuning", "metadata": {"name": "x"}, "spec": spec}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    # Planned, either spec is hours of tuning and synthesis on this cluster.
    result = subprocess.run([sys.executable, "-m", "ccltune", "plan", str(tmp_path / "t.yaml"),
                             "--cluster", "dgx-a100-2", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert field in result.stderr and "Traceback" not in result.stderr
    assert "work estimate" not in result.stdout and not (tmp_path / "out").exists()
