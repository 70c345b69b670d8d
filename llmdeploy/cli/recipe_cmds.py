"""`llmdeploy validate` and `llmdeploy schema`."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llmdeploy.cli.locate import locate
from llmdeploy.errors import Problem, UserError
from llmdeploy.recipe.json_schema import recipe_json_schema_text
from llmdeploy.recipe.loader import LoadedRecipe, load_layered

if TYPE_CHECKING:
    from llmdeploy.planner import MemoryPlan
    from llmdeploy.recipe import Recipe


@click.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="PATH=VALUE",
    help="Override a field, e.g. limits.max_model_len=8192.",
)
@click.option(
    "--schema-only", is_flag=True, help="Check the schema only; skip the memory-fit and cross-field rules."
)
@click.option(
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one document on stdout with every file's problems (exit code 2 still signals failure).",
)
def validate_command(
    paths: tuple[Path, ...], overrides: tuple[str, ...], schema_only: bool, output: str
) -> None:
    """Check recipes: schema, cross-field rules and memory fit. Exit code 2 on any problem."""
    results = [_validate_one(path, overrides, schema_only) for path in paths]
    problems = [p for r in results for p in r.problems]
    if output == "json":
        click.echo(json.dumps({"ok": not problems, "files": [r.to_json() for r in results]}, indent=2))
        if problems:
            sys.exit(2)  # main() ignores the return code click gives for Exit in non-standalone mode
        return
    for result in results:
        click.echo(result.line())
        for note in result.notes:
            click.echo(f"     note: {note}")
    if problems:
        raise UserError(problems)


@dataclasses.dataclass(frozen=True)
class FileResult:
    path: Path
    problems: list[Problem]
    summary: str | None = None
    notes: tuple[str, ...] = ()

    def line(self) -> str:
        if self.problems:
            n = len(self.problems)
            return f"FAIL {self.path} ({n} problem{'s' if n != 1 else ''})"
        return f"OK   {self.path} ({self.summary})"

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "ok": not self.problems,
            "summary": self.summary,
            "notes": list(self.notes),
            "problems": [_problem_json(p) for p in self.problems],
        }


def _problem_json(problem: Problem) -> dict[str, object]:
    fields = ("message", "file", "line", "path", "fix")
    out: dict[str, object] = {name: getattr(problem, name) for name in fields}
    if problem.has_value:
        out["value"] = (
            problem.value
            if isinstance(problem.value, str | int | float | bool | None)
            else repr(problem.value)
        )
    return out


def _validate_one(path: Path, overrides: tuple[str, ...], schema_only: bool) -> FileResult:
    try:
        loaded = load_layered(path, overrides)
    except UserError as e:
        return FileResult(path, e.problems)
    if schema_only:
        return FileResult(path, [], "schema only")
    try:
        summary, problems, notes = _check_rules(loaded)
    except UserError as e:
        return FileResult(path, [locate(p, loaded, path) for p in e.problems])
    if problems:
        return FileResult(path, [locate(p, loaded, path) for p in problems])
    return FileResult(path, [], summary, tuple(notes))


def _check_rules(loaded: LoadedRecipe) -> tuple[str, list[Problem], list[str]]:
    # imported here: `schema` and `validate --schema-only` need neither the catalog nor the planner
    from llmdeploy.planner import make_plan
    from llmdeploy.planner.recipe_checks import check_recipe, recipe_notes
    from llmdeploy.targets import get_target

    recipe = loaded.recipe
    plan = make_plan(recipe)
    problems = check_recipe(recipe, plan)
    problems += _engine_mapping_problems(recipe, plan, {p.path for p in problems})
    where = (
        recipe.hardware.gpu
        if recipe.hardware.device == "cuda" and recipe.hardware.gpu
        else recipe.hardware.device
    )
    summary = (
        f"{recipe.engine.type}, {recipe.model.id} on {where}: {plan.kv_cache_tokens:,} KV tokens, "
        f"{plan.max_concurrency:.1f}x concurrency at {plan.max_model_len:,}"
    )
    target_notes = get_target(recipe.target.type).notes(recipe)
    return summary, problems, [*plan.notes, *recipe_notes(recipe), *target_notes]


def _engine_mapping_problems(recipe: Recipe, plan: MemoryPlan, seen: set[str | None]) -> list[Problem]:
    """Every check `render` and `apply` make for the recipe's target (the engine's flag mapping,
    extra_args its CLI would reject, secrets and names the target cannot take), so a recipe that
    validates also renders."""
    from llmdeploy.targets import get_target, target_rule_problems

    problems = target_rule_problems(recipe, plan)
    if not problems:
        try:
            # nothing is written; what render refuses, validate refuses (the memory gate is check_recipe's)
            get_target(recipe.target.type).render(recipe, plan)
        except UserError as e:
            problems = e.problems
    return [p for p in problems if p.path is None or p.path not in seen]


@click.command("schema")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE instead of stdout."
)
def schema_command(output: Path | None) -> None:
    """Print the recipe JSON Schema (committed as schema/recipe.schema.json for editors)."""
    text = recipe_json_schema_text()
    if output is None:
        click.echo(text, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    click.echo(f"wrote {output}", err=True)
