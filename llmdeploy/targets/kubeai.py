"""The kubeai target: one Model (kubeai.org/v1, KubeAI 0.22) running vLLM, applied with the shared
Kubernetes verbs; `smoke` goes through KubeAI's OpenAI-compatible gateway.

The object is built in llmdeploy/targets/kubeai_objects.py; this module owns the recipe's
`target: {type: kubeai}` section and what a KubeAI Model cannot express.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from llmdeploy.apply.rollout import STATE_OF_KIND, RolloutState, conditions_of
from llmdeploy.errors import Problem
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import ApiKeyFromSecret, Probes, Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.recipe.target_kubeai import KubeAITarget
from llmdeploy.render.renderer import parse_documents
from llmdeploy.targets.base import Cluster, Rendered
from llmdeploy.targets.kube_backed import KubernetesBackedTarget
from llmdeploy.targets.kubeai_objects import KUBEAI_PORT, kubeai_files, model_name, resource_profile
from llmdeploy.targets.platform_launch import (
    engine_problems,
    hub_model_problems,
    multi_node_problems,
    port_problems,
)

KIND = "Model"
API_VERSION = "kubeai.org/v1"
# KubeAI's OpenAI-compatible gateway Service (its Helm chart's default) and API prefix
GATEWAY_URL = "http://kubeai.{namespace}.svc/openai"


def _section(recipe: Recipe) -> KubeAITarget:
    assert isinstance(recipe.target, KubeAITarget), recipe.target.type
    return recipe.target


def model_state(obj: dict[str, Any]) -> RolloutState:
    """Up when KubeAI reports as many ready pods as the Model asks for at least."""
    status = (obj.get("status") or {}).get("replicas") or {}
    ready = int(status.get("ready", 0))
    want = max(1, int((obj.get("spec") or {}).get("minReplicas", 1)))
    return RolloutState(
        done=ready >= want,
        failed=False,
        summary=f"{ready}/{want} pods ready",
        conditions=conditions_of(obj),
    )


class KubeAI(KubernetesBackedTarget):
    name = "kubeai"
    display_name = "KubeAI"
    section: type[Section] = KubeAITarget
    readiness = MappingProxyType({**STATE_OF_KIND, KIND: model_state})
    owned_kinds = MappingProxyType({KIND: API_VERSION})

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        target = _section(recipe)
        problems = [
            *engine_problems(
                recipe,
                "KubeAI",
                ("vllm",),
                "use engine.type: vllm (KubeAI's Model runs VLLM, OLlama, FasterWhisper or Infinity; "
                "for SGLang use the kserve or llm-d target)",
            ),
            *port_problems(recipe, "KubeAI", KUBEAI_PORT),
            *hub_model_problems(recipe, "KubeAI", None),
            *multi_node_problems(recipe, "KubeAI", "use hardware.nodes: 1 (KubeAI runs one pod per replica)"),
        ]
        if recipe.hardware.device != "cpu" and resource_profile(recipe, target) is None:
            problems.append(
                Problem(
                    "KubeAI places GPU pods by a resource profile of its install",
                    path="target.resource_profile",
                    fix="name one, e.g. resource_profile: nvidia-gpu-l4 (the GPU count per pod comes "
                    "from parallelism)",
                )
            )
        if target.probes != Probes():
            problems.append(
                Problem(
                    "KubeAI's controller sets the probes of a Model's pods (a fixed start-up budget)",
                    path="target.probes",
                    fix="remove target.probes for the kubeai target",
                )
            )
        for knob, source, fix in (
            (
                "server.api_key",
                recipe.server.api_key,
                "remove server.api_key: KubeAI's gateway fronts the model",
            ),
            (
                "server.hf_token",
                recipe.server.hf_token,
                "remove server.hf_token and set the token in KubeAI's Helm values (secrets.huggingface)",
            ),
        ):
            # a value from this machine's environment is refused by the shared rules already
            if isinstance(source, ApiKeyFromSecret):
                problems.append(
                    Problem(
                        "a KubeAI Model takes plain environment values, not Secret references",
                        path=knob,
                        fix=fix,
                    )
                )
        return problems

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        files = kubeai_files(recipe, _section(recipe), plan)
        return Rendered(files, parse_documents(files))

    def namespace(self, recipe: Recipe) -> str:
        return _section(recipe).namespace

    def pod_selector(self, recipe: Recipe) -> str:
        return f"model={model_name(recipe)}"

    def endpoint_url(self, recipe: Recipe, cluster: Cluster) -> str:
        return GATEWAY_URL.format(namespace=self.namespace(recipe))


KUBEAI = KubeAI()
