"""Finding this instance's live objects: leftovers to prune after an apply, everything for delete.

Only objects of the prunable kinds that carry both the instance and the managed-by label, and are
not owned by another object, are ever returned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_objects import (
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    Instance,
    PlannedObject,
    object_key,
)
from llmdeploy.apply.ordering import KIND_RANK, PRUNABLE_KINDS, apply_order, delete_order, kind_rank

# Where to look for leftovers of each prunable kind (discovery may pick an older version).
DEFAULT_API_VERSIONS: dict[str, str] = {
    "ServiceAccount": "v1",
    "Secret": "v1",
    "ConfigMap": "v1",
    "PersistentVolumeClaim": "v1",
    "Service": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "PodDisruptionBudget": "policy/v1",
    "HorizontalPodAutoscaler": "autoscaling/v2",
    "ScaledObject": "keda.sh/v1alpha1",
}
assert set(DEFAULT_API_VERSIONS) >= PRUNABLE_KINDS and set(DEFAULT_API_VERSIONS) <= set(KIND_RANK)


def find_leftovers(
    client: KubeClient,
    discovery: Discovery,
    planned: Sequence[PlannedObject],
    instance: Instance,
    extra_kinds: Mapping[str, str] | None = None,
) -> list[PlannedObject]:
    """Live objects labelled with this instance and managed by llmdeploy that are not planned.
    `extra_kinds` (kind -> apiVersion): a platform target's own kinds, looked for as well."""
    versions = {**DEFAULT_API_VERSIONS, **(extra_kinds or {})}
    wanted = {object_key(p.rt, p.namespace, p.name) for p in planned}
    namespaces = {instance.namespace} | {p.namespace for p in planned if p.namespace}
    leftovers: list[PlannedObject] = []
    seen_types: set[tuple[str, str]] = set()
    for kind in sorted(PRUNABLE_KINDS | set(extra_kinds or {}), key=lambda k: (-kind_rank(k), k)):
        rt = discovery.resolve(versions[kind], kind)
        if rt is None or (rt.group, rt.kind) in seen_types:
            continue
        seen_types.add((rt.group, rt.kind))
        for ns in sorted(namespaces) if rt.namespaced else [None]:
            for live in client.list(rt, ns, label_selector=instance.selector):
                meta = live["metadata"]
                labels = meta.get("labels") or {}
                if labels.get(INSTANCE_LABEL) != instance.name or labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
                    continue  # the selector already says so; never trust it alone before deleting
                if meta.get("ownerReferences"):
                    continue  # made by a controller; it goes with its owner
                if object_key(rt, meta.get("namespace"), meta["name"]) not in wanted:
                    leftovers.append(PlannedObject(rt, live))
    return leftovers


def live_objects(
    client: KubeClient,
    discovery: Discovery,
    instance: Instance,
    extra_kinds: Mapping[str, str] | None = None,
) -> list[PlannedObject]:
    """Every live object of this instance, in apply order (Namespaces excluded)."""
    found = find_leftovers(client, discovery, [], instance, extra_kinds)
    ordered = apply_order(o.body for o in found)
    by_id = {id(o.body): o for o in found}
    return [by_id[id(b)] for b in ordered]


def delete_instance(
    client: KubeClient,
    discovery: Discovery,
    instance: Instance,
    *,
    dry_run: bool = False,
    echo: Callable[[str], None] = print,
    extra_kinds: Mapping[str, str] | None = None,
) -> int:
    """Delete every object of this instance in reverse kind order; returns how many."""
    objects = live_objects(client, discovery, instance, extra_kinds)
    bodies = delete_order(o.body for o in objects)
    by_id = {id(o.body): o for o in objects}
    for body in bodies:
        obj = by_id[id(body)]
        client.delete(obj.rt, obj.name, obj.namespace, dry_run=dry_run)
        echo(f"{'would delete' if dry_run else 'deleted'} {obj.label}")
    return len(objects)
