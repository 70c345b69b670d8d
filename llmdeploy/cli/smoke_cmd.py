"""`llmdeploy smoke`: check a running endpoint; exit 1 with one line per failed check."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llmdeploy.cli.endpoint_args import endpoint_options, resolve_endpoint

if TYPE_CHECKING:
    from llmdeploy.recipe.schema import Recipe
    from llmdeploy.smoke.report import SmokeReport


@click.command("smoke")
@endpoint_options
@click.option(
    "--startup-timeout",
    "startup_timeout_s",
    type=float,
    help="Seconds to wait for /health (default: recipe's, else 60).",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False),
    help="Engine start-up log to read the KV cache size from (default: a local apply's log).",
)
@click.option(
    "--kv-tolerance",
    type=float,
    help="Warn when actual KV tokens differ from the plan by more (default 0.10).",
)
@click.option("--output-json", type=click.Path(dir_okay=False), help="Also write the report as JSON.")
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Record the measured KV capacity next to the plan's in this file (see `plan --calibration`).",
)
def smoke_command(
    recipe_path: str | None,
    url: str | None,
    model: str | None,
    api_key: str | None,
    overrides: tuple[str, ...],
    startup_timeout_s: float | None,
    log_file: str | None,
    kv_tolerance: float | None,
    output_json: str | None,
    calibration: Path | None,
) -> None:
    """Smoke-test an endpoint: health, models, chat, streaming, recipe prompts, TGI client, KV vs plan."""
    from llmdeploy.smoke import smoke

    endpoint = resolve_endpoint(recipe_path, url, model, api_key, overrides)
    if calibration is not None and endpoint.recipe is None:
        raise click.UsageError(
            "--calibration needs a RECIPE: a measurement is filed under the recipe's settings"
        )
    if log_file is None and endpoint.recipe is not None:
        from llmdeploy.targets import get_target

        # a target that keeps the engine's start-up log here: a KV figure for engines without one on /metrics
        log_file = get_target(endpoint.recipe.target.type).startup_log(endpoint.recipe)
    report = smoke(
        endpoint.url,
        model=endpoint.model,
        recipe=endpoint.recipe,
        api_key=endpoint.api_key,
        startup_timeout_s=startup_timeout_s,
        log_file=log_file,
        kv_tolerance=kv_tolerance,
        progress_stream=sys.stderr,
    )
    click.echo(report.render())
    if calibration is not None and endpoint.recipe is not None:
        _record_calibration(endpoint.recipe, report, calibration)
    if output_json:
        Path(output_json).write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    if not report.ok:
        # sys.exit, not ctx.exit: main() runs click with standalone_mode=False, which drops Exit's code
        sys.exit(1)


def _record_calibration(recipe: Recipe, report: SmokeReport, path: Path) -> None:
    from llmdeploy.planner.calibration import new_record, record_measurement
    from llmdeploy.planner.plan import plan_from_inputs, recipe_inputs

    actual = report.kv.actual if report.kv is not None else None
    if actual is None:
        click.echo(f"calibration: the engine reported no KV cache size; nothing recorded in {path}", err=True)
        return
    inputs = recipe_inputs(recipe)
    record = new_record(inputs, plan_from_inputs(inputs), actual.tokens, actual.source)
    records = record_measurement(path, record)
    click.echo(
        f"calibration: recorded {record.actual_kv_cache_tokens:,} KV tokens (plan {record.predicted_kv_cache_tokens:,}, "
        f"{record.gap_fraction:+.1%}) in {path} ({len(records)} record{'s' if len(records) != 1 else ''})",
        err=True,
    )
