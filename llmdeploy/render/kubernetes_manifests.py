"""Kubernetes manifests for a recipe: one template per kind, listed in apply order plus a kustomization.

The pod template holds only what the pod runs: a change to a field the pods never see (`bench:`,
`smoke:`, a description) leaves it byte for byte, so applying it restarts no GPU pod. Each file's
header comment still names the whole recipe's digest. No ConfigMap copy of the resolved recipe is
rendered: nothing in the pod or the cluster read it, and `llmdeploy render` / `plan` show the
same from the recipe in version control (an earlier render's copy is pruned by the next apply).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from llmdeploy.errors import UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe import Recipe
from llmdeploy.recipe.schema import KubernetesTarget
from llmdeploy.render.artifacts import header
from llmdeploy.render.capacity_marks import capacity_annotations
from llmdeploy.render.engine_command import engine_command
from llmdeploy.render.kubernetes_objects import (
    PROMETHEUS_ADDRESS,
    engine_container,
    labels,
    leader_worker_argv,
    pod_shape,
    pod_spec,
    quantity,
    scaling_metric,
    selector,
)
from llmdeploy.render.kubernetes_patches import apply_patches
from llmdeploy.render.kubernetes_rules import model_cache_shared, network_policy_spec
from llmdeploy.render.model_location import container_model_ref
from llmdeploy.render.templates import render_template

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _version(target: KubernetesTarget) -> tuple[int, int]:
    match = re.match(r"^v?(\d+)\.(\d+)", target.kubernetes_version)
    if not match:
        raise UserError.one(
            "not a Kubernetes version",
            path="target.kubernetes_version",
            value=target.kubernetes_version,
            fix="write MAJOR.MINOR, e.g. '1.30'",
        )
    return int(match.group(1)), int(match.group(2))


def render_kubernetes(
    recipe: Recipe, target: KubernetesTarget, plan: MemoryPlan | None
) -> tuple[dict[str, str], tuple[dict[str, Any], ...]]:
    if not _DNS_LABEL.match(target.namespace):
        raise UserError.one(
            "not a Kubernetes namespace name",
            path="target.namespace",
            value=target.namespace,
            fix="lower-case letters, digits and '-', at most 63 characters",
        )
    version = _version(target)
    name, meta_labels = recipe.name, labels(recipe, target)
    command = engine_command(recipe, plan, model_ref=container_model_ref(recipe), host="0.0.0.0")
    shape = pod_shape(
        recipe,
        target,
        plan.weights_gib if plan is not None else 0.0,
        plan.kv_cache_gib if plan is not None else 0.0,
    )
    head = header(recipe)
    claim = target.model_cache.existing_claim or f"{name}-model-cache"
    multi_node = recipe.hardware.nodes > 1
    autoscaling = target.autoscaling
    if autoscaling is not None and multi_node:
        raise UserError.one(
            "autoscaling a LeaderWorkerSet is not rendered",
            path="target.autoscaling",
            value=autoscaling.kind,
            fix="remove target.autoscaling for multi-node replicas",
        )

    def meta(object_name: str) -> dict[str, Any]:
        out = {"name": object_name, "namespace": target.namespace, "labels": meta_labels}
        return out | ({"annotations": dict(target.annotations)} if target.annotations else {})

    # file name -> the object; each file's template places its object's fields below apiVersion and kind
    objects: dict[str, dict[str, Any]] = {}

    def workload_meta() -> dict[str, Any]:
        # the plan's capacity on the workload, for whoever reviews the rendered objects
        out = meta(name)
        marks = capacity_annotations(plan)
        return out | ({"annotations": {**out.get("annotations", {}), **marks}} if marks else {})

    def add(file: str, api_version: str, kind: str, metadata: dict[str, Any], **fields: Any) -> None:
        objects[file] = {"apiVersion": api_version, "kind": kind, "metadata": metadata, **fields}

    if target.model_cache.existing_claim is None:
        shared = model_cache_shared(recipe, target)
        pvc_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
            "resources": {"requests": {"storage": f"{shape.cache_gib}Gi"}},
        }
        if target.model_cache.storage_class:
            pvc_spec["storageClassName"] = target.model_cache.storage_class
        add("persistentvolumeclaim.yaml", "v1", "PersistentVolumeClaim", meta(claim), spec=pvc_spec)

    pod_labels = {**target.pod_labels, **meta_labels}
    pod_annotations = {**target.annotations, **target.pod_annotations}
    pod_meta: dict[str, Any] = {"labels": pod_labels}
    if pod_annotations:
        pod_meta["annotations"] = pod_annotations
    service_selector = selector(recipe)
    if multi_node:
        leader_argv, worker_argv = leader_worker_argv(command.argv)
        leader = engine_container(recipe, target, command, shape, argv=leader_argv)
        worker = engine_container(recipe, target, command, shape, argv=worker_argv)
        for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
            worker.pop(key)
        lws_spec = {
            "replicas": recipe.parallelism.replicas,
            "leaderWorkerTemplate": {
                "size": recipe.hardware.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": pod_meta,
                    "spec": pod_spec(recipe, target, shape, [leader], claim),
                },
                "workerTemplate": {
                    "metadata": pod_meta,
                    "spec": pod_spec(recipe, target, shape, [worker], claim),
                },
            },
        }
        add(
            "leaderworkerset.yaml",
            "leaderworkerset.x-k8s.io/v1",
            "LeaderWorkerSet",
            workload_meta(),
            spec=lws_spec,
        )
        service_selector = {**service_selector, LWS_WORKER_INDEX: "0"}
    else:
        container = engine_container(recipe, target, command, shape)
        deployment_spec: dict[str, Any] = {}
        if autoscaling is None:
            deployment_spec["replicas"] = recipe.parallelism.replicas
        deployment_spec["selector"] = {"matchLabels": selector(recipe)}
        if shape.gpus_per_pod:
            # a surge pod would wait for GPUs the old pod holds
            deployment_spec["strategy"] = {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            }
        deployment_spec["template"] = {
            "metadata": pod_meta,
            "spec": pod_spec(recipe, target, shape, [container], claim),
        }
        add("deployment.yaml", "apps/v1", "Deployment", workload_meta(), spec=deployment_spec)

    service_spec = {
        "type": target.service_type,
        "selector": service_selector,
        "ports": [{"name": "http", "port": recipe.server.port, "targetPort": "http", "protocol": "TCP"}],
    }
    add("service.yaml", "v1", "Service", meta(name), spec=service_spec)
    if target.network_policy is not None:
        policy_spec = network_policy_spec(recipe, target.network_policy)
        add("networkpolicy.yaml", "networking.k8s.io/v1", "NetworkPolicy", meta(name), spec=policy_spec)
    add(
        "poddisruptionbudget.yaml",
        "policy/v1" if version >= (1, 21) else "policy/v1beta1",
        "PodDisruptionBudget",
        meta(name),
        spec={"maxUnavailable": 1, "selector": {"matchLabels": service_selector}},
    )
    if autoscaling is not None:
        metric = scaling_metric(recipe, autoscaling.metric)
        target_ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        if autoscaling.kind == "hpa":
            if autoscaling.min_replicas < 1:
                raise UserError.one(
                    "a HorizontalPodAutoscaler cannot scale to zero",
                    path="target.autoscaling",
                    value=autoscaling.min_replicas,
                    fix="use min_replicas >= 1, or kind: keda",
                )
            hpa_spec = {
                "scaleTargetRef": target_ref,
                "minReplicas": autoscaling.min_replicas,
                "maxReplicas": autoscaling.max_replicas,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            # custom-metrics adapters expose Prometheus names with ':' turned into '_'
                            "metric": {"name": metric.replace(":", "_")},
                            "target": {"type": "AverageValue", "averageValue": quantity(autoscaling.target)},
                        },
                    }
                ],
            }
            add(
                "horizontalpodautoscaler.yaml",
                "autoscaling/v2" if version >= (1, 23) else "autoscaling/v2beta2",
                "HorizontalPodAutoscaler",
                meta(name),
                spec=hpa_spec,
            )
        else:
            scope = f'{{namespace="{target.namespace}",pod=~"{name}-.*"}}'
            query = (
                f"sum({metric}{scope})" if autoscaling.metric == "queue_depth" else f"avg({metric}{scope})"
            )
            trigger = {
                "type": "prometheus",
                "metricType": "AverageValue" if autoscaling.metric == "queue_depth" else "Value",
                "metadata": {
                    "serverAddress": PROMETHEUS_ADDRESS,
                    "query": query,
                    "threshold": str(autoscaling.target),
                },
            }
            keda_spec = {
                "scaleTargetRef": {"name": name},
                "minReplicaCount": autoscaling.min_replicas,
                "maxReplicaCount": autoscaling.max_replicas,
                "triggers": [trigger],
            }
            add("scaledobject.yaml", "keda.sh/v1alpha1", "ScaledObject", meta(name), spec=keda_spec)
    patched = apply_patches(list(objects.values()), target.patches)
    files: dict[str, str] = {}
    for file, obj in zip(objects, patched, strict=True):
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        files[file] = render_template(
            f"kubernetes/{file}.j2", header=head, api_version=obj["apiVersion"], body=body
        )
    # our own output, read back as the API server will: libyaml's loader where PyYAML has it (10x faster)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    documents = tuple(doc for text in files.values() for doc in yaml.load_all(text, Loader=loader) if doc)
    files["kustomization.yaml"] = render_template(
        "kubernetes/kustomization.yaml.j2", header=head, namespace=target.namespace, resources=list(files)
    )
    return files, documents
