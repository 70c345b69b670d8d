"""Every shipped recipe validates, plans and renders with `engine.type: builtin` (issue 28): the
built-in engine serves what the recipes declare (AWQ / GPTQ int4 and fp8 weights, fp8 KV, ...).

Recipes that the built-in engine still refuses for reasons outside its weight formats are strict
xfails naming the reason (a fix makes them pass, and the strict xfail then fails until removed); the
engine-support rules (architecture, KV dtype, weight format) must pass for every recipe."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from llmdeploy.planner import make_plan
from llmdeploy.planner.recipe_checks import check_recipe
from llmdeploy.recipe import load_recipe
from llmdeploy.targets import render

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
ENV = {"AGENT_API_KEY": "unused"}
OTHER_GAPS = {
    "production": "speculative.draft_model by hub id: the built-in engine loads local files only",
    "production-h100": "speculative.draft_model by hub id: the built-in engine loads local files only",
    "tgi": "server.hf_token: the built-in engine never downloads from a model hub",
    # platforms that run only their own runtimes (docs/targets/)
    "kserve": "engine.type: KServe's LLMInferenceService runs vLLM or SGLang",
    "kubeai": "engine.type: KubeAI's Model runs vLLM",
    "production-stack": "engine.type: production-stack's chart starts vLLM",
}
ENGINE_SUPPORT_PATHS = ("engine.type", "model.quantization", "kv_cache.dtype")


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_builtin_engine_supports_every_recipes_model_format_and_kv_dtype(path: Path) -> None:
    from llmdeploy.catalog import resolve_model
    from llmdeploy.engines.recipe_rules import engine_support_problems

    recipe = load_recipe(path, overrides=["engine.type=builtin"], env=ENV)
    problems = [
        p
        for p in engine_support_problems(recipe, resolve_model(recipe.model))
        if p.path in ENGINE_SUPPORT_PATHS
    ]
    assert not problems, [p.message for p in problems]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=OTHER_GAPS[p.stem]))
        if p.stem in OTHER_GAPS
        else p
        for p in RECIPES
    ],
    ids=[p.stem for p in RECIPES],
)
def test_recipe_validates_plans_and_renders_on_the_builtin_engine(path: Path) -> None:
    recipe = load_recipe(path, overrides=["engine.type=builtin"], env=ENV)
    assert recipe.engine.type == "builtin"
    plan = make_plan(recipe)
    problems = check_recipe(recipe, plan)
    assert not problems, [p.message for p in problems]
    assert plan.fits, plan.problems
    artifacts = render(recipe, plan)
    assert artifacts.files
    if recipe.model.quantization in ("awq", "gptq", "fp8"):
        # the flag and its value are neighbours in the launch script's argv and in a YAML block list
        tokens = [t.strip("\"',[]") for t in "\n".join(artifacts.files.values()).split() if t != "-"]
        pairs = set(itertools.pairwise(tokens))
        assert ("--quantization", recipe.model.quantization) in pairs
