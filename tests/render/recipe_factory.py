"""Small recipes built in code for the render tests (the shipped recipes are covered by the golden test)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from llmdeploy.recipe.schema import Recipe

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO_ROOT / "recipes").glob("*.yaml"))
GOLDEN_DIR = Path(__file__).with_name("golden")


def make_recipe(engine_type: str = "vllm", **sections: Any) -> Recipe:
    data: dict[str, Any] = {
        "name": "t",
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "hardware": {"gpu": "A100-80GB"},
        "engine": {"type": engine_type},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return Recipe.model_validate(data)


@cache
def shipped(path: Path) -> tuple[Recipe, object]:
    """A shipped recipe and its plan, computed once per test session (planning a GGUF reads the file)."""
    from llmdeploy.planner import make_plan
    from llmdeploy.recipe import load_recipe

    recipe = load_recipe(path)
    return recipe, make_plan(recipe)
