"""The Kubernetes target: server-side apply of rendered objects, ordered by kind, with a diff first
(from a server-side dry run), prune of leftovers and a rollout wait.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Literal

from llmdeploy.apply.capacity import CAPACITY_ANNOTATION, Capacity, describe_change
from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_errors import KubeApiError
from llmdeploy.apply.kube_objects import (
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WORKLOAD_KINDS,
    Instance,
    PlannedObject,
)
from llmdeploy.apply.object_diff import FieldChange, diff_objects, drop_settled
from llmdeploy.apply.ordering import KIND_RANK, apply_order
from llmdeploy.apply.prune import delete_instance, find_leftovers, live_objects
from llmdeploy.apply.rollout import STATE_OF_KIND, StateOf, wait_for_rollout
from llmdeploy.errors import Problem, UserError

__all__ = [
    "INSTANCE_LABEL",
    "ChangeSet",
    "Instance",
    "ObjectChange",
    "PlannedObject",
    "compute_changes",
    "delete_instance",
    "execute",
    "explain_conflict",
    "live_objects",
    "prepare",
    "wait_for_rollouts",
]

Action = Literal["create", "update", "unchanged", "prune"]


@dataclass(frozen=True)
class ObjectChange:
    action: Action
    obj: PlannedObject
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True)
class ChangeSet:
    changes: tuple[ObjectChange, ...]
    skipped: tuple[str, ...]  # kinds the cluster does not serve, with the reason
    capacity_before: Capacity | None
    capacity_after: Capacity | None

    @property
    def pending(self) -> tuple[ObjectChange, ...]:
        return tuple(c for c in self.changes if c.action != "unchanged")

    def render(self, verbose_unchanged: bool = False) -> str:
        symbol = {"create": "+", "update": "~", "unchanged": "=", "prune": "-"}
        lines: list[str] = []
        for c in self.changes:
            if c.action == "unchanged" and not verbose_unchanged:
                continue
            lines.append(f"{symbol[c.action]} {c.obj.label} ({c.action})")
            lines.extend("    " + f.render().replace("\n", "\n    ") for f in c.fields)
        unchanged = sum(1 for c in self.changes if c.action == "unchanged")
        if not self.pending:
            lines.append(f"no changes ({unchanged} object(s) up to date)")
        elif unchanged:
            lines.append(f"({unchanged} object(s) unchanged)")
        lines.extend(f"skipped: {s}" for s in self.skipped)
        if self.capacity_after is not None:
            lines.append(describe_change(self.capacity_before, self.capacity_after))
        return "\n".join(lines)


def prepare(
    discovery: Discovery,
    objects: Sequence[dict[str, Any]],
    instance: Instance,
    capacity: Capacity | None,
    workload_kinds: Set[str] = WORKLOAD_KINDS,
) -> tuple[list[PlannedObject], list[str]]:
    """Resolve each rendered object against discovery, add our labels, namespace and capacity note.

    An add-on kind the cluster lacks (KEDA's ScaledObject) is skipped with a message; a missing
    workload kind (LeaderWorkerSet, a platform's serving object) is an error, since nothing would
    serve without it.
    """
    planned: list[PlannedObject] = []
    skipped: list[str] = []
    missing_workloads: list[Problem] = []
    for original in apply_order(objects):
        body = copy.deepcopy(original)
        kind, api_version = str(body.get("kind")), str(body.get("apiVersion"))
        rt = discovery.resolve(api_version, kind)
        if rt is None and kind in workload_kinds:
            missing_workloads.append(
                Problem(
                    f"the cluster does not serve {kind} ({api_version}), which this recipe's workload needs",
                    fix=f"install the {kind} CRDs and controller in the cluster first",
                )
            )
            continue
        if rt is None:
            skipped.append(
                f"{kind} {body['metadata'].get('name')}: the cluster does not serve {api_version} "
                f"(install its CRDs / controller to use it)"
            )
            continue
        body["apiVersion"] = rt.api_version
        meta = body.setdefault("metadata", {})
        if rt.namespaced:
            meta.setdefault("namespace", instance.namespace)
        labels = meta.setdefault("labels", {})
        labels.setdefault(INSTANCE_LABEL, instance.name)
        labels.setdefault(MANAGED_BY_LABEL, MANAGED_BY)
        if capacity is not None and kind in workload_kinds:
            meta.setdefault("annotations", {})[CAPACITY_ANNOTATION] = capacity.to_annotation()
        planned.append(PlannedObject(rt, body))
    if missing_workloads:
        raise UserError(missing_workloads)
    return planned, skipped


def _live_capacity(
    lives: Sequence[tuple[PlannedObject, dict[str, Any] | None]], workload_kinds: Set[str]
) -> Capacity | None:
    for obj, live in lives:
        if live is not None and obj.rt.kind in workload_kinds:
            annotations = live["metadata"].get("annotations") or {}
            return Capacity.from_annotation(annotations.get(CAPACITY_ANNOTATION))
    return None


def compute_changes(
    client: KubeClient,
    discovery: Discovery,
    planned: Sequence[PlannedObject],
    skipped: Sequence[str],
    instance: Instance,
    capacity: Capacity | None,
    prune: bool = True,
    workload_kinds: Set[str] = WORKLOAD_KINDS,
    extra_kinds: Mapping[str, str] | None = None,
) -> ChangeSet:
    """What an apply would do, object by object, from a server-side dry run against the live state."""
    changes: list[ObjectChange] = []
    lives: list[tuple[PlannedObject, dict[str, Any] | None]] = []
    new_namespaces: set[str] = set()
    for obj in planned:
        live = client.get(obj.rt, obj.name, obj.namespace)
        lives.append((obj, live))
        if live is None:
            if obj.rt.kind == "Namespace":
                new_namespaces.add(obj.name)
            elif obj.namespace not in new_namespaces:
                client.apply(obj.rt, obj.body, dry_run=True)  # let the server validate it now
            changes.append(ObjectChange("create", obj))
            continue
        after = client.apply(obj.rt, obj.body, dry_run=True, force=True)
        fields = tuple(drop_settled(diff_objects(live, after), obj.body, live))
        changes.append(ObjectChange("update" if fields else "unchanged", obj, fields))
    if prune:
        changes.extend(
            ObjectChange("prune", o)
            for o in find_leftovers(client, discovery, planned, instance, extra_kinds)
        )
    return ChangeSet(tuple(changes), tuple(skipped), _live_capacity(lives, workload_kinds), capacity)


def execute(
    client: KubeClient,
    changes: ChangeSet,
    *,
    force_conflicts: bool = False,
    dry_run: bool = False,
    echo: Callable[[str], None] = print,
) -> None:
    """Apply creates and updates in kind order, then delete pruned objects in reverse kind order."""
    new_namespaces = {
        c.obj.name for c in changes.pending if c.action == "create" and c.obj.rt.kind == "Namespace"
    }
    for c in changes.pending:
        if c.action in ("create", "update"):
            if dry_run and c.obj.namespace in new_namespaces:
                echo(f"would apply {c.obj.label} (in a namespace this apply creates)")
                continue  # the server cannot dry-run into a namespace that does not exist yet
            client.apply(c.obj.rt, c.obj.body, dry_run=dry_run, force=force_conflicts)
            echo(f"{'checked' if dry_run else 'applied'} {c.obj.label}")
    pruned = [c.obj for c in changes.pending if c.action == "prune"]
    for obj in sorted(pruned, key=lambda o: -KIND_RANK.get(o.rt.kind, 0)):
        client.delete(obj.rt, obj.name, obj.namespace, dry_run=dry_run)
        echo(f"{'would prune' if dry_run else 'pruned'} {obj.label}")


def wait_for_rollouts(
    client: KubeClient,
    planned: Sequence[PlannedObject],
    timeout_s: float,
    echo: Callable[[str], None] = print,
    readiness: Mapping[str, StateOf] = STATE_OF_KIND,
) -> None:
    for obj in planned:
        if obj.rt.kind in readiness:
            wait_for_rollout(
                client,
                obj.rt,
                obj.name,
                obj.namespace or "default",
                timeout_s,
                on_progress=echo,
                state_of=readiness[obj.rt.kind],
            )
            echo(f"{obj.rt.kind} {obj.name} is Available")


def explain_conflict(error: KubeApiError) -> UserError:
    """Apply conflicts name the other field manager already; add what to do about it."""
    if error.status_code != 409:
        return error
    return UserError(
        [
            *error.problems,
            Problem(
                "another tool (the field manager named above) changed fields llmdeploy sets",
                fix="re-run with --force-conflicts to take ownership, or change the recipe to match",
            ),
        ]
    )
