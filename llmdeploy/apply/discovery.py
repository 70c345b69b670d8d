"""Which API versions the cluster serves, and where each kind lives, from the dynamic client's
discovery (`kubernetes.dynamic`, group versions read lazily).

Rendered objects name the newest stable version (`autoscaling/v2`, `policy/v1`); older clusters
serve only an earlier version with the same schema (`autoscaling/v2beta2`, `policy/v1beta1`), so a
kind listed in `COMPATIBLE_VERSIONS` falls back to the newest one the cluster serves. A kind whose
API group is absent altogether (LeaderWorkerSet, KEDA without their CRDs) resolves to None.

Each `Discovery` reads the cluster afresh (the connection's dynamic client is rebuilt on first use),
so a CRD installed or removed a moment ago is seen as it is now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError, ResourceNotUniqueError

from llmdeploy.apply.kube_api import KubeClient, ResourceType

# (group, kind) -> versions with an interchangeable schema, newest first
COMPATIBLE_VERSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("autoscaling", "HorizontalPodAutoscaler"): ("v2", "v2beta2"),
    ("policy", "PodDisruptionBudget"): ("v1", "v1beta1"),
    ("batch", "CronJob"): ("v1", "v1beta1"),
}


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


@dataclass
class Discovery:
    """The cluster's API as its dynamic client discovers it, read on first use."""

    client: KubeClient
    _dynamic: DynamicClient | None = None
    _resolved: dict[tuple[str, str, str], ResourceType | None] = field(default_factory=dict)

    @property
    def dynamic(self) -> DynamicClient:
        if self._dynamic is None:
            self._dynamic = self.client.rediscover()
        return self._dynamic

    def served_versions(self, group: str) -> list[str]:
        """The versions the cluster serves for an API group ("" is the core group)."""
        with self.client.errors("discover API groups"):
            groups: dict[str, Any] = self.dynamic.resources.parse_api_groups(request_resources=False)
        prefix = "api" if group == "" else "apis"
        return sorted((groups.get(prefix) or {}).get(group) or {})

    def _lookup(self, group: str, version: str, kind: str) -> ResourceType | None:
        key = (group, version, kind)
        if key not in self._resolved:
            try:
                with self.client.errors(f"discover {group or 'core'}/{version}"):
                    found = self.dynamic.resources.get(
                        prefix="apis" if group else "api", group=group, api_version=version, kind=kind
                    )
            except (ResourceNotFoundError, ResourceNotUniqueError):
                self._resolved[key] = None
            else:
                self._resolved[key] = ResourceType.of(found)
        return self._resolved[key]

    def resolve(self, api_version: str, kind: str) -> ResourceType | None:
        """The resource to use for an object of this apiVersion and kind, or None if not served."""
        group, version = split_api_version(api_version)
        served = self.served_versions(group)
        candidates = [version]
        for v in COMPATIBLE_VERSIONS.get((group, kind), ()):
            if v not in candidates:
                candidates.append(v)
        for v in candidates:
            if v in served:
                rt = self._lookup(group, v, kind)
                if rt is not None:
                    return rt
        return None

    def server_version(self) -> str:
        info: dict[str, Any] = self.dynamic.version.get("kubernetes") or {}
        return str(info.get("gitVersion", "unknown"))
