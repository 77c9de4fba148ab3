"""admission.inject without a cluster: every failure admits untuned (or denies under Fail)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
import kopf
import pytest

from ccltune.api.ccltuning import LabelSelector
from ccltune.api.plan import Plan
from ccltune.controller import admission, metrics, webhook
from ccltune.controller.config import OperatorConfig
from ccltune.controller.healing import Healer
from ccltune.controller.kube import ApiError
from ccltune.controller.reconcile import Context
from ccltune.publish.configmaps import render_configmaps
from ccltune.publish.files import plan_file, with_files

NS = "ml"
ENTRY = webhook.Entry(name="t", selector=LabelSelector.model_validate({"matchLabels": {"app": "llm"}}),
                      inject=True, pointer="t-ccltune", published=True, digest=None, uid="uid-t")
POD = {"metadata": {"name": "p", "namespace": NS, "labels": {"app": "llm"}},
       "spec": {"containers": [{"name": "c", "image": "x"}]}}


class Client:
    """ConfigMaps by name; `fail` is raised by every read, `hang` makes reads never return."""

    def __init__(self, fail: BaseException | None = None, hang: bool = False) -> None:
        plan = with_files(Plan(name="p", cluster="c", world_size=8, nodes=1, tasks=[]),
                          [plan_file("nccl.conf", "NCCL_ALGO=ring\n")])
        self.objs = {m["metadata"]["name"]: m for m in render_configmaps(plan, name="t-ccltune", namespace=NS)}
        self.fail, self.hang = fail, hang
        self.events: list[dict[str, Any]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def get(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Any:
        if self.hang:
            await asyncio.Event().wait()
        if self.fail is not None:
            raise self.fail
        return copy.deepcopy(self.objs.get(name))

    get_metadata = get

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str | None = None) -> Any:
        self.events.append(body)
        return body

    async def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                    namespace: str | None = None, subresource: str | None = None) -> Any:
        self.patches.append((name, body))
        return body


def run(client: Client, policy: str = "Ignore", timeout: float = 3) -> tuple[dict[str, Any], list[str], Client]:
    cfg = OperatorConfig(webhook_failure_policy=policy, webhook_api_timeout_seconds=timeout)
    ctx = Context(client=client, cfg=cfg)  # type: ignore[arg-type]
    patch: dict[str, Any] = {}
    warnings: list[str] = []

    async def main() -> None:
        await admission.inject(ctx, Healer(ctx), [ENTRY], pod=copy.deepcopy(POD), patch=patch,  # type: ignore[arg-type]
                               namespace=NS, dryrun=False, warnings=warnings)
        await asyncio.gather(*admission._background)  # the Event and the re-plan request
    asyncio.run(main())
    return patch, warnings, client


def failures(reason: str) -> float:
    value: float = metrics.WEBHOOK_FAILURES.labels(reason)._value.get()
    return value


def test_a_whole_generation_is_injected() -> None:
    patch, warnings, client = run(Client())
    assert patch["spec"]["volumes"][0]["name"] == webhook.VOLUME and not warnings and not client.events


@pytest.mark.parametrize(("fail", "reason"), [
    (httpx.RemoteProtocolError("Server disconnected without sending a response."), "api-unreachable"),
    (httpx.ConnectError("[Errno 111] Connection refused"), "api-unreachable"),
    (ApiError(500, "GET", "/api/v1/namespaces/ml/configmaps/t-ccltune", "etcdserver: leader changed"), "api-error"),
    (RuntimeError("a bug"), "internal"),
])
def test_read_failures_admit_untuned(fail: BaseException, reason: str) -> None:
    before = failures(reason)
    patch, warnings, client = run(Client(fail=fail))
    assert patch == {}
    assert len(warnings) == 1 and warnings[0].startswith("ccltune: pod ml/p admitted untuned") and len(warnings[0]) <= 256
    assert failures(reason) == before + 1
    [event] = client.events
    assert event["involvedObject"]["kind"] == "CCLTuning" and event["reason"] == "PodNotInjected"


def test_a_hanging_api_server_times_out_into_an_untuned_admission() -> None:
    before = failures("timeout")
    patch, warnings, _ = run(Client(hang=True), timeout=0.05)
    assert patch == {} and "did not answer in time" in warnings[0] and failures("timeout") == before + 1


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda objs: objs.pop("t-ccltune"), "plan-damaged"),
    (lambda objs: objs["t-ccltune"]["data"].update({"manifest.json": "{"}), "corrupt-pointer"),
    (lambda objs: objs.pop(next(n for n in objs if n != "t-ccltune")), "plan-damaged"),
])
def test_damaged_generations_are_not_mounted_and_are_reported(damage: Any, reason: str) -> None:
    client = Client()
    damage(client.objs)
    before = failures(reason)
    patch, warnings, client = run(client)
    assert patch == {} and warnings and failures(reason) == before + 1
    # The healer was told: one re-plan request on the CCLTuning.
    assert [name for name, body in client.patches if "ccltune.io/replan" in body["metadata"]["annotations"]] == ["t"]


def test_fail_policy_denies() -> None:
    with pytest.raises(kopf.AdmissionError) as info:
        run(Client(fail=httpx.ConnectError("refused")), policy="Fail")
    assert info.value.code == 500 and "failurePolicy Fail" in str(info.value)


def test_malformed_reviews_get_an_answer() -> None:
    server = admission.WebhookServer()
    answer = server.fallback({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u"}}, "malformed-review", "x")
    assert answer["response"] == {"uid": "u", "allowed": True,
                                  "warnings": ["ccltune: admission review not served (malformed-review): x"]}
    server.failure_policy = "Fail"
    denied = server.fallback(None, "malformed-review", "x")["response"]
    assert denied["allowed"] is False and denied["status"]["code"] == 500
