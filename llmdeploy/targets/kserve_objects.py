"""The KServe target's object: one LLMInferenceService (serving.kserve.io/v1alpha2), written for
KServe 0.20.

KServe's well-known LLMInferenceServiceConfig presets merge under `spec.template` (a strategic merge
of pod specs keyed by container name `main`): llmdeploy sets the `main` container's command to the
engine's own argv (vLLM or SGLang, catalogue-checked), its probes from the plan's start-up budget
and the `dshm` volume's size from the parallelism, and leaves the rest (storage initializer, TLS
certificates, the routing sidecar) to the presets. The storage initializer puts the weights from
`spec.model.uri` at /mnt/models; KServe's workload Service and router reach the engine on port 8000.
"""

from __future__ import annotations

from typing import Any

from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe import recipe_digest
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.target_kserve import KServeTarget
from llmdeploy.render.artifacts import header
from llmdeploy.render.capacity_marks import capacity_annotations
from llmdeploy.render.kubernetes_objects import (
    GPU_PRODUCT_LABELS,
    engine_container,
    labels,
    pod_shape,
)
from llmdeploy.render.templates import render_template
from llmdeploy.targets.platform_launch import as_kubernetes, platform_launch

MODEL_DIR = "/mnt/models"
KSERVE_PORT = 8000
KSERVE_RELEASE = "0.20"


def served_name(recipe: Recipe) -> str:
    """The name clients send: KServe's model name, and the engine's --served-model-name."""
    return recipe.server.served_model_name or recipe.model.id


def model_uri(recipe: Recipe, target: KServeTarget) -> str:
    return target.model_uri or f"hf://{recipe.model.id}"


def with_served_name(recipe: Recipe) -> Recipe:
    """The recipe with its served name spelled out: the engine would otherwise serve /mnt/models."""
    server = recipe.server.model_copy(update={"served_model_name": served_name(recipe)})
    return recipe.model_copy(update={"server": server})


def llm_inference_service(recipe: Recipe, target: KServeTarget, plan: MemoryPlan | None) -> dict[str, Any]:
    named = with_served_name(recipe)
    launch = platform_launch(named, plan, MODEL_DIR)
    kube = as_kubernetes(
        namespace=target.namespace,
        image=target.image,
        node_selector=target.node_selector,
        tolerations=[t.model_dump(exclude_none=True) for t in target.tolerations],
        probes=target.probes.model_dump(),
        labels=target.labels,
    )
    shape = pod_shape(recipe, kube, plan.weights_gib if plan is not None else 0.0)
    container = engine_container(named, kube, launch.command, shape)
    # KServe's presets own the mounts and the security context of `main` (its volumes are theirs)
    container.pop("volumeMounts")
    container.pop("securityContext")
    container["name"] = "main"
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    template: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shape.shm_gib}Gi"}}],
    }
    node_selector = dict(target.node_selector)
    if shape.gpus_per_pod and recipe.hardware.gpu:
        node_selector.setdefault(
            "nvidia.com/gpu.product", GPU_PRODUCT_LABELS.get(recipe.hardware.gpu, recipe.hardware.gpu)
        )
    if node_selector:
        template["nodeSelector"] = node_selector
    tolerations = [t.model_dump(exclude_none=True) for t in target.tolerations]
    gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    if shape.gpus_per_pod and gpu_toleration not in tolerations:
        tolerations.append(gpu_toleration)
    if tolerations:
        template["tolerations"] = tolerations
    parallelism: dict[str, int] = {"tensor": recipe.parallelism.tensor}
    if recipe.parallelism.pipeline > 1:
        parallelism["pipeline"] = recipe.parallelism.pipeline
    spec: dict[str, Any] = {
        "model": {"uri": model_uri(recipe, target), "name": served_name(recipe)},
        "replicas": recipe.parallelism.replicas,
        "parallelism": parallelism,
        "template": template,
    }
    if target.router:
        # empty sections: KServe creates and manages the HTTPRoute, the Gateway reference and the
        # endpoint picker (scheduler) with its InferencePool
        spec["router"] = {"route": {}, "gateway": {}, "scheduler": {}}
    annotations = {
        **target.annotations,
        **capacity_annotations(plan),
        "llmdeploy.io/recipe-sha256": recipe_digest(recipe),
    }
    metadata = {
        "name": recipe.name,
        "namespace": target.namespace,
        "labels": labels(recipe, kube),
        "annotations": annotations,
    }
    return {
        "apiVersion": "serving.kserve.io/v1alpha2",
        "kind": "LLMInferenceService",
        "metadata": metadata,
        "spec": spec,
    }


def kserve_files(recipe: Recipe, target: KServeTarget, plan: MemoryPlan | None) -> dict[str, str]:
    obj = llm_inference_service(recipe, target, plan)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    return {
        "llminferenceservice.yaml": render_template(
            "kserve/llminferenceservice.yaml.j2", header=header(recipe), body=body
        )
    }
