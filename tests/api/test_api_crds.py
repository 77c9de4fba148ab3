"""The checked-in CRDs are exactly what the models generate, and they are structural."""

from pathlib import Path

import yaml

from ccltune.api.crd import all_crds
from ccltune.cli.crds import render_crds

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_crds_match_the_models() -> None:
    for name, text in render_crds().items():
        path = ROOT / "crds" / name
        assert path.exists(), f"{path} missing: run `ccltune crds --out crds`"
        assert path.read_text() == text, (
            f"{path} drifted from the models: run `ccltune crds --out crds`"
        )


def _walk(schema: dict, path: str = "") -> list[tuple[str, dict]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    return out


def test_schemas_are_structural_and_bounded() -> None:
    forbidden = {"$ref", "anyOf", "oneOf", "allOf", "title", "propertyNames", "$defs", "const"}
    for crd in all_crds().values():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert not forbidden & node.keys(), f"{path}: {forbidden & node.keys()}"
            assert "type" in node, f"{path} has no type"
            if node["type"] == "array":
                assert "maxItems" in node, f"{path}: unbounded list (CEL cost)"
            free_text = not {"enum", "format"} & node.keys() and path not in (
                ".apiVersion",
                ".kind",
            )
            if node["type"] == "string" and free_text:
                assert "maxLength" in node, f"{path}: unbounded string (CEL cost)"
            if isinstance(node.get("additionalProperties"), dict):
                assert "maxProperties" in node, f"{path}: unbounded map (CEL cost)"


def test_conditions_are_a_map_keyed_by_type() -> None:
    for crd in all_crds().values():
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        conditions = status["properties"]["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        assert "type" in conditions["items"]["required"]


def test_crd_names_scopes_and_columns() -> None:
    crds = {c["metadata"]["name"]: c for c in all_crds().values()}
    tuning = crds["ccltunings.ccltune.io"]["spec"]
    assert tuning["scope"] == "Namespaced" and "cclt" in tuning["names"]["shortNames"]
    columns = [c["name"] for c in tuning["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Ready", "GPUs", "Speedup", "Age"]
    assert tuning["versions"][0]["subresources"] == {"status": {}}
    assert crds["nodetopologies.ccltune.io"]["spec"]["scope"] == "Cluster"
    # Round-trips through YAML unchanged.
    for crd in crds.values():
        assert yaml.safe_load(yaml.safe_dump(crd)) == crd
