"""Publisher details (merge patches, status fallback) and the CLI's error handling."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from agent_testlib import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from ccltune.api.common import Condition
from ccltune.api.nodetopology import NodeTopologySpec
from ccltune_agent.kube import ApiError
from ccltune_agent.publish import Publisher, merge_diff


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 section 2, as the API server applies it."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


json_leaf = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.booleans())
json_docs = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abcde"), inner, max_size=4)), max_leaves=12)
objects = st.dictionaries(st.sampled_from("abcdef"), json_docs, max_size=5)


@settings(max_examples=50, deadline=None)
@given(objects, objects)
def test_merge_diff_turns_old_into_new(old: dict, new: dict) -> None:
    assert apply_merge_patch(old, merge_diff(old, new)) == new


class FakeClient:
    def __init__(self, obj: dict[str, Any] | None, status_404: bool = False) -> None:
        self.obj = obj
        self.status_404 = status_404
        self.calls: list[tuple[str, str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(("GET", path, None))
        return self.obj

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("POST", path, body))
        self.obj = body
        return body

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("PATCH", path, body))
        if path.endswith("/status") and self.status_404:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self.obj = apply_merge_patch(self.obj, body)
        return self.obj or {}


def _spec(**kw: Any) -> NodeTopologySpec:
    spec = NodeTopologySpec(node_name="n1", **kw)
    spec.content_hash = "sha256:" + str(abs(hash(json.dumps(spec.wire(), sort_keys=True))))
    return spec


CONDS = [Condition(type="Ready", status="True", reason="Published", message="m")]


def test_status_goes_to_subresource_then_falls_back() -> None:
    client = FakeClient(None)
    pub = Publisher(client, "n1", owner=None)  # type: ignore[arg-type]
    asyncio.run(pub.publish(_spec(), CONDS))
    assert [c[:2] for c in client.calls] == [("GET", pub.path), ("POST", pub.path.rsplit("/", 1)[0]),
                                             ("PATCH", pub.path + "/status")]
    client = FakeClient(None, status_404=True)
    pub = Publisher(client, "n1", owner=None)  # type: ignore[arg-type]
    asyncio.run(pub.publish(_spec(), CONDS))
    assert client.calls[-1][:2] == ("PATCH", pub.path) and "status" in client.calls[-1][2]
    assert client.obj and client.obj["status"]["conditions"][0]["type"] == "Ready"


def test_removed_binding_keys_are_deleted_and_unchanged_is_not_written() -> None:
    client = FakeClient(None)
    pub = Publisher(client, "n1", owner=None)  # type: ignore[arg-type]
    asyncio.run(pub.publish(_spec(nic_binding={"0": "mlx5_0", "1": "mlx5_1"}), CONDS))
    out = asyncio.run(pub.publish(_spec(nic_binding={"0": "mlx5_0"}), CONDS))
    assert out.spec_written and not out.status_written
    assert client.obj and client.obj["spec"]["nicBinding"] == {"0": "mlx5_0"}
    n = len(client.calls)
    out = asyncio.run(pub.publish(_spec(nic_binding={"0": "mlx5_0"}), CONDS))
    assert not out.spec_written and not out.status_written and len(client.calls) == n + 1  # one GET


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ccltune_agent", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli_probe_prints_spec_and_xml() -> None:
    fx = FIXTURES / "hgx-h100"
    res = run_cli("probe", "--node-name", "h1", "--sysfs-root", str(fx / "sysfs"), "--nvml-recording",
                  str(fx / "nvml.json"), "--format", "json", "--xml", "-")
    assert res.returncode == 0, res.stderr
    doc_end = res.stdout.index("<system")
    doc = json.loads(res.stdout[:doc_end])
    assert doc["nodeName"] == "h1" and len(doc["gpus"]) == 8
    assert res.stdout[doc_end:].count("<gpu ") == 8


def test_cli_errors_are_one_line() -> None:
    res = run_cli("probe", "--sysfs-root", "/nonexistent-root")
    assert res.returncode != 0 and "no sys/ directory" in res.stderr and "Traceback" not in res.stderr
    bad = FIXTURES / "make_fixtures.py"  # not JSON
    res = run_cli("probe", "--sysfs-root", str(FIXTURES / "v100-sxm2-4/sysfs"), "--nvml-recording", str(bad))
    assert res.returncode == 2 and "not a readable JSON file" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("run", "--sysfs-root", str(FIXTURES / "v100-sxm2-4/sysfs"), "--kubeconfig", "/nope")
    assert res.returncode == 2 and "no API server" in res.stderr


def test_cli_record_then_probe_the_recording(tmp_path) -> None:
    fx = FIXTURES / "azure-ndv4-vm"
    out = tmp_path / "capture"
    res = run_cli("record", "--out", str(out), "--node-name", "vm1", "--sysfs-root", str(fx / "sysfs"),
                  "--nvml-recording", str(fx / "nvml.json"))
    assert res.returncode == 0, res.stderr
    res = run_cli("probe", "--node-name", "vm1", "--sysfs-root", str(out / "sysfs"), "--nvml-recording",
                  str(out / "nvml.json"), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["contentHash"] == json.loads((out / "nodetopology.json").read_text())["contentHash"]
    assert json.loads(res.stdout)["pcieFlattened"] is True


def test_liveness_fails_when_the_loop_stalls() -> None:
    import time

    from ccltune_agent.health import Health

    h = Health(stall_after=0.05)
    assert h.live() and not h.ready
    time.sleep(0.08)
    assert not h.live()
    h.tick()
    assert h.live()
