"""Waiting for a workload's rollout on its named conditions (Deployment; LeaderWorkerSet by `Available`),
through a watch (`kubernetes.watch`) on the object.

Done means the controller has seen the latest spec (observedGeneration), every replica is updated
and available, and the `Available` condition is True. A `Progressing` condition that turns False
(ProgressDeadlineExceeded) fails at once with the controller's own message; a timeout reports the
conditions as they last stood.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmdeploy.apply.kube_api import KubeClient, ResourceType
from llmdeploy.errors import Problem, UserError


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str

    def render(self) -> str:
        return f"{self.type}={self.status} ({self.reason}): {self.message}"


@dataclass(frozen=True)
class RolloutState:
    done: bool
    failed: bool
    summary: str
    conditions: tuple[Condition, ...]


def conditions_of(obj: dict[str, Any]) -> tuple[Condition, ...]:
    return tuple(
        Condition(
            str(c.get("type", "")),
            str(c.get("status", "")),
            str(c.get("reason", "")),
            str(c.get("message", "")),
        )
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def deployment_state(obj: dict[str, Any]) -> RolloutState:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    want = int(spec.get("replicas", 1))
    updated = int(status.get("updatedReplicas", 0))
    available = int(status.get("availableReplicas", 0))
    total = int(status.get("replicas", 0))
    conds = conditions_of(obj)
    by_type = {c.type: c for c in conds}
    seen = int(status.get("observedGeneration", 0)) >= int(obj["metadata"].get("generation", 0))
    summary = f"{updated}/{want} updated, {available}/{want} available"
    progressing = by_type.get("Progressing")
    if seen and progressing is not None and progressing.status == "False":
        return RolloutState(False, True, summary, conds)
    avail = by_type.get("Available")
    done = (
        seen
        and updated >= want
        and available >= want
        and total <= want
        and (want == 0 or (avail is not None and avail.status == "True"))
    )
    return RolloutState(done, False, summary, conds)


def leader_worker_set_state(obj: dict[str, Any]) -> RolloutState:
    """LeaderWorkerSet: done when its `Available` condition is True and every group is ready."""
    want = int((obj.get("spec") or {}).get("replicas", 1))
    status = obj.get("status") or {}
    ready = int(status.get("readyReplicas", 0))
    conds = conditions_of(obj)
    avail = next((c for c in conds if c.type == "Available"), None)
    done = ready >= want and avail is not None and avail.status == "True"
    return RolloutState(done, False, f"{ready}/{want} groups ready", conds)


# a workload kind's rollout state, read from the live object
StateOf = Callable[[dict[str, Any]], RolloutState]

STATE_OF_KIND: dict[str, StateOf] = {
    "Deployment": deployment_state,
    "LeaderWorkerSet": leader_worker_set_state,
}


def _stop_if_finished(
    rt: ResourceType, namespace: str, name: str, state: RolloutState, timeout_s: float, timed_out: bool
) -> bool:
    """True when done; raises when failed or out of time; False to keep waiting."""
    if state.done:
        return True
    if state.failed or timed_out:
        why = "rollout failed" if state.failed else f"rollout not finished after {timeout_s:.0f} s"
        details = "; ".join(c.render() for c in state.conditions) or "no conditions reported yet"
        raise UserError(
            [
                Problem(
                    f"{rt.kind} {namespace}/{name}: {why} ({state.summary}): {details}",
                    fix="inspect the pods with `llmdeploy status` / `llmdeploy logs`, or raise --timeout",
                )
            ]
        )
    return False


def wait_for_rollout(
    client: KubeClient,
    rt: ResourceType,
    name: str,
    namespace: str,
    timeout_s: float,
    on_progress: Callable[[str], None] | None = None,
    state_of: StateOf | None = None,
) -> RolloutState:
    """Watch a workload (a kind in STATE_OF_KIND, or judged by `state_of`) until its rollout is
    done, failed or out of time.

    The object is read once, then watched from its resourceVersion; each change is judged as it
    arrives. When the API server ends a watch (its timeout, or an expired resourceVersion) the
    object is read again and watched on, until `timeout_s` is spent.
    """
    state_of = state_of or STATE_OF_KIND[rt.kind]
    deadline = time.monotonic() + timeout_s
    last_summary = ""

    def judge(obj: dict[str, Any] | None) -> RolloutState | None:
        """The state when the rollout is done, None while it goes on; raises on failure or timeout."""
        nonlocal last_summary
        if obj is None:
            raise UserError.one(f"{rt.kind} {namespace}/{name} disappeared while waiting for its rollout")
        state = state_of(obj)
        if on_progress and state.summary != last_summary:
            on_progress(f"{rt.kind} {name}: {state.summary}")
            last_summary = state.summary
        timed_out = time.monotonic() >= deadline
        return state if _stop_if_finished(rt, namespace, name, state, timeout_s, timed_out) else None

    while True:
        obj = client.get(rt, name, namespace)
        if (done := judge(obj)) is not None:
            return done
        assert obj is not None
        resource_version = str(obj["metadata"].get("resourceVersion", ""))
        remaining = deadline - time.monotonic()
        for event_type, changed in client.watch(rt, name, namespace, resource_version, remaining):
            if (done := judge(None if event_type == "DELETED" else changed)) is not None:
                return done
