"""The production-stack target's file: values.yaml for vLLM production-stack's `vllm-stack` Helm
chart 0.1.12, one `servingEngineSpec.modelSpec[]` entry per recipe.

The chart starts `vllm serve <modelURL> --host 0.0.0.0 --port <containerPort>`; llmdeploy passes the
rest of vLLM's flags (its own mapping, catalogue-checked) as `vllmConfig.extraArgs` and leaves the
chart's typed vLLM fields unset, so no flag is given twice. The start-up probe budget and the
/dev/shm size come from the plan; Secrets are referenced, never written.
"""

from __future__ import annotations

import math
from typing import Any

from llmdeploy.engines import get_engine
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import ApiKeyFromSecret, Recipe
from llmdeploy.recipe.target_production_stack import CHART_VERSION, ProductionStackTarget
from llmdeploy.render.artifacts import header
from llmdeploy.render.capacity_marks import capacity_annotations
from llmdeploy.render.kubernetes_objects import GPU_PRODUCT_LABELS, pod_shape
from llmdeploy.render.templates import render_template
from llmdeploy.targets.platform_launch import as_kubernetes, platform_launch


def _secret_ref(source: object) -> dict[str, str] | None:
    if isinstance(source, ApiKeyFromSecret):
        return {"secretName": source.secret.name, "secretKey": source.secret.key}
    return None


def chart_values(recipe: Recipe, target: ProductionStackTarget, plan: MemoryPlan | None) -> dict[str, Any]:
    launch = platform_launch(recipe, plan, recipe.model.id)
    kube = as_kubernetes(
        probes=target.probes.model_dump(),
        model_cache={"size_gib": target.pvc_storage_gib} if target.pvc_storage_gib else {},
    )
    shape = pod_shape(recipe, kube, plan.weights_gib if plan is not None else 0.0)
    image = target.image or get_engine(recipe.engine.type).container_image(recipe)
    repository, _, tag = image.rpartition(":")
    spec: dict[str, Any] = {
        "name": recipe.name,
        "repository": repository,
        "tag": tag,
        "modelURL": recipe.model.id,
        "replicaCount": recipe.parallelism.replicas,
        "requestGPU": shape.gpus_per_pod,
        "vllmConfig": {"extraArgs": launch.flags},
        "shmSize": f"{shape.shm_gib}Gi",
        "pvcStorage": f"{shape.cache_gib}Gi",
    }
    if target.storage_class:
        spec["storageClass"] = target.storage_class
    env = [{"name": k, "value": v} for k, v in launch.command.env.items()]
    if env:
        spec["env"] = env
    hf_token = _secret_ref(recipe.server.hf_token)
    if hf_token is not None:
        spec["hf_token"] = hf_token
    annotations = {**target.annotations, **capacity_annotations(plan)}
    if annotations:
        spec["annotations"] = annotations
    if target.labels:
        spec["labels"] = dict(target.labels)
    node_selector = dict(target.node_selector)
    if shape.gpus_per_pod and recipe.hardware.gpu:
        node_selector.setdefault(
            "nvidia.com/gpu.product", GPU_PRODUCT_LABELS.get(recipe.hardware.gpu, recipe.hardware.gpu)
        )
    if node_selector:
        spec["nodeSelectorTerms"] = [
            {
                "matchExpressions": [
                    {"key": key, "operator": "In", "values": [value]} for key, value in node_selector.items()
                ]
            }
        ]
    if target.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in target.tolerations]
    period = target.probes.period_s
    engine: dict[str, Any] = {
        "containerPort": recipe.server.port,
        "startupProbe": {
            "initialDelaySeconds": 0,
            "periodSeconds": period,
            "failureThreshold": math.ceil(shape.startup_budget_s / period),
            "httpGet": {"path": "/health", "port": recipe.server.port},
        },
    }
    api_key = _secret_ref(recipe.server.api_key)
    if api_key is not None:
        engine["vllmApiKey"] = api_key
    engine["modelSpec"] = [spec]
    return {"servingEngineSpec": engine}


def production_stack_files(
    recipe: Recipe, target: ProductionStackTarget, plan: MemoryPlan | None
) -> dict[str, str]:
    return {
        "values.yaml": render_template(
            "production_stack/values.yaml.j2",
            header=header(recipe),
            chart_version=CHART_VERSION,
            release=recipe.name,
            namespace=target.namespace,
            values=chart_values(recipe, target, plan),
        )
    }
