"""Unit tests of the Kubernetes apply pieces that need no cluster."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from llmdeploy.apply.capacity import Capacity, describe_change
from llmdeploy.apply.kube_api import ResourceType
from llmdeploy.apply.kube_connect import connect
from llmdeploy.apply.kube_errors import KubeApiError
from llmdeploy.apply.object_diff import diff_objects
from llmdeploy.apply.ordering import apply_order, delete_order


def test_apply_order_follows_kind_rank_and_keeps_order_within_a_kind() -> None:
    objs = [
        {"kind": k, "n": i}
        for i, k in enumerate(
            [
                "HorizontalPodAutoscaler",
                "Deployment",
                "ConfigMap",
                "Namespace",
                "ConfigMap",
                "Service",
                "PodDisruptionBudget",
                "PersistentVolumeClaim",
                "Secret",
                "ServiceAccount",
                "Widget",
            ]
        )
    ]
    kinds = [o["kind"] for o in apply_order(objs)]
    assert kinds == [
        "Namespace",
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "ConfigMap",
        "PersistentVolumeClaim",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "Widget",
    ]
    assert [o["n"] for o in apply_order(objs) if o["kind"] == "ConfigMap"] == [2, 4]
    assert [o["kind"] for o in delete_order(objs)][:2] == ["Widget", "HorizontalPodAutoscaler"]


def test_diff_ignores_server_managed_fields_and_keys_named_lists() -> None:
    live = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "x",
            "resourceVersion": "5",
            "generation": 2,
            "managedFields": [{"a": 1}],
            "annotations": {"deployment.kubernetes.io/revision": "2"},
            "labels": {"a": "1"},
        },
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "a", "image": "i:1"}, {"name": "b", "image": "j:1"}]}
            }
        },
        "status": {"replicas": 1},
    }
    after = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x", "resourceVersion": "6", "generation": 3, "labels": {"b": "2"}},
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "b", "image": "j:2"}, {"name": "a", "image": "i:1"}]}
            }
        },
    }
    rendered = [c.render() for c in diff_objects(live, after)]
    assert rendered == [
        '- metadata.labels.a: "1"',
        '+ metadata.labels.b: "2"',
        '~ spec.template.spec.containers[name=b].image: "j:1" -> "j:2"',
    ]
    assert diff_objects(live, {**live, "status": {"replicas": 3}}) == []


def test_capacity_change_is_described_with_deltas() -> None:
    before = Capacity(1000, 2.0, 1)
    assert describe_change(before, Capacity(3000, 6.0, 2)) == (
        "capacity: KV cache tokens 1,000 -> 3,000 (+2,000), max concurrency 2.0 -> 6.0 (+4.0), GPUs 1 -> 2 (+1)"
    )
    assert "unchanged" in describe_change(before, before)
    assert Capacity.from_annotation(before.to_annotation()) == before
    assert Capacity.from_annotation("not json") is None


def test_resource_paths() -> None:
    dep = ResourceType("apps", "v1", "Deployment", "deployments", True)
    assert dep.path("ns", "x") == "/apis/apps/v1/namespaces/ns/deployments/x"
    ns = ResourceType("", "v1", "Namespace", "namespaces", False)
    assert ns.path("ignored", "x") == "/api/v1/namespaces/x"
    assert ns.api_version == "v1" and dep.api_version == "apps/v1"


def test_unreachable_server_is_a_clear_user_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": "u", "user": {"token": "abc"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    with connect(path, timeout_s=2) as client, pytest.raises(KubeApiError) as err:
        client.request("GET", "/version", what="read version")
    assert f"cannot reach the Kubernetes API at https://127.0.0.1:{port}" in str(err.value)
    assert "fix:" in str(err.value)


def _deployment(
    generation: int,
    observed: int,
    replicas: int,
    updated: int,
    available: int,
    conditions: list[dict[str, str]],
) -> dict[str, object]:
    return {
        "metadata": {"name": "d", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "replicas": updated,
            "updatedReplicas": updated,
            "availableReplicas": available,
            "conditions": conditions,
        },
    }


def test_rollout_state_reads_named_conditions() -> None:
    from llmdeploy.apply.rollout import deployment_state

    available = {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "ok"}
    assert deployment_state(_deployment(2, 2, 2, 2, 2, [available])).done
    assert not deployment_state(_deployment(3, 2, 2, 2, 2, [available])).done  # new spec not yet seen
    assert not deployment_state(_deployment(2, 2, 2, 2, 1, [available])).done
    stuck = {
        "type": "Progressing",
        "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "message": 'ReplicaSet "d-1" has timed out progressing.',
    }
    state = deployment_state(_deployment(2, 2, 2, 1, 0, [stuck]))
    assert state.failed and "timed out progressing" in state.conditions[0].render()


def test_drop_settled_ignores_changes_at_fields_already_at_the_desired_value() -> None:
    from llmdeploy.apply.object_diff import drop_settled

    metric = {"type": "Pods", "pods": {"metric": {"name": "q"}}}
    live = {
        "metadata": {"name": "h", "labels": {"a": "1", "old": "x"}},
        "spec": {"metrics": [metric], "max": 3},
    }
    desired = {"metadata": {"name": "h", "labels": {"a": "1"}}, "spec": {"metrics": [metric], "max": 4}}
    server_says = {
        "metadata": {"name": "h", "labels": {"a": "1"}},
        "spec": {"metrics": [metric, metric], "max": 4},
    }
    kept = [c.render() for c in drop_settled(diff_objects(live, server_says), desired, live)]
    assert kept == ['- metadata.labels.old: "x"', "~ spec.max: 3 -> 4"]


def test_dry_run_of_a_local_recipe_is_refused_before_anything_starts() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "apply", "recipes/quickstart.yaml", "--dry-run"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert "--dry-run is for Kubernetes-backed targets" in result.stderr
