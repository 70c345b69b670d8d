"""The kubernetes target: plain Kubernetes objects (Deployment or LeaderWorkerSet, Service,
PodDisruptionBudget, ConfigMap, model-cache claim, HPA or KEDA ScaledObject) and a kustomization.

The objects are rendered by llmdeploy/render/kubernetes_manifests.py and applied by the shared
Kubernetes verbs (llmdeploy/targets/kube_backed.py); this module owns the recipe's
`target: {type: kubernetes}` section (`llmdeploy.recipe.target_schema.KubernetesTarget`) and the
rules the objects cannot express.
"""

from __future__ import annotations

from llmdeploy.errors import Problem, UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import KubernetesTarget, Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.render.kubernetes_manifests import render_kubernetes
from llmdeploy.render.kubernetes_objects import scaling_metric
from llmdeploy.render.kubernetes_rules import cluster_needs, pod_problems
from llmdeploy.targets.base import Rendered
from llmdeploy.targets.kube_backed import KubernetesBackedTarget


def _section(recipe: Recipe) -> KubernetesTarget:
    assert isinstance(recipe.target, KubernetesTarget), recipe.target.type
    return recipe.target


class Kubernetes(KubernetesBackedTarget):
    name = "kubernetes"
    display_name = "Kubernetes"
    section: type[Section] = KubernetesTarget

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        problems: list[Problem] = pod_problems(recipe, _section(recipe))
        autoscaling = _section(recipe).autoscaling
        if autoscaling is None:
            return problems
        if recipe.hardware.nodes > 1:
            problems.append(
                Problem(
                    "autoscaling a LeaderWorkerSet is not rendered",
                    path="target.autoscaling",
                    fix="remove target.autoscaling for multi-node replicas (hardware.nodes > 1)",
                )
            )
        if autoscaling.kind == "hpa" and autoscaling.min_replicas < 1:
            problems.append(
                Problem(
                    "a HorizontalPodAutoscaler cannot scale to zero",
                    path="target.autoscaling.min_replicas",
                    value=autoscaling.min_replicas,
                    has_value=True,
                    fix="use min_replicas >= 1, or kind: keda",
                )
            )
        try:
            scaling_metric(recipe, autoscaling.metric)
        except UserError as e:
            problems += e.problems
        return problems

    def notes(self, recipe: Recipe) -> list[str]:
        return cluster_needs(recipe, _section(recipe))

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        files, documents = render_kubernetes(recipe, _section(recipe), plan)
        return Rendered(files, documents)

    def namespace(self, recipe: Recipe) -> str:
        return _section(recipe).namespace


KUBERNETES = Kubernetes()
