"""The checks every target makes of a recipe before it renders, parametrized by the target's facts.

`llmdeploy.targets.target_problems` runs these with the recipe's target's facts (does it run an
image, where do its secrets come from) and then the target's own rules; `render`, `apply` and
`validate` all call it, so a recipe `validate` passes is one `render` and `apply` accept (a CI gate
on `validate` is exact). Each problem names the field to change. Nothing here knows a target by name.
"""

from __future__ import annotations

from typing import Literal

from llmdeploy.engines import get_engine
from llmdeploy.errors import Problem, UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import ApiKeyFromEnv, ApiKeyFromSecret, Recipe
from llmdeploy.render.engine_command import engine_command
from llmdeploy.render.model_location import container_model_ref


def shared_problems(
    recipe: Recipe,
    plan: MemoryPlan | None,
    *,
    target: str,
    display_name: str,
    in_container: bool,
    secrets_from: Literal["env", "secret"],
) -> list[Problem]:
    """The problems that stop any target from rendering `recipe`: the engine's flag mapping,
    secrets the target cannot read, and fields naming this machine on a target that runs an image."""
    return [
        *_secret_sources(recipe, target, display_name, secrets_from),
        *_engine(recipe, plan, in_container),
        *_local_only(recipe, target, in_container),
    ]


def _engine(recipe: Recipe, plan: MemoryPlan | None, in_container: bool) -> list[Problem]:
    problems: list[Problem] = []
    model_ref, host = recipe.model.id, None
    if in_container:
        host = "0.0.0.0"
        try:
            model_ref = container_model_ref(recipe)
        except UserError as e:
            problems += e.problems
    try:
        engine_command(recipe, plan, model_ref=model_ref, host=host)
    except UserError as e:
        problems += e.problems
    return problems


def _local_only(recipe: Recipe, target: str, in_container: bool) -> list[Problem]:
    """Fields that name something on this machine, which a container target would silently ignore."""
    if recipe.engine.executable is None or not in_container:
        return []
    return [
        Problem(
            f"engine.executable names a local install; the {target} target runs the engine its image holds",
            path="engine.executable",
            value=recipe.engine.executable,
            has_value=True,
            fix="remove engine.executable here (an overlay can set it to null); choose the engine with "
            "target.image",
        )
    ]


def _secret_sources(
    recipe: Recipe, target: str, display_name: str, secrets_from: Literal["env", "secret"]
) -> list[Problem]:
    problems = []
    for knob, source in (
        ("server.api_key", recipe.server.api_key),
        ("server.hf_token", recipe.server.hf_token),
    ):
        if source is None or (
            knob == "server.hf_token" and not get_engine(recipe.engine.type).downloads_from_hub
        ):
            continue  # the engine's own rule refuses a hub token
        if secrets_from == "secret" and isinstance(source, ApiKeyFromEnv):
            problems.append(
                Problem(
                    f"on {display_name}, {knob} must come from a Secret, not from an environment variable",
                    path=f"{knob}.env",
                    value=source.env,
                    has_value=True,
                    fix="write {secret: {name: SECRET, key: KEY}} and create that Secret in the namespace",
                )
            )
        if secrets_from == "env" and isinstance(source, ApiKeyFromSecret):
            problems.append(
                Problem(
                    f"a Kubernetes Secret cannot be read by {display_name} (the {target} target)",
                    path=f"{knob}.secret",
                    value=source.secret.name,
                    has_value=True,
                    fix=f"write {knob}: {{env: VARIABLE}} for the {target} target",
                )
            )
    return problems
