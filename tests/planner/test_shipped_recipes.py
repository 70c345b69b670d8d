"""Every shipped recipe plans, fits, and serializes with the contract keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdeploy.planner import make_plan
from llmdeploy.recipe import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_plans_and_fits(path: Path) -> None:
    plan = make_plan(load_recipe(path))
    assert plan.fits, plan.problems
    data = plan.to_json()
    assert data["kv_cache_tokens"] >= data["max_model_len"] or data["max_concurrency"] >= 1
    assert data["weights_gib"] > 0 and data["kv_bytes_per_token"] > 0
