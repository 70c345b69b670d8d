"""The protocol's dispatch: the CLI and the library reach a target's verbs through the registry, and a
Kubernetes-backed target hands its objects, readiness and kinds to the shared Kubernetes verbs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import llmdeploy.apply.kube_target as kube_target
from llmdeploy.apply.rollout import RolloutState, StateOf
from llmdeploy.planner import MemoryPlan, make_plan
from llmdeploy.recipe import load_recipe
from llmdeploy.recipe.schema import Recipe
from llmdeploy.targets import ApplyRequest, Console, Rendered, apply, get_target
from llmdeploy.targets.kube_backed import KubernetesBackedTarget
from llmdeploy.targets.kubernetes import KUBERNETES

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SERVING = {"apiVersion": "example.dev/v1", "kind": "Serving", "metadata": {"name": "x"}}


def _ready(obj: dict[str, Any]) -> RolloutState:
    return RolloutState(True, False, "ready", ())


class Platform(KubernetesBackedTarget):
    """A platform as the protocol describes one: objects, readiness, its kinds and its URL."""

    name = "kubernetes"  # reuses the kubernetes section; only the verbs are under test
    display_name = "a platform"
    section = KUBERNETES.section
    readiness: Mapping[str, StateOf] = {"Serving": _ready}
    owned_kinds: Mapping[str, str] = {"Serving": "example.dev/v1"}
    reads_url_from_cluster = True

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Any]:
        return []

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        return Rendered({"serving.yaml": "kind: Serving\n"}, (SERVING,))

    def namespace(self, recipe: Recipe) -> str:
        return "platform-ns"

    def url_from_objects(self, recipe: Recipe, live: Sequence[dict[str, Any]]) -> str | None:
        return next((o["status"]["url"] for o in live if o.get("status", {}).get("url")), None)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    @contextmanager
    def connect(kubeconfig: Any, context: Any) -> Iterator[str]:
        seen["cluster"] = (kubeconfig, context)
        yield "client"

    def apply_kubernetes(client: str, instance: Any, objects: list[dict[str, Any]], *rest: Any) -> int:
        seen["apply"] = (instance, objects, rest[-2], rest[-1])
        return 0

    def status_kubernetes(client: str, instance: Any, echo: Any, readiness: Any, kinds: Any) -> int:
        seen["status"] = (instance, readiness, kinds)
        return 0

    monkeypatch.setattr(kube_target, "connect", connect)
    monkeypatch.setattr(kube_target, "apply_kubernetes", apply_kubernetes)
    monkeypatch.setattr(kube_target, "status_kubernetes", status_kubernetes)
    return seen


def test_a_kubernetes_backed_target_hands_over_its_objects_readiness_and_kinds(
    calls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmdeploy.apply.prune as prune

    platform = Platform()
    monkeypatch.setattr(prune, "live_objects", lambda *a: [])
    recipe = load_recipe(RECIPES / "production.yaml")
    request = ApplyRequest(recipe_path=Path("production.yaml"), assume_yes=True)
    result = platform.apply(recipe, make_plan(recipe), request, Console())
    instance, objects, readiness, kinds = calls["apply"]
    assert (instance.name, instance.namespace) == ("production", "platform-ns")
    assert objects == [SERVING] and readiness == {"Serving": _ready} and kinds == platform.owned_kinds
    assert result.ok and result.exit_code == 0 and result.target == "kubernetes"
    # no URL published yet: the recipe's server address
    assert result.url == "http://127.0.0.1:8000"
    assert platform.status(recipe, request.cluster, Console()) == 0
    assert calls["status"][1:] == ({"Serving": _ready}, platform.owned_kinds)


def test_endpoint_url_reads_the_platforms_status(
    calls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmdeploy.apply.prune as prune
    from llmdeploy.apply.kube_objects import PlannedObject

    live = {**SERVING, "status": {"url": "http://serving.platform-ns.example"}}
    monkeypatch.setattr(prune, "live_objects", lambda *a: [PlannedObject(None, live)])  # type: ignore[arg-type]
    monkeypatch.setattr("llmdeploy.apply.discovery.Discovery", lambda client: None)
    recipe = load_recipe(RECIPES / "production.yaml")
    assert (
        Platform().endpoint_url(recipe, ApplyRequest(Path("p.yaml")).cluster)
        == "http://serving.platform-ns.example"
    )


def test_a_declined_apply_is_a_result_not_an_exit(
    calls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_target, "apply_kubernetes", lambda *a: 1)
    recipe = load_recipe(RECIPES / "production.yaml")
    result = apply(recipe, ApplyRequest(recipe_path=Path("production.yaml")), Console())
    assert not result.ok and result.exit_code == 1 and result.detail == "nothing applied"


def test_the_library_apply_returns_an_apply_result(calls: dict[str, Any]) -> None:
    import llmdeploy.api as api

    result = api.apply(load_recipe(RECIPES / "production.yaml"), assume_yes=True, wait=False)
    assert isinstance(result, api.ApplyResult) and result.ok
    assert result.detail == "applied (not waited on)"
    instance, objects, _, _ = calls["apply"]
    assert instance.namespace == "llm" and {o["kind"] for o in objects} >= {"Deployment", "Service"}


@pytest.mark.parametrize("name", ["local", "docker", "kubernetes"])
def test_each_target_says_where_smoke_finds_it(name: str) -> None:
    recipe = load_recipe(RECIPES / "quickstart.yaml", [f"target={{type: {name}}}"])
    assert (
        get_target(name).endpoint_url(recipe, ApplyRequest(Path("q.yaml")).cluster) == "http://127.0.0.1:8000"
    )
