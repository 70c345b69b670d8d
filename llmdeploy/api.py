"""llmdeploy as a library: the same stages the CLI runs, as plain functions.

    recipe = load_recipe("recipes/quickstart.yaml", ["limits.max_num_seqs=8"])
    plan = make_plan(recipe)
    artifacts = render(recipe, plan)
    apply(recipe, assume_yes=True)          # local process or Kubernetes, by recipe.target
    report = smoke("http://127.0.0.1:8000", recipe=recipe, plan=plan)
    result = bench(url, model, BenchOptions(num_requests=16, concurrency=(1, 4)))

User mistakes raise `UserError` (its `.problems` name file, line, field and fix).
"""

from __future__ import annotations

from pathlib import Path

from llmdeploy.bench import BenchOptions, BenchReport, bench
from llmdeploy.errors import UserError
from llmdeploy.planner import MemoryPlan, make_plan
from llmdeploy.recipe import load_recipe, recipe_digest
from llmdeploy.recipe.schema import Recipe
from llmdeploy.render import Artifacts, render
from llmdeploy.smoke import SmokeReport, smoke

__all__ = [
    "Artifacts",
    "BenchOptions",
    "BenchReport",
    "MemoryPlan",
    "Recipe",
    "SmokeReport",
    "UserError",
    "apply",
    "bench",
    "load_recipe",
    "make_plan",
    "recipe_digest",
    "render",
    "smoke",
]


def apply(
    recipe: Recipe,
    *,
    recipe_path: str | Path | None = None,
    assume_yes: bool = False,
    dry_run: bool = False,
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    prune: bool = True,
    wait: bool = True,
    timeout_s: float = 600.0,
) -> int:
    """Bring the recipe's deployment to its rendered state; returns the CLI's exit code (0: done).

    Local target: start the engine, wait for health, smoke-test. Kubernetes: server-side apply of
    the rendered objects (ordered, pruned, waited on). Progress goes to stderr.
    """
    import click

    def echo(msg: str) -> None:
        click.echo(msg, err=True)

    def confirm(question: str) -> bool:
        return assume_yes

    if recipe.target.type == "local":
        if dry_run:
            raise UserError.one(
                "dry_run is for kubernetes targets; a local apply cannot be rehearsed",
                path="target.type",
                value="local",
            )
        from llmdeploy.apply.local import apply_local

        return apply_local(recipe, Path(recipe_path or f"{recipe.name}.yaml"), assume_yes)
    if recipe.target.type != "kubernetes":
        raise UserError.one(
            f"apply does not handle target {recipe.target.type!r}; render it and start it yourself",
            path="target.type",
            value=recipe.target.type,
            fix=f"llmdeploy render {recipe_path or 'RECIPE'} -o DIR",
        )
    from llmdeploy.apply.capacity import capacity_from_plan
    from llmdeploy.apply.kube_objects import Instance
    from llmdeploy.apply.kube_target import ApplyOptions, apply_kubernetes, connect

    plan = make_plan(recipe)
    objects = [dict(o) for o in render(recipe, plan).kubernetes_objects]
    options = ApplyOptions(dry_run=dry_run, prune=prune, wait=wait, timeout_s=timeout_s)
    instance = Instance(recipe.name, recipe.target.namespace)
    with connect(Path(kubeconfig) if kubeconfig else None, context) as client:
        return apply_kubernetes(
            client, instance, objects, capacity_from_plan(recipe, plan), options, confirm, echo
        )
