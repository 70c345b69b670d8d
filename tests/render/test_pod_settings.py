"""The pod settings of a Kubernetes target reach the rendered objects; bad values fail at load with a fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llmdeploy.errors import UserError
from llmdeploy.planner import make_plan
from llmdeploy.recipe import load_recipe
from llmdeploy.targets import render
from render.pod_settings import pod_settings
from render.recipe_factory import make_recipe

K8S = {"type": "kubernetes", "namespace": "llm"}


def _documents(**target: Any) -> dict[str, dict[str, Any]]:
    recipe = make_recipe("vllm", target={**K8S, **target})
    return {d["kind"]: d for d in render(recipe, make_plan(recipe)).documents}


def test_every_pod_setting_reaches_the_deployment() -> None:
    docs = _documents(**pod_settings("t"))
    deployment = docs["Deployment"]
    template = deployment["spec"]["template"]
    pod = template["spec"]
    user_set = {
        k: v for k, v in deployment["metadata"]["annotations"].items() if not k.startswith("llmdeploy.io/")
    }
    assert user_set == {"owner.example.com/contact": "ml-platform@example.com"}
    assert deployment["metadata"]["labels"]["cost-center"] == "c-42"
    assert "sidecar.istio.io/inject" not in deployment["metadata"]["labels"]
    assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    assert template["metadata"]["labels"]["team"] == "ml-platform"
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["owner.example.com/contact"] == "ml-platform@example.com"
    assert pod["serviceAccountName"] == "llm-engine"
    assert pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert pod["priorityClassName"] == "llm-serving"
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["gpu"]
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            # defaults to this recipe's pods, or the constraint would count none
            "labelSelector": {
                "matchLabels": {
                    "app.kubernetes.io/instance": "t",
                    "app.kubernetes.io/name": "llmdeploy-engine",
                }
            },
        }
    ]
    engine, sidecar = pod["containers"]
    assert engine["name"] == "engine" and sidecar["name"] == "log-shipper"
    assert engine["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "1"},
    }
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in engine["env"]
    assert {"name": "OTEL_SERVICE_NAME", "value": "llm"} in engine["env"]
    assert {"name": "certs", "mountPath": "/etc/corp-ca", "readOnly": True} in engine["volumeMounts"]
    assert {"name": "certs", "configMap": {"name": "corp-ca"}} in pod["volumes"]
    assert sidecar["args"] == ["--input", "/tmp/engine.log"]
    # a sidecar without its own securityContext gets the engine's restricted one
    assert sidecar["securityContext"] == engine["securityContext"]
    assert [c["name"] for c in pod["initContainers"]] == ["wait-for-proxy"]
    # the patches
    assert pod["dnsPolicy"] == "ClusterFirst" and pod["enableServiceLinks"] is False
    service = docs["Service"]
    assert service["metadata"]["annotations"] == {
        "owner.example.com/contact": "ml-platform@example.com",
        "lb.example.com/internal": "true",
    }
    assert service["spec"]["ports"][0]["name"] == "web"


def test_cpu_recipe_gets_cpu_and_memory_without_a_gpu() -> None:
    recipe = make_recipe(
        "builtin",
        model={"id": "HuggingFaceTB/SmolLM2-135M-Instruct"},
        hardware={"device": "cpu"},
        limits={"kv_cache_memory_gib": 0.5},
        target={**K8S, "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
    )
    deployment = next(d for d in render(recipe, make_plan(recipe)).documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}


def test_unset_pod_settings_add_nothing() -> None:
    pod = _documents()["Deployment"]["spec"]["template"]["spec"]
    for key in ("serviceAccountName", "imagePullSecrets", "priorityClassName", "affinity",
                "topologySpreadConstraints", "initContainers"):  # fmt: skip
        assert key not in pod
    assert pod["automountServiceAccountToken"] is False  # the engine never calls the API server
    assert [c["name"] for c in pod["containers"]] == ["engine"]


RECIPE = """\
name: pods
model:
  id: meta-llama/Llama-3.1-8B-Instruct
hardware:
  gpu: A100-80GB
target:
  type: kubernetes
  namespace: llm
"""


def _load_error(tmp_path: Path, target_yaml: str) -> str:
    path = tmp_path / "pods.yaml"
    path.write_text(RECIPE + target_yaml)
    with pytest.raises(UserError) as info:
        load_recipe(path)
    return str(info.value)


@pytest.mark.parametrize(
    ("target_yaml", "expected"),
    [
        ("  labels: {'bad key': x}\n", ["target.labels", "not a Kubernetes label key"]),
        ("  labels: {team: 'not ok!'}\n", ["target.labels.team", "not a Kubernetes label value"]),
        ("  labels: {Example.COM/team: x}\n", ["target.labels", "an optional DNS prefix"]),
        ("  pod_labels: {app.kubernetes.io/instance: x}\n", ["app.kubernetes.io/instance is set by llmdeploy"]),
        ("  annotations: {'a/b/c': x}\n", ["target.annotations", "prefix before '/'"]),
        ("  service_account: Engine_SA\n", ["target.service_account", "not a Kubernetes object name"]),
        ("  image_pull_secrets: [ok, -bad]\n", ["target.image_pull_secrets.1", "'-bad'"]),
        ("  priority_class: 'high priority'\n", ["target.priority_class"]),
        ("  resources: {requests: {memory: 32GB}}\n", ["target.resources.requests.memory", "not a Kubernetes quantity"]),
        ("  resources: {requests: {cpu: '8'}, limits: {cpu: 4000m}}\n", ["cpu request (8) exceeds its limit (4000m)"]),
        ("  resources: {limits: {nvidia.com/gpu: 2}}\n", ["nvidia.com/gpu comes from parallelism"]),
        ("  resources: {requests: {cpus: 2}}\n", ["'cpus' is not a resource Kubernetes knows"]),
        ("  resources: {limit: {cpu: 1}}\n", ["unknown field 'limit'", "did you mean 'limits'"]),
        ("  sidecars: [{name: Log_Shipper, image: x}]\n", ["target.sidecars.0.name", "not a DNS label"]),
        ("  sidecars: [{name: engine, image: x}]\n", ["container name 'engine' is taken"]),
        ("  sidecars: [{name: a, image: x, imagePullPolicy: Sometimes}]\n", ["target.sidecars.0.imagePullPolicy"]),
        ("  sidecars: [{name: a, image: x, imagePulPolicy: Always}]\n", ["unknown field 'imagePulPolicy'", "imagePullPolicy"]),
        ("  init_containers: [{name: a}]\n", ["target.init_containers.0.image", "required field is missing"]),
        ("  volumes: [{name: certs, configMap: {name: a}, secret: {secretName: b}}]\n", ["exactly one source"]),
        ("  volumes: [{name: certs, configmap: {name: a}}]\n", ["unknown field(s) configmap"]),
        ("  volumes: [{name: tmp, emptyDir: {}}]\n", ["tmp are used twice or by llmdeploy's own volumes"]),
        ("  volume_mounts: [{name: certs, mountPath: /etc/certs}]\n", ["no volume named 'certs'"]),
        ("  volumes: [{name: c, emptyDir: {}}]\n  volume_mounts: [{name: c, mountPath: etc}]\n", ["must be an absolute path"]),
        ("  env: [{name: A, value: x, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]\n", ["give value or valueFrom, not both"]),
        ("  env: [{name: '1 A', value: x}]\n", ["not an environment variable name"]),
        ("  node_affinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: In}]}]}}\n", ["operator In needs at least one value"]),
        ("  topology_spread: [{maxSkew: 0, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}]\n", ["target.topology_spread.0.maxSkew", "at least 1"]),
        ("  patches: [{patch: [{op: add, path: /spec/x, value: 1}]}]\n", ["a JSON 6902 patch needs `target"]),
        ("  patches: [{patch: {spec: {}}}]\n", ["give `target: {kind: ..., name: ...}`"]),
        ("  patches: [{target: {kind: Service}, patch: [{op: move, path: /a}]}]\n", ["op move needs `from:`"]),
        ("  patches: [{target: {kind: Service}, patch: [{op: add, path: spec, value: 1}]}]\n", ["not a JSON pointer"]),
    ],
)  # fmt: skip
def test_bad_pod_settings_name_the_field_and_the_fix(
    tmp_path: Path, target_yaml: str, expected: list[str]
) -> None:
    message = _load_error(tmp_path, target_yaml)
    assert "pods.yaml:" in message
    for text in expected:
        assert text in message, message


def test_a_patch_may_be_given_as_yaml_text(tmp_path: Path) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(
        RECIPE
        + "  patches:\n    - target: {kind: Deployment}\n      patch: |\n"
        + "        - op: add\n          path: /spec/template/spec/hostNetwork\n          value: false\n"
    )
    recipe = load_recipe(path)
    deployment = next(d for d in render(recipe, make_plan(recipe)).documents if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["hostNetwork"] is False


def test_pod_settings_are_in_the_recipe_json_schema() -> None:
    from llmdeploy.recipe.json_schema import recipe_json_schema

    text = yaml.safe_dump(recipe_json_schema())
    for field in (
        "service_account",
        "image_pull_secrets",
        "topology_spread",
        "sidecars",
        "patches",
        "whenUnsatisfiable",
    ):
        assert field in text
