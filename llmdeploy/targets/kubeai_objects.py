"""The KubeAI target's object: one Model (kubeai.org/v1), written for KubeAI 0.22.

KubeAI's controller builds the pods: it runs vLLM with `--model=<the url's model>` and
`--served-model-name=<the Model's name>` on port 8000, and takes node placement and GPU count from
the named resource profile. llmdeploy writes the rest of vLLM's flags (its own mapping,
catalogue-checked) as `spec.args`. The replica count belongs to KubeAI's autoscaler, so the Model
carries `minReplicas` / `maxReplicas` and never `replicas`.
"""

from __future__ import annotations

from typing import Any

from llmdeploy.engines import get_engine
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe import recipe_digest
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.target_kubeai import KubeAITarget
from llmdeploy.render.artifacts import header
from llmdeploy.render.capacity_marks import capacity_annotations
from llmdeploy.render.templates import render_template
from llmdeploy.targets.platform_launch import platform_launch, without_flag

KUBEAI_PORT = 8000
KUBEAI_RELEASE = "0.22"
CPU_PROFILE = "cpu"


def model_name(recipe: Recipe) -> str:
    """KubeAI serves a model under its Model object's name."""
    return recipe.server.served_model_name or recipe.name


def resource_profile(recipe: Recipe, target: KubeAITarget) -> str | None:
    """`<profile>:<count>`: GPUs per pod on a GPU recipe, one unit of the cpu profile on a CPU one."""
    par = recipe.parallelism
    if recipe.hardware.device == "cpu":
        return f"{target.resource_profile or CPU_PROFILE}:1"
    if target.resource_profile is None:
        return None
    return f"{target.resource_profile}:{par.tensor * par.pipeline}"


def kubeai_model(recipe: Recipe, target: KubeAITarget, plan: MemoryPlan | None) -> dict[str, Any]:
    named = recipe.model_copy(
        update={"server": recipe.server.model_copy(update={"served_model_name": model_name(recipe)})}
    )
    launch = platform_launch(named, plan, recipe.model.id)
    spec: dict[str, Any] = {
        "features": ["TextGeneration"],
        "url": f"hf://{recipe.model.id}",
        "engine": "VLLM",
        "image": target.image or get_engine(recipe.engine.type).container_image(recipe),
        "args": without_flag(launch.flags, "--served-model-name"),
    }
    if launch.command.env:
        spec["env"] = dict(launch.command.env)
    profile = resource_profile(recipe, target)
    if profile is not None:
        spec["resourceProfile"] = profile
    if target.cache_profile is not None:
        spec["cacheProfile"] = target.cache_profile
    scaling = target.autoscaling
    if scaling is None:
        replicas = recipe.parallelism.replicas
        spec |= {"minReplicas": replicas, "maxReplicas": max(replicas, 1)}
    else:
        spec |= {
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "targetRequests": scaling.target_requests,
        }
    labels = {
        **target.labels,
        "app.kubernetes.io/managed-by": "llmdeploy",
        "app.kubernetes.io/instance": recipe.name,
    }
    annotations = {
        **target.annotations,
        **capacity_annotations(plan),
        "llmdeploy.io/recipe-sha256": recipe_digest(recipe),
    }
    metadata = {
        "name": model_name(recipe),
        "namespace": target.namespace,
        "labels": labels,
        "annotations": annotations,
    }
    return {"apiVersion": "kubeai.org/v1", "kind": "Model", "metadata": metadata, "spec": spec}


def kubeai_files(recipe: Recipe, target: KubeAITarget, plan: MemoryPlan | None) -> dict[str, str]:
    obj = kubeai_model(recipe, target, plan)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    return {"model.yaml": render_template("kubeai/model.yaml.j2", header=header(recipe), body=body)}
