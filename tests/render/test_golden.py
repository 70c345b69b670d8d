"""Every shipped recipe renders to exactly its golden files (regenerate: pytest tests/render --update-golden)."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest

from llmdeploy.targets import render
from render.recipe_factory import GOLDEN_DIR, RECIPES, shipped


@pytest.mark.parametrize("recipe_file", RECIPES, ids=lambda p: p.stem)
def test_render_matches_golden(recipe_file: Path, update_golden: bool) -> None:
    recipe, plan = shipped(recipe_file)
    files = render(recipe, plan).files
    golden = GOLDEN_DIR / recipe_file.stem
    if update_golden:
        shutil.rmtree(golden, ignore_errors=True)
        golden.mkdir(parents=True)
        for name, text in files.items():
            (golden / name).write_text(text)
        return
    assert golden.is_dir(), (
        f"no golden render for {recipe_file.name}: run pytest tests/render --update-golden"
    )
    expected = sorted(p.name for p in golden.iterdir())
    assert sorted(files) == expected, "rendered file set differs from the golden one"
    for name, text in files.items():
        want = (golden / name).read_text()
        if text != want:
            diff = "".join(
                difflib.unified_diff(
                    want.splitlines(True),
                    text.splitlines(True),
                    f"golden/{recipe_file.stem}/{name}",
                    f"rendered/{name}",
                )
            )
            pytest.fail(
                f"{name} differs from its golden file (pytest tests/render --update-golden "
                f"if intended):\n{diff}"
            )


def test_every_recipe_has_a_golden_folder() -> None:
    stale = sorted({p.name for p in GOLDEN_DIR.iterdir() if p.is_dir()} - {r.stem for r in RECIPES})
    assert not stale, f"golden folders without a recipe: {stale}"
