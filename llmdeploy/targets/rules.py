"""Every check `validate`, `render` and `apply` make of a recipe for its target, in one list.

The memory gate comes first and holds for every target: a plan that does not fit is refused before
anything is rendered or started (an out-of-memory start otherwise shows up as a failed startup probe
or a crash loop). Then the checks every target shares, driven by the target's facts
(`llmdeploy.render.target_rules`), then the target's own `problems`.
"""

from __future__ import annotations

from llmdeploy.errors import Problem
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import Recipe
from llmdeploy.render.target_rules import shared_problems
from llmdeploy.targets.registry import get_target


def fit_problems(plan: MemoryPlan | None) -> list[Problem]:
    """The memory gate: the plan's own problems when it does not fit (none without a plan)."""
    if plan is None or plan.fits:
        return []
    fix = "\n         or ".join(plan.suggestions) if plan.suggestions else None
    return [Problem(f"does not fit: {text}", fix=fix) for text in plan.problems] or [
        Problem("the memory plan does not fit", fix=fix)
    ]


def target_rule_problems(recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
    """What the recipe's target cannot render or run, the memory gate aside (`validate` reports that
    with the planner's other rules)."""
    target = get_target(recipe.target.type)
    return [
        *shared_problems(
            recipe,
            plan,
            target=target.name,
            display_name=target.display_name,
            in_container=target.in_container,
            secrets_from=target.secrets_from,
        ),
        *target.problems(recipe, plan),
    ]


def target_problems(recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
    """Every problem that stops `render(recipe, plan)` and `apply`: empty when it renders."""
    return [*fit_problems(plan), *target_rule_problems(recipe, plan)]
