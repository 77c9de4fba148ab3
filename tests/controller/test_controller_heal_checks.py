"""The generation check the healer and the webhook run, on rendered ConfigMaps (no cluster)."""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import json
from typing import Any

import pytest

from ccltune.api.plan import Plan
from ccltune.controller import webhook
from ccltune.controller.healing import Damage, check_generation
from ccltune.publish.configmaps import render_configmaps
from ccltune.publish.files import plan_file, with_files


class Store:
    """Just enough of KubeClient: ConfigMaps by name."""

    def __init__(self, manifests: list[dict[str, Any]]) -> None:
        self.objs = {m["metadata"]["name"]: copy.deepcopy(m) for m in manifests}

    async def get(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Any:
        return copy.deepcopy(self.objs.get(name))

    async def get_metadata(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Any:
        obj = self.objs.get(name)
        return None if obj is None else {"metadata": obj["metadata"]}


@functools.cache
def _generation(big: bool) -> list[dict[str, Any]]:  # Store copies it
    files = {"nccl.conf": "NCCL_ALGO=ring\n", "nccl-topo.xml": "<system/>\n"}
    if big:  # packed into gzip parts across ConfigMaps
        files["msccl/big.xml"] = "".join(f'<step s="{i}" srcoff="{i * 7919 % 1000003}"/>\n' for i in range(150_000))
    plan = with_files(Plan(name="p", cluster="c", world_size=16, nodes=2, tasks=[]),
                      [plan_file(k, v) for k, v in files.items()])
    return render_configmaps(plan, name="t-ccltune", namespace="ml")


def check(store: Store, digests: bool = True) -> Damage | None:
    return asyncio.run(check_generation(store, "t-ccltune", "ml", digests=digests))  # type: ignore[arg-type]


@pytest.mark.parametrize("big", [False, True])
def test_a_whole_generation_passes(big: bool) -> None:
    manifests = _generation(big)
    assert big == any("binaryData" in m for m in manifests[:-1])
    assert check(Store(manifests)) is None


def test_missing_pointer_and_content() -> None:
    manifests = _generation(True)
    store = Store(manifests)
    del store.objs["t-ccltune"]
    assert check(store).reason == "pointer-missing"  # type: ignore[union-attr]
    store = Store(manifests)
    gone = manifests[1]["metadata"]["name"]
    del store.objs[gone]
    for digests in (True, False):  # the webhook's cheap check finds it too
        damage = check(store, digests)
        assert damage is not None and damage.reason == "content-missing" and gone in damage.message


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"items": [{"configMap": 1}]}), None])
def test_corrupt_pointer(text: str | None) -> None:
    store = Store(_generation(False))
    data = store.objs["t-ccltune"]["data"]
    if text is None:
        del data["manifest.json"]
    else:
        data["manifest.json"] = text
    assert check(store).reason == "pointer-corrupt"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"manifest\.json"):
        webhook.read_manifest(store.objs["t-ccltune"])


def test_edited_bytes_are_found() -> None:
    store = Store(_generation(True))
    plain = next(cm for cm in store.objs.values() if "nccl.conf" in (cm.get("data") or {}))
    plain["data"]["nccl.conf"] = "NCCL_ALGO=tree\n"
    damage = check(store)
    assert damage is not None and damage.reason == "content-corrupt" and "nccl.conf" in damage.message
    assert check(store, digests=False) is None  # existence only

    store = Store(_generation(True))
    packed = next(cm for cm in store.objs.values() if cm.get("binaryData"))
    key = sorted(packed["binaryData"])[0]
    raw = bytearray(base64.b64decode(packed["binaryData"][key]))
    raw[len(raw) // 2] ^= 0xFF
    packed["binaryData"][key] = base64.b64encode(bytes(raw)).decode()
    assert check(store).reason == "content-corrupt"  # type: ignore[union-attr]


def test_manifest_that_disagrees_with_the_plan_digest() -> None:
    store = Store(_generation(False))
    pointer = store.objs["t-ccltune"]
    manifest = json.loads(pointer["data"]["manifest.json"])
    manifest["items"][0]["sha256"] = "0" * 64  # bytes and sha256 no longer add up to the digest
    pointer["data"]["manifest.json"] = json.dumps(manifest)
    assert check(store).reason == "content-corrupt"  # type: ignore[union-attr]
