"""The Kubernetes verbs end to end: apply, diff, delete, status, logs for one recipe.

Each takes the rendered objects (or just the instance) and a connected client, prints what it does
through `echo`, and returns the exit code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmdeploy.apply.capacity import Capacity
from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_connect import connect
from llmdeploy.apply.kube_errors import KubeApiError
from llmdeploy.apply.kube_objects import WORKLOAD_KINDS
from llmdeploy.apply.kubernetes import (
    INSTANCE_LABEL,
    Instance,
    compute_changes,
    delete_instance,
    execute,
    explain_conflict,
    live_objects,
    prepare,
    wait_for_rollouts,
)
from llmdeploy.apply.rollout import STATE_OF_KIND, StateOf, conditions_of

__all__ = [
    "ApplyOptions",
    "apply_kubernetes",
    "connect",
    "delete_kubernetes",
    "diff_kubernetes",
    "logs_kubernetes",
    "status_kubernetes",
]

Echo = Callable[[str], None]
Confirm = Callable[[str], bool]


@dataclass(frozen=True)
class ApplyOptions:
    dry_run: bool = False
    force_conflicts: bool = False
    prune: bool = True
    wait: bool = True
    timeout_s: float = 600.0


def apply_kubernetes(
    client: KubeClient,
    instance: Instance,
    objects: Sequence[dict[str, Any]],
    capacity: Capacity | None,
    options: ApplyOptions,
    confirm: Confirm,
    echo: Echo,
    readiness: Mapping[str, StateOf] = STATE_OF_KIND,
    extra_kinds: Mapping[str, str] | None = None,
) -> int:
    """`readiness`: the workload kinds apply waits on (a platform target's serving object), each
    with how its live object says it is ready; `extra_kinds` (kind -> apiVersion): kinds beyond
    Kubernetes' own that prune looks for."""
    discovery = Discovery(client)
    workloads = WORKLOAD_KINDS | set(readiness)
    via = f", through the proxy {client.proxy}" if client.proxy else ""
    echo(
        f"cluster {client.context.server} (context {client.context.name}, {discovery.server_version()}{via})"
    )
    planned, skipped = prepare(discovery, objects, instance, capacity, workloads)
    changes = compute_changes(
        client,
        discovery,
        planned,
        skipped,
        instance,
        capacity,
        prune=options.prune,
        workload_kinds=workloads,
        extra_kinds=extra_kinds,
    )
    echo(changes.render())
    if not changes.pending:
        if options.wait and not options.dry_run:
            wait_for_rollouts(client, planned, options.timeout_s, echo, readiness)
        return 0
    if options.dry_run:
        execute(client, changes, dry_run=True, echo=echo)
        echo("dry run (server side): nothing was changed")
        return 0
    if not confirm(f"apply {len(changes.pending)} change(s) to {instance.namespace}?"):
        echo("nothing applied")
        return 1
    try:
        execute(client, changes, force_conflicts=options.force_conflicts, echo=echo)
    except KubeApiError as e:
        raise explain_conflict(e) from e
    if options.wait:
        wait_for_rollouts(client, planned, options.timeout_s, echo, readiness)
    return 0


def diff_kubernetes(
    client: KubeClient,
    instance: Instance,
    objects: Sequence[dict[str, Any]],
    capacity: Capacity | None,
    echo: Echo,
    prune: bool = True,
    readiness: Mapping[str, StateOf] = STATE_OF_KIND,
    extra_kinds: Mapping[str, str] | None = None,
) -> int:
    """Print the changes an apply would make; exit code 1 when there are any (like `diff`)."""
    discovery = Discovery(client)
    workloads = WORKLOAD_KINDS | set(readiness)
    planned, skipped = prepare(discovery, objects, instance, capacity, workloads)
    changes = compute_changes(
        client,
        discovery,
        planned,
        skipped,
        instance,
        capacity,
        prune=prune,
        workload_kinds=workloads,
        extra_kinds=extra_kinds,
    )
    echo(changes.render())
    return 1 if changes.pending else 0


def delete_kubernetes(
    client: KubeClient,
    instance: Instance,
    confirm: Confirm,
    echo: Echo,
    dry_run: bool = False,
    extra_kinds: Mapping[str, str] | None = None,
) -> int:
    discovery = Discovery(client)
    objects = live_objects(client, discovery, instance, extra_kinds)
    if not objects:
        echo(f"nothing to delete: no objects labelled {instance.selector} in {instance.namespace}")
        return 0
    for obj in objects:
        echo(f"- {obj.label}")
    if not dry_run and not confirm(f"delete these {len(objects)} object(s)?"):
        echo("nothing deleted")
        return 1
    delete_instance(client, discovery, instance, dry_run=dry_run, echo=echo, extra_kinds=extra_kinds)
    return 0


def status_kubernetes(
    client: KubeClient,
    instance: Instance,
    echo: Echo,
    readiness: Mapping[str, StateOf] = STATE_OF_KIND,
    extra_kinds: Mapping[str, str] | None = None,
) -> int:
    """One line per object; workloads with replica counts and conditions. Exit 1 if not available."""
    discovery = Discovery(client)
    objects = live_objects(client, discovery, instance, extra_kinds)
    if not objects:
        echo(f"{instance.name}: not deployed in {instance.namespace}")
        return 1
    healthy = True
    for obj in objects:
        if obj.rt.kind in readiness:
            fresh = client.get(obj.rt, obj.name, obj.namespace) or obj.body
            state = readiness[obj.rt.kind](fresh)
            healthy = healthy and state.done
            echo(f"{obj.label}: {state.summary}")
            for cond in conditions_of(fresh):
                echo(f"    {cond.render()}")
        else:
            echo(obj.label)
    return 0 if healthy else 1


def logs_kubernetes(
    client: KubeClient,
    instance: Instance,
    follow: bool,
    lines: int,
    echo: Echo,
    label_selector: str | None = None,
) -> int:
    """The engine pods' logs; `label_selector` finds them (default: the recipe's instance label)."""
    discovery = Discovery(client)
    pods_rt = discovery.resolve("v1", "Pod")
    assert pods_rt is not None, "every cluster serves v1 Pods"
    selector = label_selector or f"{INSTANCE_LABEL}={instance.name}"
    pods = client.list(pods_rt, instance.namespace, label_selector=selector)
    if not pods:
        echo(f"{instance.name}: no pods in {instance.namespace}")
        return 1
    pods.sort(key=lambda p: str(p["metadata"]["name"]))
    targets = pods[:1] if follow else pods
    for pod in targets:
        name = pod["metadata"]["name"]
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        if len(targets) > 1:
            echo(f"==> pod {name} <==")
        for line in client.pod_log_lines(name, instance.namespace, containers[0], lines, follow):
            echo(line)
    return 0
