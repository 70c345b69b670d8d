"""`llmdeploy serve RECIPE | --model PATH [ENGINE FLAGS...]`: run the built-in engine in the foreground.

The toolkit never imports torch: this verb builds the engine's command line (from the recipe through
the same `engine_command` that `apply` and `render` use, or from --model and pass-through flags)
and replaces itself with `llmdeploy-engine serve ...`, so signals and the exit code are the engine's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import click

from llmdeploy.apply.prompt import terminal_confirm
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe

ENGINE_MODULE = "llmdeploy_engine.cli"


def engine_launcher(argv: list[str]) -> list[str]:
    """`llmdeploy-engine ...` as runnable here: the console script, else this Python's `-m` entry."""
    if argv and argv[0] == "llmdeploy-engine" and shutil.which("llmdeploy-engine") is None:
        return [sys.executable, "-m", ENGINE_MODULE, *argv[1:]]
    return argv


def recipe_command(recipe: Recipe, assume_yes: bool, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The built-in engine's argv and environment for `recipe` (model prepared, key taken from env)."""
    from llmdeploy.apply.model_source import prepare_model
    from llmdeploy.engines import get_engine
    from llmdeploy.planner import make_plan
    from llmdeploy.render.engine_command import engine_command

    if not get_engine(recipe.engine.type).bundled:
        raise UserError.one(
            "`llmdeploy serve` runs the built-in engine; this recipe asks for another engine",
            path="engine.type",
            value=recipe.engine.type,
            fix="use `llmdeploy apply RECIPE` for vllm and tgi recipes, or set engine.type: builtin",
        )
    plan = make_plan(recipe)
    prepared = prepare_model(
        recipe.model, terminal_confirm(assume_yes, default=True), lambda msg: click.echo(msg, err=True)
    )
    command = engine_command(recipe, plan, model_ref=prepared.ref)
    out_env = {**env, **command.env}
    for secret in command.secrets:
        if secret.from_env is None:
            raise UserError.one(
                f"{secret.name} comes from a Kubernetes Secret, which a local process cannot read",
                path="server.api_key",
                fix="use server.api_key: {env: VAR} for local serving",
            )
        if not env.get(secret.from_env):
            raise UserError.one(
                f"environment variable {secret.from_env} is not set",
                path="server.api_key.env",
                value=secret.from_env,
                fix=f"export {secret.from_env}=<key> before serving",
            )
        out_env[secret.name] = env[secret.from_env]
    return list(command.argv), out_env


@click.command(
    "serve",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("items", nargs=-1, type=click.UNPROCESSED, metavar="[RECIPE] [ENGINE FLAGS]...")
@click.option("--model", help="Serve this GGUF file / checkpoint folder / random:<id> without a recipe.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a recipe field.")
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Agree to preparing the model (installing it).")
@click.option("--dry-run", is_flag=True, help="Print the engine command instead of running it.")
def serve_command(
    items: tuple[str, ...],
    model: str | None,
    overrides: tuple[str, ...],
    assume_yes: bool,
    dry_run: bool,
) -> None:
    """Run the built-in engine in the foreground (Ctrl-C stops it).

    Give a RECIPE (engine.type: builtin), or --model PATH; flags after them are handed to
    `llmdeploy-engine serve` unchanged (see `llmdeploy-engine serve --help`), e.g.
    `llmdeploy serve --model model.gguf --kv-cache-memory-bytes 512M --port 8001`.
    """
    extra = list(items)
    recipe_path = None
    if extra and not extra[0].startswith("-"):
        recipe_path = Path(extra.pop(0))
    if (recipe_path is None) == (model is None):
        raise click.UsageError("give exactly one of RECIPE and --model")
    if recipe_path is not None:
        from llmdeploy.recipe import load_recipe

        recipe = load_recipe(recipe_path, overrides)
        argv, env = recipe_command(recipe, assume_yes, dict(os.environ))
        argv = [*argv, *extra]
    else:
        if overrides:
            raise click.UsageError("--set works on a recipe; with --model pass engine flags directly")
        argv = ["llmdeploy-engine", "serve", "--model", str(model), *extra]
        env = dict(os.environ)
    argv = engine_launcher(argv)
    if dry_run:
        click.echo(shlex.join(argv))
        return
    click.echo(f"==> {shlex.join(argv)}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)
