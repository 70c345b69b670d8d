"""The production-stack target: values.yaml for vLLM production-stack's vllm-stack Helm chart 0.1.12.

Helm installs the chart; llmdeploy renders its values (llmdeploy/targets/production_stack_values.py)
and checks the recipe first, so `apply` and the other verbs say which helm command to run instead.
"""

from __future__ import annotations

from llmdeploy.errors import Problem, UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.recipe.target_production_stack import CHART_VERSION, ProductionStackTarget
from llmdeploy.smoke.runner import url_from_recipe
from llmdeploy.targets.base import (
    ApplyRequest,
    ApplyResult,
    Cluster,
    Console,
    Rendered,
    SecretSource,
    no_diff,
)
from llmdeploy.targets.platform_launch import engine_problems, hub_model_problems, multi_node_problems
from llmdeploy.targets.production_stack_values import production_stack_files


def _section(recipe: Recipe) -> ProductionStackTarget:
    assert isinstance(recipe.target, ProductionStackTarget), recipe.target.type
    return recipe.target


def _helm(recipe: Recipe, verb: str) -> UserError:
    ns = _section(recipe).namespace
    commands = {
        "apply": f"llmdeploy render RECIPE -o DIR, then helm upgrade --install {recipe.name} vllm/vllm-stack "
        f"--version {CHART_VERSION} -n {ns} -f DIR/values.yaml",
        "status": f"helm status {recipe.name} -n {ns}",
        "logs": f"kubectl -n {ns} logs -l model={recipe.name}",
        "down": f"helm uninstall {recipe.name} -n {ns}",
    }
    return UserError.one(
        f"the production-stack target renders Helm values; Helm runs the chart ({verb} is Helm's)",
        path="target.type",
        value="production-stack",
        fix=commands[verb],
    )


class ProductionStack:
    name = "production-stack"
    display_name = "vLLM production-stack"
    section: type[Section] = ProductionStackTarget
    in_container = True
    secrets_from: SecretSource = "secret"
    kubernetes_backed = False

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        return [
            *engine_problems(
                recipe,
                "production-stack's vllm-stack chart",
                ("vllm",),
                "use engine.type: vllm (the chart starts `vllm serve`; for SGLang use the kserve or llm-d target)",
            ),
            *hub_model_problems(recipe, "production-stack", None),
            *multi_node_problems(
                recipe,
                "production-stack's vllm-stack chart",
                "use hardware.nodes: 1, or the kubernetes target (a LeaderWorkerSet) for replicas "
                "spanning nodes",
            ),
        ]

    def notes(self, recipe: Recipe) -> list[str]:
        return []

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        return Rendered(production_stack_files(recipe, _section(recipe), plan))

    def apply(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> ApplyResult:
        if request.dry_run:
            raise UserError.one(
                "--dry-run is for Kubernetes-backed targets",
                path="target.type",
                value=self.name,
                fix=f"see the Helm values with `llmdeploy render {request.recipe_path} -o DIR`",
            )
        raise _helm(recipe, "apply")

    def diff(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> int:
        # Helm owns the release; `helm diff upgrade` with the rendered values compares it
        raise no_diff(self.name, request)

    def status(self, recipe: Recipe, cluster: Cluster, console: Console) -> int:
        raise _helm(recipe, "status")

    def logs(self, recipe: Recipe, cluster: Cluster, follow: bool, lines: int, console: Console) -> int:
        raise _helm(recipe, "logs")

    def down(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        raise _helm(recipe, "down")

    def delete(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        raise _helm(recipe, "down")

    def endpoint_url(self, recipe: Recipe, cluster: Cluster) -> str:
        return url_from_recipe(recipe)

    def startup_log(self, recipe: Recipe) -> str | None:
        return None


PRODUCTION_STACK = ProductionStack()
