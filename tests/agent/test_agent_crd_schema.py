"""What the agent publishes is accepted by the generated CRD schema (crds/nodetopologies...)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from agent_testlib import NAMES, run_fixture

from ccltune_agent.agent import conditions_for

CRD = Path(__file__).resolve().parents[2] / "crds" / "nodetopologies.ccltune.io.yaml"


def schema() -> dict:
    doc = yaml.safe_load(CRD.read_text())
    version = next(v for v in doc["spec"]["versions"] if v["name"] == "v1alpha1")
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.skipif(not CRD.exists(), reason="CRD not generated yet")
@pytest.mark.parametrize("name", NAMES)
def test_published_object_validates(name: str) -> None:
    result = run_fixture(name)
    obj = {"apiVersion": "ccltune.io/v1alpha1", "kind": "NodeTopology", "metadata": {"name": "node-a"},
           "spec": result.spec.wire(),
           "status": {"conditions": [c.model_copy(update={"last_transition_time": result.spec.probed_at}).wire()
                                     for c in conditions_for(result)]}}
    jsonschema.validate(obj, schema())


@pytest.mark.parametrize("name", NAMES)
def test_operator_builds_a_cluster_from_the_reports(name: str) -> None:
    """Contract with topology/from_nodes.py: two nodes' reports join into one ClusterTopology."""
    from ccltune.topology.from_nodes import from_nodes

    specs = [run_fixture(name, node=f"n{i}").spec for i in range(2)]
    topo = from_nodes(specs, {f"n{i}": {"ccltune.io/leaf": "l0"} for i in range(2)})
    assert [n.name for n in topo.nodes] == ["n0", "n1"]
    assert all(n.gpus == len(specs[0].gpus) for n in topo.nodes)
