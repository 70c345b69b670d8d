"""`llmdeploy` entry point.

Each verb lives in its own module exposing click commands; `main` wires them together and turns
`UserError` into a readable list of problems and exit code 2 (a traceback only with --debug).
"""

from __future__ import annotations

import importlib
import sys

import click

from llmdeploy import __version__
from llmdeploy.errors import UserError

# module -> names of the click commands it defines
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "llmdeploy.cli.recipe_cmds": ("validate", "schema"),
    "llmdeploy.cli.plan_cmd": ("plan",),
    "llmdeploy.cli.models_cmd": ("models",),
    "llmdeploy.cli.render_cmd": ("render",),
    "llmdeploy.cli.apply_cmd": ("apply", "diff", "delete", "status", "logs", "down"),
    "llmdeploy.cli.smoke_cmd": ("smoke",),
    "llmdeploy.cli.bench_cmd": ("bench",),
    "llmdeploy.cli.serve_cmd": ("serve",),
}


class LazyGroup(click.Group):
    """Imports a verb's module only when that verb runs (or when help lists them all): the
    verbs' imports (pydantic models, Jinja2, HTTP clients) would otherwise cost every command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for names in COMMAND_MODULES.values() for name in names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module_name, names in COMMAND_MODULES.items():
            if cmd_name in names:
                module = importlib.import_module(module_name)
                command = getattr(module, cmd_name.replace("-", "_") + "_command")
                assert isinstance(command, click.Command)
                return command
        return None


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="llmdeploy")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Declarative LLM serving: validate, plan, render, apply, smoke-test and benchmark a recipe."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        rv = cli.main(args=argv, prog_name="llmdeploy", standalone_mode=False)
    except UserError as e:
        if debug:
            raise
        n = len(e.problems)
        click.echo(f"error: {n} problem{'s' if n != 1 else ''} found", err=True)
        for p in e.problems:
            click.echo("  " + p.render().replace("\n", "\n  "), err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    # Without standalone mode click hands back ctx.exit(n)'s code instead of exiting.
    if isinstance(rv, int) and not isinstance(rv, bool):
        sys.exit(rv)


if __name__ == "__main__":
    main()
