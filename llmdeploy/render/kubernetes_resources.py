"""The engine container's `resources`: GPUs from the parallelism, and CPU and memory requests sized
from the plan by default, so the kubelet neither packs the pod onto a node without the host memory
its weights pass through nor evicts it first under pressure (a pod without requests is the first to
go). `target.resources` overrides any of them, key by key.
"""

from __future__ import annotations

from typing import Any

from llmdeploy.recipe.kubernetes_pod import GPU_RESOURCE
from llmdeploy.recipe.kubernetes_values import quantity_value
from llmdeploy.recipe.schema import KubernetesTarget


def container_resources(
    target: KubernetesTarget, gpus: int, cpu_request: int, memory_request_gib: int | None
) -> dict[str, Any]:
    """The engine container's requests and limits: GPUs from the parallelism, CPU and memory
    requests from the plan unless `target.resources` names its own."""
    # a pod without requests is the first the kubelet evicts under memory pressure
    defaults = {"cpu": str(cpu_request)}
    if memory_request_gib is not None:
        defaults["memory"] = f"{memory_request_gib}Gi"
    requests = defaults | {k: str(v) for k, v in target.resources.requests.items()}
    limits = {k: str(v) for k, v in target.resources.limits.items()}
    for name, limit in limits.items():
        # a default request above the recipe's own limit would be refused by the API server
        own = name in target.resources.requests
        if name in defaults and not own and quantity_value(requests[name]) > quantity_value(limit):
            requests[name] = limit
    if gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
