"""The pinned platform schemas (tests/targets/crds, sources in SOURCE.md) and checks against them.

`unknown_fields` matters beyond jsonschema: a kube-apiserver silently prunes a custom resource's
fields its structural schema does not declare, so a misspelt field would be dropped, not refused.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_DIR = Path(__file__).resolve().parent / "crds"
CRD_FILES = {
    ("serving.kserve.io/v1alpha2", "LLMInferenceService"): "kserve-v0.20.0-llminferenceservices.yaml",
    ("inference.networking.k8s.io/v1", "InferencePool"): "gaie-v1.5.0-inferencepools.yaml",
    ("kubeai.org/v1", "Model"): "kubeai-v0.22.1-models.yaml",
}
VALUES_SCHEMA = CRD_DIR / "production-stack-vllm-stack-0.1.12-values.schema.json"
# CRD schema keys kube-apiserver 1.20 does not know (CEL validation rules came in 1.23)
NEWER_CRD_KEYS = frozenset({"x-kubernetes-validations"})


@cache
def crd(file: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((CRD_DIR / file).read_text(), Loader=loader)  # type: ignore[no-any-return]


def _taken_by_1_20(key: str, value: Any) -> bool:
    # 1.20 reads an empty-string default as null and refuses the whole CRD ("must be of type
    # string"); later releases take it, and the objects rendered here never rely on one
    return key not in NEWER_CRD_KEYS and not (key == "default" and value == "")


def without_newer_keys(node: Any) -> Any:
    """The CRD as kube-apiserver 1.20 takes it: CEL rules (x-kubernetes-validations) and
    empty-string defaults removed; a list-map key that loses its default becomes required, as 1.20
    demands of such keys (stricter than the pinned CRD only for objects that leave the key out)."""
    if isinstance(node, dict):
        out = {k: without_newer_keys(v) for k, v in node.items() if _taken_by_1_20(k, v)}
        keys = node.get("x-kubernetes-list-map-keys")
        items = out.get("items")
        if keys and isinstance(items, dict):
            props = items.get("properties", {})
            lost = [k for k in keys if k in props and "default" not in props[k]]
            items["required"] = sorted({*items.get("required", []), *lost})
        return out
    if isinstance(node, list):
        return [without_newer_keys(v) for v in node]
    return node


def installable_crds() -> list[dict[str, Any]]:
    return [without_newer_keys(crd(file)) for file in CRD_FILES.values()]


def object_schema(api_version: str, kind: str) -> dict[str, Any]:
    definition = crd(CRD_FILES[(api_version, kind)])
    version = api_version.rsplit("/", 1)[1]
    served = {v["name"]: v for v in definition["spec"]["versions"]}
    return served[version]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths in `value` that `schema` does not declare (what the API server would prune)."""
    found: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return found
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                found += unknown_fields(sub, props[key], where)
            elif isinstance(extra, dict):
                found += unknown_fields(sub, extra, where)
            elif props is not None or extra is False:
                found.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def defaults_filled(node: Any) -> Any:
    """The schema as the API server checks an object after defaulting it: a required field that
    has a default is filled in, so it is not missing."""
    if isinstance(node, dict):
        out = {k: defaults_filled(v) for k, v in node.items()}
        props = node.get("properties")
        if isinstance(props, dict) and "required" in node:
            out["required"] = [r for r in node["required"] if "default" not in props.get(r, {})]
        return out
    if isinstance(node, list):
        return [defaults_filled(v) for v in node]
    return node


def check_custom_resource(doc: dict[str, Any]) -> None:
    """`doc` is valid against its pinned CRD's schema and declares no field the schema lacks."""
    schema = object_schema(doc["apiVersion"], doc["kind"])
    jsonschema.validate(doc, defaults_filled(schema))
    body = {k: v for k, v in doc.items() if k != "metadata"}
    assert unknown_fields(body, schema) == [], f"{doc['kind']} fields the CRD does not declare"


@cache
def values_schema() -> dict[str, Any]:
    return json.loads(VALUES_SCHEMA.read_text())  # type: ignore[no-any-return]


def check_chart_values(values: dict[str, Any]) -> None:
    """`values` are valid for the vllm-stack chart and set no key its schema does not describe."""
    schema = values_schema()
    jsonschema.validate(values, schema)
    assert unknown_fields(values, schema) == [], "values the chart's schema does not describe"
