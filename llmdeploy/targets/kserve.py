"""The kserve target: one LLMInferenceService (serving.kserve.io/v1alpha2, KServe 0.20) running vLLM
or SGLang, applied with the shared Kubernetes verbs; `smoke` reads the URL from its status.

The object is built in llmdeploy/targets/kserve_objects.py; this module owns the recipe's
`target: {type: kserve}` section and what KServe cannot express.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from llmdeploy.apply.rollout import STATE_OF_KIND, RolloutState, conditions_of
from llmdeploy.errors import Problem
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.recipe.target_kserve import KServeTarget
from llmdeploy.render.renderer import parse_documents
from llmdeploy.targets.base import Rendered
from llmdeploy.targets.kserve_objects import KSERVE_PORT, kserve_files
from llmdeploy.targets.kube_backed import KubernetesBackedTarget
from llmdeploy.targets.platform_launch import (
    engine_problems,
    hub_model_problems,
    multi_node_problems,
    port_problems,
)

KIND = "LLMInferenceService"
API_VERSION = "serving.kserve.io/v1alpha2"


def _section(recipe: Recipe) -> KServeTarget:
    assert isinstance(recipe.target, KServeTarget), recipe.target.type
    return recipe.target


def llm_inference_service_state(obj: dict[str, Any]) -> RolloutState:
    """Ready when KServe's controller sets the Ready condition; failed when it says why not."""
    conditions = conditions_of(obj)
    ready = next((c for c in conditions if c.type == "Ready"), None)
    done = ready is not None and ready.status == "True"
    failed = ready is not None and ready.status == "False" and ready.reason not in ("", "Pending")
    summary = "ready" if done else (ready.message or ready.reason) if ready else "waiting for KServe"
    return RolloutState(done=done, failed=failed, summary=summary, conditions=conditions)


class KServe(KubernetesBackedTarget):
    name = "kserve"
    display_name = "KServe"
    section: type[Section] = KServeTarget
    readiness = MappingProxyType({**STATE_OF_KIND, KIND: llm_inference_service_state})
    owned_kinds = MappingProxyType({KIND: API_VERSION})
    reads_url_from_cluster = True

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        target = _section(recipe)
        return [
            *engine_problems(
                recipe,
                "KServe's LLMInferenceService",
                ("vllm", "sglang"),
                "use engine.type: vllm or sglang (the runtimes KServe's LLMInferenceService serves)",
            ),
            *port_problems(recipe, "KServe", KSERVE_PORT),
            *hub_model_problems(recipe, "KServe", None if target.model_uri is None else "target.model_uri"),
            *multi_node_problems(
                recipe,
                "KServe's LLMInferenceService",
                "use hardware.nodes: 1, or the kubernetes target (a LeaderWorkerSet) for replicas "
                "spanning nodes",
            ),
        ]

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        files = kserve_files(recipe, _section(recipe), plan)
        return Rendered(files, parse_documents(files))

    def namespace(self, recipe: Recipe) -> str:
        return _section(recipe).namespace

    def url_from_objects(self, recipe: Recipe, live: Sequence[dict[str, Any]]) -> str | None:
        for obj in live:
            if obj.get("kind") == KIND and obj.get("metadata", {}).get("name") == recipe.name:
                url = (obj.get("status") or {}).get("url")
                return str(url).rstrip("/") if url else None
        return None

    def pod_selector(self, recipe: Recipe) -> str:
        # KServe's controller labels the workload pods with the service's name
        return f"app.kubernetes.io/name={recipe.name}"


KSERVE = KServe()
