"""What a recipe must hold for its Kubernetes pods to work, beyond the schema: every pod of a
multi-node replica gets its share of GPUs, and the grace period covers the engine's drain.

`render` refuses a recipe that breaks one (and `validate` with it, through `render_problems`).
"""

from __future__ import annotations

from llmdeploy.engines import get_engine
from llmdeploy.errors import Problem
from llmdeploy.recipe.schema import KubernetesTarget, Recipe

# a pod needs a few seconds past the drain: the readiness probe turns away new traffic first
_DRAIN_MARGIN_S = 5


def pod_problems(recipe: Recipe, target: KubernetesTarget) -> list[Problem]:
    return [*_gpus_per_pod(recipe), *_grace_period(recipe, target)]


def _gpus_per_pod(recipe: Recipe) -> list[Problem]:
    nodes = recipe.hardware.nodes
    gpus = recipe.parallelism.tensor * recipe.parallelism.pipeline
    if recipe.hardware.device == "cpu" or nodes == 1 or (gpus >= nodes and gpus % nodes == 0):
        return []
    return [
        Problem(
            f"a replica spans hardware.nodes = {nodes} pods but tensor x pipeline = {gpus} GPUs "
            f"cannot be shared out evenly: {'some pods would request no GPU' if gpus < nodes else 'the pods would differ'}",
            path="hardware.nodes",
            value=nodes,
            has_value=True,
            fix=f"use hardware.nodes: 1, or parallelism with tensor x pipeline a multiple of {nodes} "
            f"(e.g. parallelism.pipeline: {nodes})",
        )
    ]


def _grace_period(recipe: Recipe, target: KubernetesTarget) -> list[Problem]:
    drain_s = get_engine(recipe.engine.type).drain_timeout_s
    if drain_s is None or target.termination_grace_period_s >= drain_s + _DRAIN_MARGIN_S:
        return []
    return [
        Problem(
            f"shorter than the {drain_s} s the engine drains in-flight requests after SIGTERM: "
            "Kubernetes would kill the pod mid-request",
            path="target.termination_grace_period_s",
            value=target.termination_grace_period_s,
            has_value=True,
            fix=f"use at least {drain_s + _DRAIN_MARGIN_S} (the drain plus {_DRAIN_MARGIN_S} s)",
        )
    ]
