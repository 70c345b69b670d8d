"""`llmdeploy render RECIPE -o DIR`: write the launch files of the recipe's target (`-o -`: the
manifests as one YAML stream on stdout, for `| kubectl apply -f -`)."""

from __future__ import annotations

from pathlib import Path

import click

from llmdeploy.errors import UserError
from llmdeploy.render.artifacts import Artifacts
from llmdeploy.render.output_dir import write_artifacts
from llmdeploy.targets import render

# kustomize's own file only lists the manifests; in a stream for `kubectl apply -f -` it would fail
_NOT_A_MANIFEST = ("kustomization.yaml",)


@click.command(name="render")
@click.argument("recipe_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "output_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="folder to write into (stale files from an earlier render are removed; others kept); "
    "`-` prints the manifests as one YAML stream",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a recipe field, e.g. limits.max_model_len=4096",
)
def render_command(recipe_file: Path, output_dir: Path, overrides: tuple[str, ...]) -> None:
    """Render launch files (local script, Docker Compose, Kubernetes or a platform's objects) for RECIPE."""
    from llmdeploy.cli.locate import located
    from llmdeploy.planner import make_plan
    from llmdeploy.recipe.loader import load_layered

    loaded = load_layered(recipe_file, overrides)
    recipe = loaded.recipe
    with located(loaded, recipe_file):
        artifacts = render(recipe, make_plan(recipe))
    if str(output_dir) == "-":
        click.echo(yaml_stream(artifacts), nl=False)
        return
    result = write_artifacts(artifacts, output_dir)
    for name in artifacts.files:
        state = "unchanged" if name in result.unchanged else "written"
        click.echo(f"{state:9}  {output_dir / name}")
    for name in result.removed:
        click.echo(f"{'removed':9}  {output_dir / name}")
    click.echo(
        f"recipe {artifacts.recipe_name} sha256 {artifacts.recipe_sha256[:16]}: "
        f"{len(artifacts.files)} files in {output_dir}"
    )


def yaml_stream(artifacts: Artifacts) -> str:
    """The rendered manifests as one multi-document YAML stream, each headed by its file name."""
    other = [name for name in artifacts.files if not name.endswith((".yaml", ".yml"))]
    if other:
        raise UserError.one(
            f"`-o -` prints YAML manifests only; this target renders {', '.join(other)}",
            fix="render into a folder: -o DIR",
        )
    documents = []
    for name, text in artifacts.files.items():
        if name not in _NOT_A_MANIFEST:
            body = text.removeprefix("---\n")
            documents.append(f"---\n# Source: {name}\n{body}" + ("" if body.endswith("\n") else "\n"))
    return "".join(documents)
