"""apply_configmaps: content first, pointer last; an immutable namesake with other bytes is replaced."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from ccltune.controller.kube import ApiError
from ccltune.controller.publishing import apply_configmaps


class FakeClient:
    """ConfigMaps by name; records the calls (create fails with 409 on an existing name)."""

    def __init__(self, existing: list[dict[str, Any]]) -> None:
        self.store = {cm["metadata"]["name"]: copy.deepcopy(cm) for cm in existing}
        self.calls: list[tuple[str, str]] = []

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        if name in self.store:
            raise ApiError(409, "POST", f"/api/v1/namespaces/{namespace}/{plural}", "AlreadyExists")
        self.store[name] = copy.deepcopy(body)
        return body

    async def get(self, api_version: str, plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.store.get(name))

    async def delete(self, api_version: str, plural: str, name: str, namespace: str) -> bool:
        self.calls.append(("delete", name))
        return self.store.pop(name, None) is not None

    async def patch(self, api_version: str, plural: str, name: str, patch: dict[str, Any], namespace: str) -> dict[str, Any]:
        self.calls.append(("patch", name))
        self.store[name].update(patch)
        return self.store[name]


def _cm(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "immutable": True, **fields}


def test_same_content_is_kept_and_other_bytes_are_replaced() -> None:
    same = _cm("p-abc-0", data={"nccl.conf": "A=1\n"})
    packed = _cm("p-abc-1", binaryData={"msccl__x.xml.gz": "bmV3"})
    pointer = _cm("p", data={"manifest.json": "{}"})
    client = FakeClient([same, _cm("p-abc-1", binaryData={"msccl__x.xml.gz.part000": "b2xk"})])
    asyncio.run(apply_configmaps(client, [same, packed, pointer], "ns"))  # type: ignore[arg-type]
    assert ("delete", "p-abc-0") not in client.calls  # equal content: left alone
    assert client.calls.index(("delete", "p-abc-1")) < len(client.calls) - 1
    assert client.store["p-abc-1"]["binaryData"] == {"msccl__x.xml.gz": "bmV3"}
    assert client.calls[-1] == ("create", "p")  # the pointer comes last
