"""Every check `render` (and so `apply`) makes of a recipe for its target, collected in one list.

`render` runs these before it writes anything and refuses with all of them at once; `validate` runs
the same function, so a recipe `validate` passes is one `render` and `apply` accept (a CI gate on
`validate` is exact). Each problem names the field to change.
"""

from __future__ import annotations

from llmdeploy.engines import get_engine
from llmdeploy.errors import Problem, UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import ApiKeyFromEnv, ApiKeyFromSecret, KubernetesTarget, Recipe
from llmdeploy.render.engine_command import engine_command
from llmdeploy.render.kubernetes_objects import scaling_metric
from llmdeploy.render.kubernetes_rules import pod_problems
from llmdeploy.render.model_location import container_model_ref


def render_problems(recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
    """The problems that stop `render(recipe, plan)` for the recipe's target; empty when it renders."""
    problems = [*_secret_sources(recipe), *_engine(recipe, plan), *_local_only(recipe)]
    if isinstance(recipe.target, KubernetesTarget):
        problems += pod_problems(recipe, recipe.target) + _kubernetes(recipe, recipe.target)
    return problems


def _engine(recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
    problems: list[Problem] = []
    model_ref, host = recipe.model.id, None
    if recipe.target.type != "local":
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


def _local_only(recipe: Recipe) -> list[Problem]:
    """Fields that name something on this machine, which a container target would silently ignore."""
    if recipe.engine.executable is None or recipe.target.type == "local":
        return []
    return [
        Problem(
            f"engine.executable names a local install; the {recipe.target.type} target runs the engine "
            "its image holds",
            path="engine.executable",
            value=recipe.engine.executable,
            has_value=True,
            fix="remove engine.executable here (an overlay can set it to null); choose the engine with "
            "target.image",
        )
    ]


def _secret_sources(recipe: Recipe) -> list[Problem]:
    target = recipe.target.type
    problems = []
    for knob, source in (
        ("server.api_key", recipe.server.api_key),
        ("server.hf_token", recipe.server.hf_token),
    ):
        if source is None or (
            knob == "server.hf_token" and not get_engine(recipe.engine.type).downloads_from_hub
        ):
            continue  # the engine's own rule refuses a hub token
        if target == "kubernetes" and isinstance(source, ApiKeyFromEnv):
            problems.append(
                Problem(
                    f"on Kubernetes, {knob} must come from a Secret, not from an environment variable",
                    path=f"{knob}.env",
                    value=source.env,
                    has_value=True,
                    fix="write {secret: {name: SECRET, key: KEY}} and create that Secret in the namespace",
                )
            )
        if target != "kubernetes" and isinstance(source, ApiKeyFromSecret):
            where = "on the local target" if target == "local" else "by Docker Compose"
            problems.append(
                Problem(
                    f"a Kubernetes Secret cannot be read {where}",
                    path=f"{knob}.secret",
                    value=source.secret.name,
                    has_value=True,
                    fix=f"write {knob}: {{env: VARIABLE}} for the {target} target",
                )
            )
    return problems


def _kubernetes(recipe: Recipe, target: KubernetesTarget) -> list[Problem]:
    problems: list[Problem] = []
    autoscaling = target.autoscaling
    if autoscaling is None:
        return problems
    if recipe.hardware.nodes > 1:
        problems.append(
            Problem(
                "autoscaling a LeaderWorkerSet is not rendered",
                path="target.autoscaling",
                fix="remove target.autoscaling for multi-node replicas (hardware.nodes > 1)",
            )
        )
    if autoscaling.kind == "hpa" and autoscaling.min_replicas < 1:
        problems.append(
            Problem(
                "a HorizontalPodAutoscaler cannot scale to zero",
                path="target.autoscaling.min_replicas",
                value=autoscaling.min_replicas,
                has_value=True,
                fix="use min_replicas >= 1, or kind: keda",
            )
        )
    try:
        scaling_metric(recipe, autoscaling.metric)
    except UserError as e:
        problems += e.problems
    return problems
