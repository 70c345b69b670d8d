"""KEDA's ScaledObject on a real kube-apiserver 1.20 that serves it: the CRD in tests/schemas is
installed, `apply` creates the ScaledObject the renderer wrote field for field, and the API server's
own schema check refuses a broken one (server-side apply rejects a field the schema does not declare
and a value of the wrong type), with the server's words in the error."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from render.recipe_factory import make_recipe

from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_target import ApplyOptions, apply_kubernetes
from llmdeploy.apply.kubernetes import Instance
from llmdeploy.errors import UserError
from llmdeploy.planner import make_plan
from llmdeploy.targets import render

pytestmark = pytest.mark.cluster

CRD_PATH = Path(__file__).resolve().parents[1] / "schemas" / "scaledobjects.keda.sh.yaml"


def _served(client: KubeClient) -> bool:
    return Discovery(client).resolve("keda.sh/v1alpha1", "ScaledObject") is not None


def _wait(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def keda_crd(client: KubeClient, discovery: Discovery) -> Iterator[None]:
    """The ScaledObject CRD, installed for one test and removed after it (other tests expect a
    cluster without KEDA)."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    rt = discovery.resolve("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert rt is not None

    def established() -> bool:
        live = client.get(rt, crd["metadata"]["name"]) or {}
        conditions = (live.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    client.apply(rt, crd)
    try:
        _wait(established, "the ScaledObject CRD to be established")
        _wait(lambda: _served(client), "discovery to list keda.sh/v1alpha1")
        yield
    finally:
        client.delete(rt, crd["metadata"]["name"])
        _wait(lambda: not _served(client), "keda.sh/v1alpha1 to leave discovery")


def _rendered_scaled_object(namespace: str) -> tuple[Instance, dict[str, Any]]:
    recipe = make_recipe(
        "vllm",
        target={
            "type": "kubernetes",
            "namespace": namespace,
            "kubernetes_version": "1.20",
            "autoscaling": {"kind": "keda", "metric": "queue_depth", "target": 4, "max_replicas": 3},
        },
    )
    docs = render(recipe, make_plan(recipe)).documents
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    return Instance(recipe.name, namespace), scaled


def _apply(client: KubeClient, instance: Instance, objects: list[dict[str, Any]]) -> tuple[int, str]:
    lines: list[str] = []
    rc = apply_kubernetes(
        client, instance, objects, None, ApplyOptions(timeout_s=60), lambda _q: True, lines.append
    )
    return rc, "\n".join(lines)


def test_apply_creates_the_rendered_scaled_object_and_the_server_keeps_every_field(
    client: KubeClient, namespace: str, keda_crd: None
) -> None:
    instance, scaled = _rendered_scaled_object(namespace)
    rc, out = _apply(client, instance, [scaled])
    assert rc == 0, out
    assert "skipped" not in out
    rt = Discovery(client).resolve("keda.sh/v1alpha1", "ScaledObject")
    assert rt is not None
    live = client.get(rt, scaled["metadata"]["name"], namespace)
    assert live is not None
    # the live spec is the rendered one, field for field
    assert live["spec"] == scaled["spec"]
    assert float(live["spec"]["triggers"][0]["metadata"]["threshold"]) == 4
    assert live["metadata"]["labels"]["app.kubernetes.io/instance"] == instance.name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # HPA's field name, not KEDA's: server-side apply refuses a field the schema does not declare
        (lambda spec: spec.update(minReplicas=1), ".spec.minReplicas: field not declared in schema"),
        # KEDA's trigger metadata is a string map
        (
            lambda spec: spec["triggers"][0]["metadata"].update(threshold=4),
            ".spec.triggers[0].metadata.threshold: expected string",
        ),
    ],
    ids=["unknown-field", "threshold-not-a-string"],
)
def test_apply_reports_the_servers_refusal_of_a_broken_scaled_object(
    client: KubeClient, namespace: str, keda_crd: None, change: Any, message: str
) -> None:
    instance, scaled = _rendered_scaled_object(namespace)
    broken = copy.deepcopy(scaled)
    change(broken["spec"])
    with pytest.raises(UserError) as err:
        _apply(client, instance, [broken])
    text = str(err.value)
    assert f"apply ScaledObject {scaled['metadata']['name']}" in text
    assert message in text
