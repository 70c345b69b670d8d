"""The llm-d target: the model-server Deployment behind an InferencePool and the llm-d router's
endpoint picker (llm-d's optimized-baseline well-lit path), applied with the shared Kubernetes verbs.

The objects are built in llmdeploy/targets/llm_d_objects.py; this module owns the recipe's
`target: {type: llm-d}` section and what the path cannot express.
"""

from __future__ import annotations

from types import MappingProxyType

from llmdeploy.errors import Problem
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.recipe.target_llm_d import LlmDTarget
from llmdeploy.targets.base import Rendered
from llmdeploy.targets.kube_backed import KubernetesBackedTarget
from llmdeploy.targets.llm_d_objects import POOL_GROUP, llm_d_files
from llmdeploy.targets.platform_launch import engine_problems, multi_node_problems

KIND = "InferencePool"


def _section(recipe: Recipe) -> LlmDTarget:
    assert isinstance(recipe.target, LlmDTarget), recipe.target.type
    return recipe.target


class LlmD(KubernetesBackedTarget):
    name = "llm-d"
    display_name = "llm-d"
    section: type[Section] = LlmDTarget
    owned_kinds = MappingProxyType({KIND: f"{POOL_GROUP}/v1"})

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        return [
            *engine_problems(
                recipe,
                "llm-d's endpoint picker",
                ("vllm", "sglang", "builtin"),
                "use engine.type: vllm, sglang or builtin (engines whose metrics the endpoint picker reads)",
            ),
            *multi_node_problems(
                recipe,
                "llm-d's optimized-baseline path",
                "use hardware.nodes: 1, or the kubernetes target (a LeaderWorkerSet) for replicas "
                "spanning nodes",
            ),
        ]

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        files, documents = llm_d_files(recipe, _section(recipe), plan)
        return Rendered(files, documents)

    def namespace(self, recipe: Recipe) -> str:
        return _section(recipe).namespace


LLM_D = LlmD()
