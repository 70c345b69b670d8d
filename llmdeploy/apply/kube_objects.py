"""The objects one recipe deploys: which instance they belong to, and each resolved object.

Every object carries `app.kubernetes.io/instance=<recipe name>` and
`app.kubernetes.io/managed-by=llmdeploy`; prune and delete only ever touch objects with both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmdeploy.apply.kube_api import ResourceType

INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "llmdeploy"
WORKLOAD_KINDS = frozenset({"Deployment", "LeaderWorkerSet", "StatefulSet"})


@dataclass(frozen=True)
class Instance:
    """Which deployment of which recipe: the label value and the default namespace."""

    name: str
    namespace: str

    @property
    def selector(self) -> str:
        return f"{INSTANCE_LABEL}={self.name},{MANAGED_BY_LABEL}={MANAGED_BY}"


@dataclass(frozen=True)
class PlannedObject:
    rt: ResourceType
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        ns = self.body["metadata"].get("namespace")
        return str(ns) if ns else None

    @property
    def label(self) -> str:
        return (
            f"{self.rt.kind} {self.namespace}/{self.name}"
            if self.namespace
            else f"{self.rt.kind} {self.name}"
        )


def object_key(rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str, str, str]:
    return (rt.group, rt.kind, namespace or "", name)
