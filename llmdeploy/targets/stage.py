"""The stages that go through the recipe's target: `render` and `apply`.

`render(recipe, plan) -> Artifacts` and `apply(recipe, request, console) -> ApplyResult` refuse with
every problem of `target_problems` at once (the memory gate included), then hand over to the
target named by `recipe.target.type`.
"""

from __future__ import annotations

from llmdeploy.errors import UserError
from llmdeploy.planner import MemoryPlan, make_plan
from llmdeploy.recipe import Recipe, recipe_digest
from llmdeploy.render.artifacts import Artifacts
from llmdeploy.targets.base import ApplyRequest, ApplyResult, Console
from llmdeploy.targets.registry import get_target
from llmdeploy.targets.rules import target_problems


def render(recipe: Recipe, plan: MemoryPlan | None) -> Artifacts:
    """The launch files of the recipe's target; byte-identical for identical input."""
    problems = target_problems(recipe, plan)
    if problems:
        raise UserError(problems)
    rendered = get_target(recipe.target.type).render(recipe, plan)
    return Artifacts(
        recipe_name=recipe.name,
        recipe_sha256=recipe_digest(recipe),
        files=rendered.files,
        documents=rendered.documents,
    )


def checked_plan(recipe: Recipe) -> MemoryPlan:
    """The recipe's memory plan, refused with every problem when the target cannot take it."""
    plan = make_plan(recipe)
    problems = target_problems(recipe, plan)
    if problems:
        raise UserError(problems)
    return plan


def apply(recipe: Recipe, request: ApplyRequest, console: Console) -> ApplyResult:
    """Bring the recipe's deployment to its rendered state through its target."""
    plan = checked_plan(recipe)
    return get_target(recipe.target.type).apply(recipe, plan, request, console)
