"""The order objects are applied in: what others depend on first (namespace, identity, config,
storage, network), then workloads, then what watches workloads (disruption budgets, autoscalers).
Deletion runs the same table backwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

KIND_RANK: dict[str, int] = {
    "Namespace": 0,
    "CustomResourceDefinition": 1,
    "ServiceAccount": 2,
    "Role": 3,
    "RoleBinding": 4,
    "Secret": 5,
    "ConfigMap": 6,
    "PersistentVolumeClaim": 7,
    "Service": 8,
    "NetworkPolicy": 8,
    "Deployment": 9,
    "StatefulSet": 9,
    "LeaderWorkerSet": 10,
    "PodDisruptionBudget": 11,
    "HorizontalPodAutoscaler": 12,
    "ScaledObject": 12,
}
UNKNOWN_RANK = 50  # kinds outside the table go after the known ones, in their given order

# Kinds whose leftovers apply prunes; never Namespace (it would take unrelated objects with it).
PRUNABLE_KINDS: frozenset[str] = frozenset(KIND_RANK) - {"Namespace", "CustomResourceDefinition"}


def kind_rank(kind: str) -> int:
    return KIND_RANK.get(kind, UNKNOWN_RANK)


def apply_order(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stable sort by kind rank: objects of one kind keep the renderer's order."""
    return sorted(objects, key=lambda o: kind_rank(str(o.get("kind"))))


def delete_order(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(objects, key=lambda o: -kind_rank(str(o.get("kind"))))
