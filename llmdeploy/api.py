"""llmdeploy as a library: the same stages the CLI runs, as plain functions.

    recipe = load_recipe("recipes/quickstart.yaml", ["limits.max_num_seqs=8"])
    plan = make_plan(recipe)
    artifacts = render(recipe, plan)
    result = apply(recipe, assume_yes=True)  # ApplyResult: by recipe.target (local, docker, kubernetes, ...)
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
from llmdeploy.render import Artifacts
from llmdeploy.smoke import SmokeReport, smoke
from llmdeploy.targets import ApplyRequest, ApplyResult, Cluster, Console, render
from llmdeploy.targets import apply as apply_target

__all__ = [
    "ApplyResult",
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
    force_conflicts: bool = False,
    console: Console | None = None,
) -> ApplyResult:
    """Bring the recipe's deployment to its rendered state through its target; returns what happened
    (`ApplyResult.ok`, `.url`, `.detail`; `.exit_code` is the CLI's).

    Local target: start the engine, wait for health, smoke-test. Docker: `docker compose up`.
    Kubernetes-backed targets: server-side apply of the rendered objects (ordered, pruned, waited
    on). Progress goes to stderr; `assume_yes` answers every question (else each is declined).
    """

    def confirm(question: str) -> bool:
        return assume_yes

    request = ApplyRequest(
        recipe_path=Path(recipe_path or f"{recipe.name}.yaml"),
        assume_yes=assume_yes,
        dry_run=dry_run,
        force_conflicts=force_conflicts,
        prune=prune,
        wait=wait,
        timeout_s=timeout_s,
        cluster=Cluster(Path(kubeconfig) if kubeconfig else None, context),
    )
    return apply_target(recipe, request, console or Console(confirm=confirm))
