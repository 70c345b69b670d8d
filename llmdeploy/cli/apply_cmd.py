"""`llmdeploy apply | diff | delete | status | logs | down RECIPE`.

The recipe's target (`llmdeploy.targets.get_target(recipe.target.type)`) does the work: a process
on this machine, a Docker Compose project, server-side apply against the cluster in the kubeconfig,
or a serving platform's objects. Each verb exits with the target's code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from llmdeploy.apply.prompt import terminal_confirm
from llmdeploy.cli.locate import located
from llmdeploy.recipe.schema import Recipe
from llmdeploy.targets.base import ApplyRequest, Cluster, Console

if TYPE_CHECKING:
    from llmdeploy.recipe.loader import LoadedRecipe


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def _out(msg: str) -> None:
    click.echo(msg)


def _console(assume_yes: bool = False) -> Console:
    return Console(echo=_echo, out=_out, confirm=terminal_confirm(assume_yes, default=False))


def _load(recipe_path: Path, overrides: tuple[str, ...], namespace: str | None = None) -> Recipe:
    return _load_layered(recipe_path, overrides, namespace).recipe


def _load_layered(
    recipe_path: Path, overrides: tuple[str, ...], namespace: str | None = None
) -> LoadedRecipe:
    from llmdeploy.recipe.loader import load_layered

    if namespace:
        overrides = (*overrides, f"target.namespace={namespace}")
    return load_layered(recipe_path, overrides)


def _stop(recipe: Recipe, verb: str, request: ApplyRequest) -> NoReturn:
    """`down` and `delete`: stop the local process or the Compose project, or delete the Kubernetes objects."""
    from llmdeploy.targets import get_target

    target = get_target(recipe.target.type)
    console = _console(request.assume_yes)
    sys.exit((target.down if verb == "down" else target.delete)(recipe, request, console))


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
    """Bring the recipe's deployment to the rendered state (local process, Docker Compose, Kubernetes
    or a serving platform)."""
    from llmdeploy.targets import apply, get_target

    loaded = _load_layered(recipe_path, overrides, namespace)
    recipe = loaded.recipe
    request = ApplyRequest(
        recipe_path=recipe_path,
        assume_yes=assume_yes,
        dry_run=dry_run,
        force_conflicts=force_conflicts,
        prune=prune,
        wait=wait,
        timeout_s=timeout_s,
        cluster=Cluster(kubeconfig, context),
    )
    if get_target(recipe.target.type).kubernetes_backed:
        _show_plan(recipe)
    with located(loaded, recipe_path):
        result = apply(recipe, request, _console(assume_yes))
    sys.exit(result.exit_code)


def _show_plan(recipe: Recipe) -> None:
    from llmdeploy.planner import make_plan

    _echo(make_plan(recipe).to_table())


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
    from llmdeploy.targets import checked_plan, get_target

    loaded = _load_layered(recipe_path, overrides, namespace)
    recipe = loaded.recipe
    request = ApplyRequest(recipe_path=recipe_path, prune=prune, cluster=Cluster(kubeconfig, context))
    with located(loaded, recipe_path):
        plan = checked_plan(recipe)
        code = get_target(recipe.target.type).diff(recipe, plan, request, _console())
    sys.exit(code)


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
    request = ApplyRequest(
        recipe_path=recipe_path, assume_yes=assume_yes, dry_run=dry_run, cluster=Cluster(kubeconfig, context)
    )
    _stop(_load(recipe_path, overrides, namespace), "delete", request)


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
    from llmdeploy.targets import get_target

    recipe = _load(recipe_path, overrides, namespace)
    sys.exit(get_target(recipe.target.type).status(recipe, Cluster(kubeconfig, context), _console()))


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
    from llmdeploy.targets import get_target

    recipe = _load(recipe_path, overrides, namespace)
    target = get_target(recipe.target.type)
    sys.exit(target.logs(recipe, Cluster(kubeconfig, context), follow, lines, _console()))


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
    request = ApplyRequest(
        recipe_path=recipe_path, assume_yes=assume_yes, cluster=Cluster(kubeconfig, context)
    )
    _stop(_load(recipe_path, overrides, namespace), "down", request)
