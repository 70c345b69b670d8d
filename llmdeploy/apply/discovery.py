"""Which API versions the cluster serves, and where each kind lives.

Rendered objects name the newest stable version (`autoscaling/v2`, `policy/v1`); older clusters
serve only an earlier version with the same schema (`autoscaling/v2beta2`, `policy/v1beta1`), so a
kind listed in `COMPATIBLE_VERSIONS` falls back to the newest one the cluster serves. A kind whose
API group is absent altogether (LeaderWorkerSet, KEDA without their CRDs) resolves to None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmdeploy.apply.kube_client import KubeClient, ResourceType

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
    """Lazily filled view of the cluster's API: group versions, then each version's resources."""

    client: KubeClient
    _groups: dict[str, list[str]] | None = None  # group -> served versions ("" is the core group)
    _resources: dict[tuple[str, str], dict[str, ResourceType]] = field(default_factory=dict)

    def served_versions(self, group: str) -> list[str]:
        if self._groups is None:
            core = self.client.request("GET", "/api", what="discover core API") or {}
            groups: dict[str, list[str]] = {"": list(core.get("versions") or ["v1"])}
            listing = self.client.request("GET", "/apis", what="discover API groups") or {}
            for g in listing.get("groups") or []:
                groups[g["name"]] = [v["version"] for v in g.get("versions") or []]
            self._groups = groups
        return self._groups.get(group, [])

    def resources(self, group: str, version: str) -> dict[str, ResourceType]:
        """kind -> resource type for one group version (top-level resources, not subresources)."""
        key = (group, version)
        if key not in self._resources:
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            listing = (
                self.client.request(
                    "GET", path, what=f"discover {group or 'core'}/{version}", missing_ok=True
                )
                or {}
            )
            self._resources[key] = {
                r["kind"]: ResourceType(group, version, r["kind"], r["name"], bool(r.get("namespaced")))
                for r in listing.get("resources") or []
                if "/" not in r["name"]
            }
        return self._resources[key]

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
                rt = self.resources(group, v).get(kind)
                if rt is not None:
                    return rt
        return None

    def server_version(self) -> str:
        info = self.client.request("GET", "/version", what="read server version") or {}
        return str(info.get("gitVersion", "unknown"))
