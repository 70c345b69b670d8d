"""The serving-platform targets (kserve, llm-d, production-stack, kubeai) render what the platform
accepts: every custom resource matches its pinned CRD (no field the API server would prune), core
kinds pass kubernetes-validate, production-stack's values pass the chart's own schema; the plan's
capacity is on the objects; fields an autoscaler or controller owns are left out; SGLang's argv passes
SGLang's catalogue; and every refusal names file:line and the fix."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from llmdeploy.engines.catalogue import check_flags
from llmdeploy.planner import make_plan
from llmdeploy.recipe import Recipe, load_recipe
from llmdeploy.render.capacity_marks import KV_CACHE_TOKENS as KV_TOKENS_ANNOTATION
from llmdeploy.render.capacity_marks import MAX_CONCURRENCY as MAX_CONCURRENCY_ANNOTATION
from llmdeploy.targets import render, target_problems
from llmdeploy.targets.llm_d_objects import router_files
from targets.platform_schemas import CRD_FILES, check_chart_values, check_custom_resource

ROOT = Path(__file__).resolve().parents[2]
PLATFORM_RECIPES = [
    ROOT / "recipes" / f"{name}.yaml" for name in ("kserve", "llm-d", "kubeai", "production-stack")
]
REFUSED = sorted((Path(__file__).parent / "refused").glob("*.yaml"))
VLLM_ONLY_FLAGS = ("--max-model-len", "--gpu-memory-utilization", "--tensor-parallel-size", "--max-num-seqs")


def _retarget(recipe: Recipe, target: dict[str, Any], **server: Any) -> Recipe:
    data = recipe.model_dump(mode="json", exclude_none=True)
    data["target"] = target
    data["server"] = {**data["server"], **server}
    return Recipe.model_validate(data)


def _documents(recipe: Recipe) -> tuple[dict[str, Any], ...]:
    rendered = render(recipe, make_plan(recipe))
    return rendered.documents


def _engine_argv(doc: dict[str, Any]) -> list[str]:
    spec = doc["spec"]
    pod = spec["template"] if doc["kind"] == "LLMInferenceService" else spec["template"]["spec"]
    container = pod["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]


@pytest.mark.parametrize("path", PLATFORM_RECIPES, ids=lambda p: p.stem)
def test_shipped_platform_recipe_renders_what_the_platform_accepts(path: Path) -> None:
    recipe = load_recipe(path)
    plan = make_plan(recipe)
    assert plan.fits and target_problems(recipe, plan) == []
    rendered = render(recipe, plan)
    assert rendered.files == render(recipe, plan).files, "render is not byte-identical"
    if recipe.target.type == "production-stack":
        values = yaml.safe_load(rendered.files["values.yaml"])
        check_chart_values(values)
        spec = values["servingEngineSpec"]["modelSpec"][0]
        assert spec["annotations"][KV_TOKENS_ANNOTATION] == str(plan.kv_cache_tokens)
        return
    assert rendered.documents
    workloads = 0
    for doc in rendered.documents:
        if (doc["apiVersion"], doc["kind"]) in CRD_FILES:
            check_custom_resource(doc)
        else:
            kubernetes_validate.validate(doc, "1.30", strict=True)
        annotations = doc["metadata"].get("annotations", {})
        if KV_TOKENS_ANNOTATION in annotations:
            workloads += 1
            assert annotations[KV_TOKENS_ANNOTATION] == str(plan.kv_cache_tokens)
            assert annotations[MAX_CONCURRENCY_ANNOTATION] == f"{plan.max_concurrency:.2f}"
    assert workloads >= 1, "no object carries the plan's capacity"


def test_kubeai_model_leaves_replicas_to_its_autoscaler() -> None:
    (model,) = _documents(load_recipe(ROOT / "recipes" / "kubeai.yaml"))
    assert "replicas" not in model["spec"]
    assert (model["spec"]["minReplicas"], model["spec"]["maxReplicas"]) == (1, 3)
    assert model["metadata"]["name"] == "qwen2.5-7b-instruct"
    # KubeAI writes --model and --served-model-name itself; the port is vLLM's default
    assert not {"--model", "--served-model-name", "--port", "--host"} & set(model["spec"]["args"])


def test_kserve_sets_probes_and_shm_from_the_plan() -> None:
    recipe = load_recipe(ROOT / "recipes" / "kserve.yaml")
    (service,) = _documents(recipe)
    spec = service["spec"]
    main = spec["template"]["containers"][0]
    assert main["name"] == "main"
    assert main["startupProbe"]["failureThreshold"] * main["startupProbe"]["periodSeconds"] >= 180
    assert spec["template"]["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    ]
    assert spec["model"] == {"uri": "hf://Qwen/Qwen2.5-7B-Instruct", "name": "qwen2.5-7b-instruct"}
    argv = _engine_argv(service)
    assert argv[argv.index("--model") + 1] == "/mnt/models"
    assert check_flags("vllm", argv) == []


SGLANG = ROOT / "recipes" / "sglang.yaml"


@pytest.mark.parametrize(
    "target",
    [{"type": "kserve", "namespace": "llm"}, {"type": "llm-d", "namespace": "llm"}],
    ids=["kserve", "llm-d"],
)
def test_sglang_argv_passes_sglangs_catalogue(target: dict[str, Any]) -> None:
    recipe = _retarget(load_recipe(SGLANG), target, port=8000)
    workload = next(d for d in _documents(recipe) if d["kind"] in ("LLMInferenceService", "Deployment"))
    argv = _engine_argv(workload)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert check_flags("sglang", argv) == []
    assert not set(VLLM_ONLY_FLAGS) & set(argv), "a vLLM flag in an SGLang argv"
    if target["type"] == "llm-d":
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["llm-d.ai/engine-type"] == "sglang"


def test_llm_d_takes_the_builtin_engine_with_vllms_metric_names() -> None:
    quickstart = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    recipe = _retarget(quickstart, {"type": "llm-d", "namespace": "llm"}, host="0.0.0.0")
    docs = _documents(recipe)
    model_server = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "quickstart"
    )
    assert model_server["spec"]["template"]["metadata"]["labels"]["llm-d.ai/engine-type"] == "vllm"
    pool = next(d for d in docs if d["kind"] == "InferencePool")
    assert pool["spec"]["selector"]["matchLabels"] == model_server["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    check_custom_resource(pool)


def test_llm_d_no_kubernetes_endpoints_file() -> None:
    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    files = router_files(recipe, "127.0.0.1", [8000, 8001], "/etc/epp")
    endpoints = yaml.safe_load(files["llm-d/endpoints.yaml"])["endpoints"]
    assert [e["port"] for e in endpoints] == ["8000", "8001"]
    for entry in endpoints:
        ipaddress.IPv4Address(entry["address"])  # the plugin resolves no host names
        assert set(entry) <= {"name", "namespace", "address", "port", "labels"}
    config = yaml.safe_load(files["llm-d/epp-config.yaml"])
    assert config["dataLayer"]["discovery"] == {"pluginRef": "file-discovery"}
    discovery = next(p for p in config["plugins"] if p.get("type") == "file-discovery")
    assert discovery["parameters"]["path"] == "/etc/epp/endpoints.yaml"


def _expected(file: Path) -> list[str]:
    prefix = "# expect: "
    return [line[len(prefix) :] for line in file.read_text().splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def validate_output() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", *(f.name for f in REFUSED)],
        cwd=REFUSED[0].parent,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("file", REFUSED, ids=lambda p: p.stem)
def test_refusal_names_file_line_and_fix(file: Path, validate_output: str) -> None:
    assert f"FAIL {file.name}" in validate_output
    for fragment in _expected(file):
        assert fragment in validate_output, f"{fragment!r} not in:\n{validate_output}"
