"""Every shipped recipe moved to every other target that accepts it renders exactly its golden files
(tests/render/golden_targets/<recipe>/<target>/; regenerate: pytest tests/render --update-golden).

A recipe moved to another target reads its secrets the way that target reads them (an environment
variable for local and docker, a Secret for Kubernetes-backed targets); a pair the target refuses
has a `REFUSED` file holding the refusal, so a refusal that appears or goes away shows as well."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest

from llmdeploy.errors import UserError
from llmdeploy.planner import make_plan
from llmdeploy.recipe import load_recipe
from llmdeploy.recipe.schema import Recipe
from llmdeploy.targets import TARGETS, render
from render.recipe_factory import RECIPES

GOLDEN_DIR = Path(__file__).with_name("golden_targets")
SOURCES = {"env": "{env: LLMDEPLOY_SECRET}", "secret": "{secret: {name: llm, key: token}}"}
PAIRS = [
    (path, name)
    for path in RECIPES
    for name in TARGETS
    if load_recipe(path).target.type != name  # its own target is tests/render/golden/<recipe>/
]


def moved(path: Path, name: str) -> Recipe:
    """The shipped recipe on target `name`, its secrets read as that target reads them."""
    recipe = load_recipe(path)
    overrides = [f"target={{type: {name}}}"] + [
        f"server.{knob}={SOURCES[TARGETS[name].secrets_from]}"
        for knob in ("api_key", "hf_token")
        if getattr(recipe.server, knob) is not None
    ]
    return load_recipe(path, overrides)


def _rendered(path: Path, name: str) -> dict[str, str]:
    recipe = moved(path, name)
    try:
        return render(recipe, make_plan(recipe)).files
    except UserError as e:
        return {"REFUSED": "".join(f"{p.path}: {p.message}\n" for p in e.problems)}


@pytest.mark.parametrize(("path", "name"), PAIRS, ids=[f"{p.stem}-{n}" for p, n in PAIRS])
def test_moved_recipe_matches_golden(path: Path, name: str, update_golden: bool) -> None:
    files = _rendered(path, name)
    golden = GOLDEN_DIR / path.stem / name
    if update_golden:
        shutil.rmtree(golden, ignore_errors=True)
        golden.mkdir(parents=True)
        for file, text in files.items():
            (golden / file).write_text(text)
        return
    assert golden.is_dir(), (
        f"no golden render for {path.stem} on {name}: run pytest tests/render --update-golden"
    )
    assert sorted(files) == sorted(p.name for p in golden.iterdir()), "rendered file set differs"
    for file, text in files.items():
        want = (golden / file).read_text()
        if text != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), file, file))
            pytest.fail(
                f"{path.stem} on {name}: {file} differs (pytest tests/render --update-golden):\n{diff}"
            )


def test_no_stale_golden_pair() -> None:
    wanted = {(p.stem, n) for p, n in PAIRS}
    found = {(d.parent.name, d.name) for d in GOLDEN_DIR.glob("*/*") if d.is_dir()}
    assert found <= wanted, f"golden pairs without a recipe or target: {sorted(found - wanted)}"
