"""Every shipped recipe rendered for every serving-platform target that accepts it matches its golden
files under tests/targets/golden/<recipe>/<target>/ (regenerate: pytest tests/targets --update-golden).
A pair the target refuses has no golden folder; its refusal is checked to come with a fix. A recipe
written for the platform itself is covered by tests/render/golden/<recipe>/."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path
from typing import Any

import pytest

from llmdeploy.planner import make_plan
from llmdeploy.recipe import Recipe, load_recipe
from llmdeploy.targets import render, target_problems

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
GOLDEN_DIR = Path(__file__).with_name("golden")
# each platform's section as a recipe written for another target would say it
SECTIONS: dict[str, dict[str, Any]] = {
    "kserve": {"type": "kserve", "namespace": "llm"},
    "llm-d": {"type": "llm-d", "namespace": "llm"},
    "production-stack": {"type": "production-stack", "namespace": "llm"},
    "kubeai": {"type": "kubeai", "namespace": "llm", "resource_profile": "nvidia-gpu"},
}
PAIRS = [(r, t) for r in RECIPES for t in SECTIONS if load_recipe(r).target.type != t]


def _retargeted(path: Path, target: str) -> Recipe:
    recipe = load_recipe(path)
    data = recipe.model_dump(mode="json", exclude_none=True)
    data["target"] = SECTIONS[target]
    return Recipe.model_validate(data)


@pytest.mark.parametrize(("recipe_file", "target"), PAIRS, ids=[f"{r.stem}-{t}" for r, t in PAIRS])
def test_platform_render_matches_golden(recipe_file: Path, target: str, update_golden: bool) -> None:
    recipe = _retargeted(recipe_file, target)
    plan = make_plan(recipe)
    golden = GOLDEN_DIR / recipe_file.stem / target
    problems = target_problems(recipe, plan)
    if problems:
        assert all(p.fix for p in problems), [p.render() for p in problems]
        if update_golden:
            shutil.rmtree(golden, ignore_errors=True)
        assert not golden.exists(), f"{golden} is stale: {target} refuses {recipe_file.name}"
        return
    files = render(recipe, plan).files
    if update_golden:
        shutil.rmtree(golden, ignore_errors=True)
        golden.mkdir(parents=True)
        for name, text in files.items():
            (golden / name).write_text(text)
        return
    assert golden.is_dir(), (
        f"no golden render for {recipe_file.name} on {target}: pytest tests/targets --update-golden"
    )
    assert sorted(files) == sorted(p.name for p in golden.iterdir()), "rendered file set differs"
    for name, text in files.items():
        want = (golden / name).read_text()
        if text != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), name, name))
            pytest.fail(
                f"{name} differs from its golden file (pytest tests/targets --update-golden):\n{diff}"
            )


def test_no_golden_folder_without_a_recipe() -> None:
    if not GOLDEN_DIR.is_dir():
        return
    stale = sorted({p.name for p in GOLDEN_DIR.iterdir()} - {r.stem for r in RECIPES})
    assert not stale, f"golden folders without a recipe: {stale}"
