"""The llm-d target's objects, after llm-d's "optimized baseline" well-lit path (router 0.9, Gateway
API Inference Extension 1.5): the model-server Deployment, an InferencePool
(inference.networking.k8s.io/v1) selecting its pods, and the llm-d router's endpoint picker (EPP:
Deployment, Service, ServiceAccount, Role, RoleBinding, and its EndpointPickerConfig in a ConfigMap)
with the guide's scoring profile (queue depth, KV cache usage, prefix cache, no-hit LRU).

A Gateway (or the router's standalone proxy) sends traffic to the InferencePool; that part belongs to
the cluster's gateway provider and is not rendered. The EPP scrapes the engine's
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` and `vllm:cache_config_info`, which vLLM and
the built-in engine export.

Without Kubernetes, llm-d's router reads its endpoints from a file (the file-discovery plugin);
`endpoints_file` and `file_discovery_config` render that pair for engines on this machine.
"""

from __future__ import annotations

from typing import Any

import yaml

from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe import recipe_digest
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.target_llm_d import LlmDTarget
from llmdeploy.render.artifacts import header
from llmdeploy.render.block_yaml import to_block_yaml
from llmdeploy.render.capacity_marks import capacity_annotations
from llmdeploy.render.kubernetes_objects import (
    engine_container,
    labels,
    pod_shape,
    pod_spec,
    security_context,
    selector,
)
from llmdeploy.render.model_location import container_model_ref
from llmdeploy.render.templates import render_template
from llmdeploy.targets.platform_launch import as_kubernetes, platform_launch

EXT_PROC_PORT = 9002
GRPC_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
POOL_GROUP = "inference.networking.k8s.io"
EPP_CONFIG_FILE = "config.yaml"
# the pod label the endpoint picker reads to pick an engine's metric names (vLLM's for the built-in engine)
ENGINE_TYPE_LABEL = "llm-d.ai/engine-type"
_SCORERS = (
    ("queue-scorer", 2),
    ("kv-cache-utilization-scorer", 2),
    ("prefix-cache-scorer", 3),
    ("no-hit-lru-scorer", 2),
)


def endpoint_picker_config(discovery_file: str | None = None) -> dict[str, Any]:
    """The EPP's EndpointPickerConfig (llm-d.ai/v1alpha1): the optimized-baseline scorers, and the
    file-discovery plugin reading `discovery_file` when there is no Kubernetes to watch."""
    plugins: list[dict[str, Any]] = []
    if discovery_file is not None:
        plugins.append(
            {
                "name": "file-discovery",
                "type": "file-discovery",
                "parameters": {"path": discovery_file, "watchFile": True},
            }
        )
    plugins += [{"type": name} for name, _ in _SCORERS]
    config: dict[str, Any] = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": name, "weight": weight} for name, weight in _SCORERS],
            }
        ],
    }
    if discovery_file is not None:
        plugins += [
            {"name": "metrics-source", "type": "metrics-data-source"},
            {"name": "metrics-extractor", "type": "core-metrics-extractor"},
        ]
        config["dataLayer"] = {
            "injectDefaults": False,
            "discovery": {"pluginRef": "file-discovery"},
            "sources": [{"pluginRef": "metrics-source", "extractors": [{"pluginRef": "metrics-extractor"}]}],
        }
    return config


def engine_type(recipe: Recipe) -> str:
    return "sglang" if recipe.engine.type == "sglang" else "vllm"


def endpoints_file(recipe: Recipe, address: str, ports: list[int]) -> dict[str, Any]:
    """The file-discovery plugin's endpoints: one per engine process at `address` (a literal IPv4
    address: the plugin resolves no names)."""
    model = recipe.server.served_model_name or recipe.model.id
    return {
        "endpoints": [
            {
                "name": f"{recipe.name}-{i}",
                "address": address,
                "port": str(port),
                "labels": {"model": model, ENGINE_TYPE_LABEL: engine_type(recipe)},
            }
            for i, port in enumerate(ports)
        ]
    }


def router_files(recipe: Recipe, address: str, ports: list[int], config_dir: str) -> dict[str, str]:
    """The llm-d router's no-Kubernetes pair: its endpoints file and the EPP config that reads it."""
    head = header(recipe)
    return {
        "llm-d/endpoints.yaml": render_template(
            "llm_d/endpoints.yaml.j2", header=head, body=endpoints_file(recipe, address, ports)
        ),
        "llm-d/epp-config.yaml": render_template(
            "llm_d/epp-config.yaml.j2",
            header=head,
            body=endpoint_picker_config(f"{config_dir}/endpoints.yaml"),
        ),
    }


def epp_name(recipe: Recipe) -> str:
    return f"{recipe.name}-epp"


def llm_d_objects(
    recipe: Recipe, target: LlmDTarget, plan: MemoryPlan | None
) -> list[tuple[str, str, dict[str, Any]]]:
    """(file, template, object) in apply order."""
    kube = as_kubernetes(
        namespace=target.namespace,
        image=target.image,
        node_selector=target.node_selector,
        tolerations=[t.model_dump(exclude_none=True) for t in target.tolerations],
        probes=target.probes.model_dump(),
        model_cache=target.model_cache.model_dump(),
        labels=target.labels,
        annotations=target.annotations,
    )
    name, ns, meta_labels = recipe.name, target.namespace, labels(recipe, kube)
    epp = epp_name(recipe)
    epp_labels = {**meta_labels, "app.kubernetes.io/name": "llm-d-epp"}
    epp_selector = {"app.kubernetes.io/instance": name, "app.kubernetes.io/name": "llm-d-epp"}

    def meta(
        object_name: str, extra: dict[str, str] | None = None, own: dict[str, str] | None = None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"name": object_name, "namespace": ns, "labels": own or meta_labels}
        annotations = {**target.annotations, **(extra or {})}
        return out | ({"annotations": annotations} if annotations else {})

    launch = platform_launch(recipe, plan, container_model_ref(recipe))
    shape = pod_shape(recipe, kube, plan.weights_gib if plan is not None else 0.0)
    claim = target.model_cache.existing_claim or f"{name}-model-cache"
    objects: list[tuple[str, str, dict[str, Any]]] = []

    def add(
        file: str, template: str, api_version: str, kind: str, metadata: dict[str, Any], **fields: Any
    ) -> None:
        objects.append(
            (file, template, {"apiVersion": api_version, "kind": kind, "metadata": metadata, **fields})
        )

    config = {EPP_CONFIG_FILE: to_block_yaml(endpoint_picker_config()) + "\n"}
    add(
        "epp-configmap.yaml",
        "llm_d/configmap.yaml.j2",
        "v1",
        "ConfigMap",
        meta(epp, own=epp_labels),
        data=config,
    )
    add(
        "epp-serviceaccount.yaml",
        "llm_d/serviceaccount.yaml.j2",
        "v1",
        "ServiceAccount",
        meta(epp, own=epp_labels),
    )
    read = ["get", "watch", "list"]
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
        {
            "apiGroups": ["inference.networking.x-k8s.io"],
            "resources": ["inferenceobjectives", "inferencemodelrewrites"],
            "verbs": read,
        },
    ]
    add(
        "epp-role.yaml",
        "llm_d/role.yaml.j2",
        "rbac.authorization.k8s.io/v1",
        "Role",
        meta(epp, own=epp_labels),
        rules=rules,
    )
    add(
        "epp-rolebinding.yaml",
        "llm_d/rolebinding.yaml.j2",
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        meta(epp, own=epp_labels),
        subjects=[{"kind": "ServiceAccount", "name": epp, "namespace": ns}],
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp},
    )
    if target.model_cache.existing_claim is None:
        pvc_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteMany" if recipe.parallelism.replicas > 1 else "ReadWriteOnce"],
            "resources": {"requests": {"storage": f"{shape.cache_gib}Gi"}},
        }
        if target.model_cache.storage_class:
            pvc_spec["storageClassName"] = target.model_cache.storage_class
        add(
            "persistentvolumeclaim.yaml",
            "kubernetes/persistentvolumeclaim.yaml.j2",
            "v1",
            "PersistentVolumeClaim",
            meta(claim),
            spec=pvc_spec,
        )
    container = engine_container(recipe, kube, launch.command, shape)
    pod_meta = {
        "labels": {**meta_labels, ENGINE_TYPE_LABEL: engine_type(recipe)},
        "annotations": {**target.annotations, "llmdeploy.io/recipe-sha256": recipe_digest(recipe)},
    }
    deployment_spec: dict[str, Any] = {
        "replicas": recipe.parallelism.replicas,
        "selector": {"matchLabels": selector(recipe)},
    }
    if shape.gpus_per_pod:
        # a surge pod would wait for GPUs the old pod holds
        deployment_spec["strategy"] = {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }
    deployment_spec["template"] = {
        "metadata": pod_meta,
        "spec": pod_spec(recipe, kube, shape, [container], claim),
    }
    add(
        "deployment.yaml",
        "kubernetes/deployment.yaml.j2",
        "apps/v1",
        "Deployment",
        meta(name, capacity_annotations(plan)),
        spec=deployment_spec,
    )
    epp_args = [
        "--pool-name", name,
        "--pool-namespace", ns,
        "--pool-group", POOL_GROUP,
        "--config-file", f"/config/{EPP_CONFIG_FILE}",
        "--grpc-health-port", str(GRPC_HEALTH_PORT),
    ]  # fmt: skip
    health = {"tcpSocket": {"port": GRPC_HEALTH_PORT}, "periodSeconds": 10}
    epp_container = {
        "name": "epp",
        "image": target.epp_image,
        "args": epp_args,
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [
            {"name": "grpc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": GRPC_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": health,
        "readinessProbe": health,
        "securityContext": security_context(),
        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config"}],
    }
    epp_spec = {
        "replicas": 1,
        # one active picker: its prefix-cache view is per process
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": epp_selector},
        "template": {
            "metadata": {"labels": epp_labels},
            "spec": {
                "serviceAccountName": epp,
                "containers": [epp_container],
                "volumes": [{"name": "plugins-config", "configMap": {"name": epp}}],
            },
        },
    }
    add(
        "epp-deployment.yaml",
        "kubernetes/deployment.yaml.j2",
        "apps/v1",
        "Deployment",
        meta(epp, own=epp_labels),
        spec=epp_spec,
    )
    add(
        "epp-service.yaml",
        "kubernetes/service.yaml.j2",
        "v1",
        "Service",
        meta(epp, own=epp_labels),
        spec={
            "type": "ClusterIP",
            "selector": epp_selector,
            "ports": [
                {"name": "grpc-ext-proc", "port": EXT_PROC_PORT, "protocol": "TCP", "appProtocol": "http2"},
                {"name": "http-metrics", "port": EPP_METRICS_PORT, "protocol": "TCP"},
            ],
        },
    )
    pool_spec = {
        "targetPorts": [{"number": recipe.server.port}],
        "appProtocol": "http",
        "selector": {"matchLabels": selector(recipe)},
        "endpointPickerRef": {
            "name": epp,
            "port": {"number": EXT_PROC_PORT},
            "failureMode": target.failure_mode,
        },
    }
    add(
        "inferencepool.yaml",
        "llm_d/inferencepool.yaml.j2",
        POOL_GROUP + "/v1",
        "InferencePool",
        meta(name, capacity_annotations(plan)),
        spec=pool_spec,
    )
    return objects


def llm_d_files(
    recipe: Recipe, target: LlmDTarget, plan: MemoryPlan | None
) -> tuple[dict[str, str], tuple[dict[str, Any], ...]]:
    head = header(recipe)
    files: dict[str, str] = {}
    for file, template, obj in llm_d_objects(recipe, target, plan):
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        files[file] = render_template(template, header=head, api_version=obj["apiVersion"], body=body)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    documents = tuple(doc for text in files.values() for doc in yaml.load_all(text, Loader=loader) if doc)
    files["kustomization.yaml"] = render_template(
        "kubernetes/kustomization.yaml.j2", header=head, namespace=target.namespace, resources=list(files)
    )
    return files, documents
