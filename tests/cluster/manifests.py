"""Hand-written objects shaped like the renderer's output, for testing apply on its own."""

from __future__ import annotations

from typing import Any

INSTANCE = "demo"


def labels(instance: str = INSTANCE) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "llmdeploy",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/managed-by": "llmdeploy",
    }


def config_map(
    instance: str = INSTANCE, name: str | None = None, data: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name or f"{instance}-config", "labels": labels(instance)},
        "data": data or {"recipe.yaml": "name: demo\n"},
    }


def service(instance: str = INSTANCE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": instance, "labels": labels(instance)},
        "spec": {
            "selector": {"app.kubernetes.io/instance": instance},
            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def deployment(
    instance: str = INSTANCE, replicas: int = 1, max_num_seqs: int = 64, gpus: int = 1
) -> dict[str, Any]:
    pod_labels = {"app.kubernetes.io/instance": instance, "app.kubernetes.io/name": "llmdeploy"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": instance, "labels": labels(instance)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": pod_labels},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "args": [
                                "--model",
                                "HuggingFaceTB/SmolLM2-135M-Instruct",
                                "--max-num-seqs",
                                str(max_num_seqs),
                            ],
                            "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                            "resources": {
                                "limits": {"nvidia.com/gpu": str(gpus)},
                                "requests": {"nvidia.com/gpu": str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }


def pdb(instance: str = INSTANCE) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": instance, "labels": labels(instance)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/instance": instance}}},
    }


def hpa(instance: str = INSTANCE) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": instance, "labels": labels(instance)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": instance},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "vllm:num_requests_waiting"},
                        "target": {"type": "AverageValue", "averageValue": "4"},
                    },
                }
            ],
        },
    }


def leader_worker_set(instance: str = INSTANCE) -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": instance, "labels": labels(instance)},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2}},
    }


def full_set(instance: str = INSTANCE, max_num_seqs: int = 64) -> list[dict[str, Any]]:
    """In the renderer's apply order."""
    return [
        config_map(instance),
        service(instance),
        deployment(instance, max_num_seqs=max_num_seqs),
        pdb(instance),
        hpa(instance),
    ]


def scaled_object(instance: str = INSTANCE) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": instance, "labels": labels(instance)},
        "spec": {
            "scaleTargetRef": {"name": instance},
            "minReplicaCount": 1,
            "maxReplicaCount": 3,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": "http://prometheus:9090",
                        "threshold": "4",
                        "query": "sum(vllm:num_requests_waiting)",
                    },
                }
            ],
        },
    }
