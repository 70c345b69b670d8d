"""`llmdeploy apply | diff | delete | status | logs | down RECIPE`.

The recipe's `target.type` picks the implementation: `local` (a process on this machine), `docker`
(the rendered Compose file run by `docker compose`) or `kubernetes` (server-side apply against the
cluster in the kubeconfig).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import click

from llmdeploy.apply.prompt import terminal_confirm
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import KubernetesTarget, Recipe


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def _out(msg: str) -> None:
    click.echo(msg)


def _load(recipe_path: Path, overrides: tuple[str, ...], namespace: str | None = None) -> Recipe:
    from llmdeploy.recipe import load_recipe

    if namespace:
        overrides = (*overrides, f"target.namespace={namespace}")
    return load_recipe(recipe_path, overrides)


def _kube_target(recipe: Recipe, verb: str) -> KubernetesTarget:
    if not isinstance(recipe.target, KubernetesTarget):
        raise UserError.one(
            f"`llmdeploy {verb}` works on kubernetes targets; this recipe's target is {recipe.target.type!r}",
            path="target.type",
            value=recipe.target.type,
            fix="set target.type: kubernetes (and target.namespace) in the recipe",
        )
    return recipe.target


def _rendered(recipe: Recipe, show_plan: bool = False) -> tuple[list[dict[str, Any]], Any]:
    """Rendered Kubernetes objects (apply order) and the capacity the plan promises."""
    from llmdeploy.apply.capacity import capacity_from_plan
    from llmdeploy.planner import make_plan
    from llmdeploy.render import render

    plan = make_plan(recipe)
    if show_plan:
        _echo(plan.to_table())
        if not plan.fits:
            _echo("warning: the memory plan does not fit: " + "; ".join(plan.problems))
    artifacts = render(recipe, plan)
    return [dict(o) for o in artifacts.kubernetes_objects], capacity_from_plan(recipe, plan)


def _instance(recipe: Recipe, verb: str) -> Any:
    from llmdeploy.apply.kubernetes import Instance

    return Instance(recipe.name, _kube_target(recipe, verb).namespace)


def _on_target(
    recipe: Recipe,
    verb: str,
    cluster: tuple[Path | None, str | None],
    local: Callable[[ModuleType], int],
    docker: Callable[[ModuleType], int],
    kubernetes: Callable[[ModuleType, Any, Any], int],
) -> NoReturn:
    """Run `verb` on the recipe's target and exit with its code. Each branch gets its apply module,
    imported only for that target (the Kubernetes client alone takes most of a second to import);
    the Kubernetes branch also a client connected through `cluster` (kubeconfig, context) and the
    recipe's instance."""
    if recipe.target.type == "local":
        sys.exit(local(importlib.import_module("llmdeploy.apply.local")))
    if recipe.target.type == "docker":
        sys.exit(docker(importlib.import_module("llmdeploy.apply.docker")))
    kube = importlib.import_module("llmdeploy.apply.kube_target")
    instance = _instance(recipe, verb)
    with kube.connect(*cluster) as client:
        sys.exit(kubernetes(kube, client, instance))


def _stop(
    recipe: Recipe, verb: str, cluster: tuple[Path | None, str | None], assume_yes: bool, dry_run: bool
) -> NoReturn:
    """`down` and `delete`: stop the local process or the Compose project, or delete the Kubernetes objects."""
    _on_target(
        recipe,
        verb,
        cluster,
        lambda local: local.down_local(recipe),
        lambda docker: docker.down_docker(recipe, _out),
        lambda kube, client, instance: kube.delete_kubernetes(
            client, instance, terminal_confirm(assume_yes, default=False), _echo, dry_run=dry_run
        ),
    )


recipe_arg = click.argument(
    "recipe_path", metavar="RECIPE", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
set_opt = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a recipe field, e.g. --set limits.max_num_seqs=64.",
)
kubeconfig_opt = click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Kubeconfig file (default: the files of $KUBECONFIG merged, else ~/.kube/config, else the pod's service account).",
)
context_opt = click.option("--context", default=None, help="Kubeconfig context (default: current-context).")
namespace_opt = click.option("--namespace", "-n", default=None, help="Override target.namespace.")


@click.command()
@recipe_arg
@set_opt
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Apply without asking.")
@click.option(
    "--dry-run", is_flag=True, help="Validate on the server (dryRun=All) and show changes; persist nothing."
)
@click.option("--force-conflicts", is_flag=True, help="Take over fields another field manager owns.")
@click.option(
    "--prune/--no-prune",
    default=True,
    show_default=True,
    help="Delete this recipe's objects that are no longer rendered.",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for Deployments to be Available (docker: for the healthcheck, then smoke-test).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=600.0,
    show_default=True,
    help="Rollout wait limit in seconds.",
)
@kubeconfig_opt
@context_opt
@namespace_opt
def apply_command(
    recipe_path: Path,
    overrides: tuple[str, ...],
    assume_yes: bool,
    dry_run: bool,
    force_conflicts: bool,
    prune: bool,
    wait: bool,
    timeout_s: float,
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Bring the recipe's deployment to the rendered state (local process, Docker Compose or Kubernetes)."""
    recipe = _load(recipe_path, overrides, namespace)
    if recipe.target.type == "local":
        if dry_run:
            raise UserError.one(
                "--dry-run is for kubernetes targets; a local apply cannot be rehearsed",
                path="target.type",
                value="local",
                fix=f"see what would run with `llmdeploy render {recipe_path}` or `llmdeploy plan {recipe_path}`",
            )
        from llmdeploy.apply.local import apply_local

        sys.exit(apply_local(recipe, recipe_path, assume_yes))
    if recipe.target.type == "docker":
        if dry_run:
            raise UserError.one(
                "--dry-run is for kubernetes targets",
                path="target.type",
                value="docker",
                fix=f"see the Compose file with `llmdeploy render {recipe_path} -o DIR`",
            )
        from llmdeploy.apply.docker import apply_docker

        sys.exit(apply_docker(recipe, recipe_path, wait, _echo))
    from llmdeploy.apply.kube_target import ApplyOptions, apply_kubernetes, connect

    instance = _instance(recipe, "apply")
    objects, capacity = _rendered(recipe, show_plan=True)
    options = ApplyOptions(
        dry_run=dry_run, force_conflicts=force_conflicts, prune=prune, wait=wait, timeout_s=timeout_s
    )
    with connect(kubeconfig, context) as client:
        sys.exit(
            apply_kubernetes(
                client,
                instance,
                objects,
                capacity,
                options,
                terminal_confirm(assume_yes, default=False),
                _echo,
            )
        )


@click.command()
@recipe_arg
@set_opt
@click.option("--prune/--no-prune", default=True, show_default=True, help="Show objects apply would prune.")
@kubeconfig_opt
@context_opt
@namespace_opt
def diff_command(
    recipe_path: Path,
    overrides: tuple[str, ...],
    prune: bool,
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Show what `apply` would change on the cluster, field by field, and the capacity change.

    Exits 0 when nothing would change, 1 when something would.
    """
    from llmdeploy.apply.kube_target import connect, diff_kubernetes

    recipe = _load(recipe_path, overrides, namespace)
    instance = _instance(recipe, "diff")
    objects, capacity = _rendered(recipe)
    with connect(kubeconfig, context) as client:
        sys.exit(diff_kubernetes(client, instance, objects, capacity, _out, prune=prune))


@click.command()
@recipe_arg
@set_opt
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Delete without asking.")
@click.option("--dry-run", is_flag=True, help="Show what would be deleted (server side); delete nothing.")
@kubeconfig_opt
@context_opt
@namespace_opt
def delete_command(
    recipe_path: Path,
    overrides: tuple[str, ...],
    assume_yes: bool,
    dry_run: bool,
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Delete every object of this recipe (labelled with its instance and managed by llmdeploy)."""
    _stop(_load(recipe_path, overrides, namespace), "delete", (kubeconfig, context), assume_yes, dry_run)


@click.command()
@recipe_arg
@set_opt
@kubeconfig_opt
@context_opt
@namespace_opt
def status_command(
    recipe_path: Path,
    overrides: tuple[str, ...],
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Show whether the recipe's deployment is up (exit 0) or not (exit 1)."""
    recipe = _load(recipe_path, overrides, namespace)
    _on_target(
        recipe,
        "status",
        (kubeconfig, context),
        lambda local: local.status_local(recipe),
        lambda docker: docker.status_docker(recipe, _out),
        lambda kube, client, instance: kube.status_kubernetes(client, instance, _out),
    )


@click.command()
@recipe_arg
@set_opt
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines.")
@click.option("--lines", "-n", "lines", type=int, default=100, show_default=True, help="Lines from the end.")
@kubeconfig_opt
@context_opt
@click.option("--namespace", default=None, help="Override target.namespace.")
def logs_command(
    recipe_path: Path,
    overrides: tuple[str, ...],
    follow: bool,
    lines: int,
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Print the engine's log (local process, the Compose service, or the deployment's pods)."""
    recipe = _load(recipe_path, overrides, namespace)
    _on_target(
        recipe,
        "logs",
        (kubeconfig, context),
        lambda local: local.logs_local(recipe, follow, lines),
        lambda docker: docker.logs_docker(recipe, follow, lines, _out),
        lambda kube, client, instance: kube.logs_kubernetes(client, instance, follow, lines, _out),
    )


@click.command()
@recipe_arg
@set_opt
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Delete without asking (kubernetes).")
@kubeconfig_opt
@context_opt
@namespace_opt
def down_command(
    recipe_path: Path,
    overrides: tuple[str, ...],
    assume_yes: bool,
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
) -> None:
    """Stop the recipe's deployment: the local process, `docker compose down`, or delete its Kubernetes objects."""
    _stop(_load(recipe_path, overrides, namespace), "down", (kubeconfig, context), assume_yes, dry_run=False)
