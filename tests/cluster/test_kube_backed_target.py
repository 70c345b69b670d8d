"""A Kubernetes-backed target through the protocol alone, against the real API server: a platform-like
target (its own CRD kind, readiness and status URL) gets apply, diff, status, prune, delete and its
endpoint URL from `KubernetesBackedTarget` by providing only its objects, readiness, kinds and URL."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.rollout import RolloutState, StateOf
from llmdeploy.errors import Problem
from llmdeploy.planner import MemoryPlan, make_plan
from llmdeploy.recipe import load_recipe
from llmdeploy.recipe.schema import KubernetesTarget, Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.render.capacity_marks import capacity_annotations
from llmdeploy.targets import ApplyRequest, Cluster, Console, Rendered
from llmdeploy.targets.kube_backed import KubernetesBackedTarget

pytestmark = pytest.mark.cluster

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "production.yaml"
GROUP = "serving.llmdeploy-test.dev"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"servings.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "servings", "singular": "serving", "kind": "Serving", "listKind": "ServingList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "replicas": {"type": "integer"},
                                    "args": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def _serving_state(obj: dict[str, Any]) -> RolloutState:
    url = (obj.get("status") or {}).get("url")
    return RolloutState(bool(url), False, f"url {url or 'not published yet'}", ())


class Platform(KubernetesBackedTarget):
    name = "kubernetes"  # the kubernetes section stands in for a platform's own
    display_name = "a test platform"
    section: type[Section] = KubernetesTarget
    readiness: Mapping[str, StateOf] = {"Serving": _serving_state}
    owned_kinds: Mapping[str, str] = {"Serving": f"{GROUP}/v1"}
    reads_url_from_cluster = True

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        return []

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        serving = {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Serving",
            "metadata": {"name": recipe.name, "annotations": capacity_annotations(plan)},
            "spec": {
                "replicas": recipe.parallelism.replicas,
                "args": ["--max-model-len", str(recipe.limits.max_model_len)],
            },
        }
        config = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{recipe.name}-conf"},
            "data": {"a": "b"},
        }
        return Rendered({}, (config, serving))

    def namespace(self, recipe: Recipe) -> str:
        assert isinstance(recipe.target, KubernetesTarget)
        return recipe.target.namespace

    def url_from_objects(self, recipe: Recipe, live: Sequence[dict[str, Any]]) -> str | None:
        return next((str(o["status"]["url"]) for o in live if (o.get("status") or {}).get("url")), None)


def _wait(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def serving_crd(client: KubeClient, discovery: Discovery) -> Iterator[None]:
    rt = discovery.resolve("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert rt is not None
    client.apply(rt, CRD)
    try:
        _wait(lambda: Discovery(client).resolve(f"{GROUP}/v1", "Serving") is not None, "the Serving kind")
        yield
    finally:
        client.delete(rt, CRD["metadata"]["name"])


def test_a_platform_target_gets_every_verb_from_the_protocol(
    client: KubeClient, kubeconfig: Path, namespace: str, serving_crd: None
) -> None:
    recipe = load_recipe(RECIPE, [f"target.namespace={namespace}"])
    plan = make_plan(recipe)
    platform = Platform()
    lines: list[str] = []
    console = Console(echo=lines.append, out=lines.append, confirm=lambda _q: True)
    request = ApplyRequest(RECIPE, assume_yes=True, wait=False, cluster=Cluster(kubeconfig))

    result = platform.apply(recipe, plan, request, console)
    assert result.ok, lines
    assert any(f"Serving {namespace}/production" in line for line in lines), lines
    rt = Discovery(client).resolve(f"{GROUP}/v1", "Serving")
    assert rt is not None
    live = client.get(rt, "production", namespace)
    assert live is not None and live["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llmdeploy"
    assert live["metadata"]["annotations"]["llmdeploy.io/kv-cache-tokens"] == str(plan.kv_cache_tokens)

    lines.clear()
    assert platform.diff(recipe, plan, request, console) == 0, lines
    changed = load_recipe(RECIPE, [f"target.namespace={namespace}", "limits.max_model_len=16384"])
    lines.clear()
    assert platform.diff(changed, make_plan(changed), request, console) == 1
    assert any(f"~ Serving {namespace}/production" in line for line in lines), lines

    # no controller published a URL yet: not ready, and smoke would use the recipe's address
    lines.clear()
    assert platform.status(recipe, request.cluster, console) == 1
    assert any("url not published yet" in line for line in lines), lines
    assert platform.endpoint_url(recipe, request.cluster) == "http://127.0.0.1:8000"

    # the platform's controller (here: the test, as the fake kubelet does for pods) publishes the URL
    from kubernetes import client as k8s

    k8s.CustomObjectsApi(client.api_client).patch_namespaced_custom_object_status(
        GROUP,
        "v1",
        namespace,
        "servings",
        "production",
        {"status": {"url": "http://production.svc.example:8000"}},
    )
    lines.clear()
    assert platform.status(recipe, request.cluster, console) == 0, lines
    assert platform.endpoint_url(recipe, request.cluster) == "http://production.svc.example:8000"

    lines.clear()
    assert platform.delete(recipe, request, console) == 0, lines
    assert client.get(rt, "production", namespace) is None
    assert any(f"deleted Serving {namespace}/production" in line for line in lines), lines
