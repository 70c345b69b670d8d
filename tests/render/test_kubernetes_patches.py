"""target.patches: strategic merge by Kubernetes' merge keys, RFC 6902 operations, and their errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmdeploy.errors import UserError
from llmdeploy.planner import make_plan
from llmdeploy.recipe.kubernetes_patch import Patch
from llmdeploy.render.kubernetes_patches import apply_patches
from llmdeploy.targets import render
from render.recipe_factory import make_recipe


def _deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "llm", "labels": {"a": "1"}},
        "spec": {
            "template": {
                "metadata": {"annotations": {"x": "1", "y": "2"}},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "e:1",
                            "command": ["serve", "--port", "8000"],
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "dshm", "emptyDir": {}}],
                    "tolerations": [{"key": "a", "operator": "Exists"}],
                },
            }
        },
    }


def _service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "d", "namespace": "llm"},
        "spec": {"ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
    }


def _patch(patch: Any, target: dict[str, str] | None = None) -> Patch:
    data: dict[str, Any] = {"patch": patch}
    if target is not None:
        data["target"] = target
    return Patch.model_validate(data)


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = objects[0]["spec"]["template"]["spec"]
    return spec


def test_strategic_merge_merges_lists_by_their_kubernetes_merge_keys() -> None:
    patch = _patch(
        {
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "template": {
                    "metadata": {"annotations": {"x": None, "z": "3"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "engine",
                                "command": ["serve"],
                                "env": [{"name": "B", "value": "two"}, {"name": "C", "value": "3"}],
                                "ports": [
                                    {"containerPort": 8000, "protocol": "TCP"},
                                    {"containerPort": 9000},
                                ],
                                "volumeMounts": [{"mountPath": "/tmp", "readOnly": True}],
                            },
                            {"name": "proxy", "image": "p:1"},
                        ],
                        "volumes": [{"name": "dshm", "$patch": "delete"}],
                        "tolerations": [{"key": "b", "operator": "Exists"}],
                    },
                }
            },
        }
    )
    original = [_deployment(), _service()]
    snapshot = copy.deepcopy(original)
    patched = apply_patches(original, [patch])
    assert original == snapshot, "the inputs are left untouched"
    pod = _pod(patched)
    engine, proxy = pod["containers"]
    assert engine["image"] == "e:1" and proxy == {"name": "proxy", "image": "p:1"}
    assert engine["command"] == ["serve"], "lists without a merge key are replaced"
    assert engine["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "two"},
        {"name": "C", "value": "3"},
    ]
    assert engine["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"containerPort": 9000},
    ]
    assert engine["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp", "readOnly": True}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    assert pod["tolerations"] == [{"key": "b", "operator": "Exists"}]
    assert patched[0]["spec"]["template"]["metadata"]["annotations"] == {"y": "2", "z": "3"}
    assert patched[1] == _service()


def test_strategic_merge_replace_and_delete_directives() -> None:
    patch = _patch(
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "engine", "resources": {"$patch": "replace", "limits": {"cpu": "2"}}}
                        ],
                        "volumes": [{"$patch": "replace"}, {"name": "only", "emptyDir": {}}],
                    }
                }
            },
            "metadata": {"labels": {"$patch": "delete"}},
        },
        target={"kind": "Deployment", "name": "d"},
    )
    out = apply_patches([_deployment()], [patch])[0]
    pod = out["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {"cpu": "2"}}
    assert pod["volumes"] == [{"name": "only", "emptyDir": {}}]
    assert "labels" not in out["metadata"]


def test_service_ports_merge_by_port() -> None:
    patch = _patch({"spec": {"ports": [{"port": 8000, "nodePort": 30080}]}}, target={"kind": "Service"})
    out = apply_patches([_deployment(), _service()], [patch])[1]
    assert out["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "nodePort": 30080}]


def test_json_6902_operations_apply_in_order() -> None:
    patch = _patch(
        [
            {"op": "test", "path": "/spec/template/spec/containers/0/name", "value": "engine"},
            {"op": "add", "path": "/spec/template/spec/containers/0/command/-", "value": "--enforce-eager"},
            {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "e:2"},
            {"op": "remove", "path": "/spec/template/spec/tolerations"},
            {"op": "copy", "from": "/metadata/labels", "path": "/spec/template/metadata/labels"},
        ],
        target={"kind": "Deployment", "name": "d"},
    )
    pod_template = apply_patches([_deployment()], [patch])[0]["spec"]["template"]
    container = pod_template["spec"]["containers"][0]
    assert container["command"] == ["serve", "--port", "8000", "--enforce-eager"]
    assert container["image"] == "e:2"
    assert "tolerations" not in pod_template["spec"]
    assert pod_template["metadata"]["labels"] == {"a": "1"}


def test_a_target_that_matches_nothing_is_an_error_listing_what_is_rendered() -> None:
    patch = _patch([{"op": "remove", "path": "/spec"}], target={"kind": "Deployment", "name": "other"})
    with pytest.raises(UserError) as info:
        apply_patches([_deployment(), _service()], [patch])
    text = str(info.value)
    assert "target.patches[0].target" in text and "matches no rendered object" in text
    assert "Deployment/d, Service/d" in text


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "remove", "path": "/spec/nothing"}], "operation [0] (remove /spec/nothing)"),
        (
            [{"op": "replace", "path": "/spec/template/spec/containers/5/image", "value": "x"}],
            "operation [0]",
        ),
        (
            [
                {"op": "add", "path": "/spec/replicas", "value": 2},
                {"op": "test", "path": "/spec/replicas", "value": 3},
            ],
            "operation [1] (test /spec/replicas)",
        ),
    ],
    ids=["remove-missing", "index-out-of-range", "test-fails"],
)
def test_a_failing_operation_names_itself(ops: list[dict[str, Any]], expected: str) -> None:
    with pytest.raises(UserError) as info:
        apply_patches([_deployment()], [_patch(ops, target={"kind": "Deployment"})])
    text = str(info.value)
    assert "target.patches[0].patch" in text and expected in text, text


def test_a_patch_may_not_rename_an_object() -> None:
    patch = _patch([{"op": "replace", "path": "/metadata/name", "value": "x"}], target={"kind": "Service"})
    with pytest.raises(UserError, match="changes the name of Service d"):
        apply_patches([_service()], [patch])


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"spec": {"$retainKeys": ["a"]}}, "$retainKeys is not supported"),
        ({"spec": {"$patch": "merge-ish"}}, "unknown $patch directive"),
        ({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}}, "merged by 'name'"),
        (
            {"spec": {"template": {"spec": {"tolerations": [{"$patch": "delete", "key": "a"}]}}}},
            "no merge key",
        ),
    ],
    ids=["retain-keys", "unknown-directive", "entry-without-key", "delete-without-key"],
)
def test_strategic_merge_errors(patch: dict[str, Any], expected: str) -> None:
    with pytest.raises(UserError) as info:
        apply_patches([_deployment()], [_patch(patch, target={"kind": "Deployment"})])
    assert expected in str(info.value)


def test_patches_reach_the_rendered_files() -> None:
    recipe = make_recipe(
        "vllm",
        target={
            "type": "kubernetes",
            "patches": [
                {"target": {"kind": "Deployment"}, "patch": {"spec": {"revisionHistoryLimit": 3}}},
                {
                    "target": {"kind": "Service"},
                    "patch": [{"op": "add", "path": "/spec/sessionAffinity", "value": "ClientIP"}],
                },
            ],
        },
    )
    artifacts = render(recipe, make_plan(recipe))
    assert "revisionHistoryLimit: 3\n" in artifacts.files["deployment.yaml"]
    assert "\n  sessionAffinity: ClientIP\n" in artifacts.files["service.yaml"]
    kinds = {d["kind"]: d for d in artifacts.documents}
    assert kinds["Deployment"]["spec"]["revisionHistoryLimit"] == 3
    assert kinds["Service"]["spec"]["sessionAffinity"] == "ClientIP"


def test_a_patch_of_a_kind_not_rendered_fails_at_render() -> None:
    recipe = make_recipe(
        "vllm",
        target={"type": "kubernetes", "patches": [{"target": {"kind": "Ingress"}, "patch": {"spec": {}}}]},
    )
    with pytest.raises(UserError, match="Ingress/\\*"):
        render(recipe, make_plan(recipe))


def test_a_failing_operation_prints_no_values_from_the_object() -> None:
    ops = [
        {"op": "test", "path": "/spec/template/spec/containers/0/env/0/value", "value": "guess"},
    ]
    with pytest.raises(UserError) as info:
        apply_patches([_deployment()], [_patch(ops, target={"kind": "Deployment"})])
    text = str(info.value)
    assert "differs from the tested value" in text
    assert "'1'" not in text and "guess" not in text
    missing = [{"op": "replace", "path": "/spec/template/spec/nothing/x", "value": 1}]
    with pytest.raises(UserError) as info:
        apply_patches([_deployment()], [_patch(missing, target={"kind": "Deployment"})])
    assert "e:1" not in str(info.value) and "nothing at that path" in str(info.value)


def test_strategic_merge_reaches_the_pod_templates_of_a_leader_worker_set() -> None:
    env = {"name": "NCCL_DEBUG", "value": "INFO"}
    template = {"spec": {"containers": [{"name": "engine", "env": [env]}]}}
    recipe = make_recipe(
        "vllm",
        hardware={"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
        parallelism={"tensor": 8, "pipeline": 2},
        target={
            "type": "kubernetes",
            "patches": [
                {
                    "target": {"kind": "LeaderWorkerSet"},
                    "patch": {"spec": {"leaderWorkerTemplate": {"workerTemplate": template}}},
                }
            ],
        },
    )
    lws = next(d for d in render(recipe, make_plan(recipe)).documents if d["kind"] == "LeaderWorkerSet")
    group = lws["spec"]["leaderWorkerTemplate"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    assert worker["env"][-1] == env and worker["image"], "merged into the engine container, not replacing it"
    assert env not in group["leaderTemplate"]["spec"]["containers"][0]["env"]
