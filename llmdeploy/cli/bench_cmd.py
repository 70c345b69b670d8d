"""`llmdeploy bench`: load-test an endpoint, print a table, write JSON/PNG, exit 1 when an SLO is missed."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from llmdeploy.cli.endpoint_args import endpoint_options, first_served_model, resolve_endpoint
from llmdeploy.engines import get_engine
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe


def _levels(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...] | None:
    if not values:
        return None
    try:
        levels = tuple(int(v) for value in values for v in value.split(",") if v.strip())
    except ValueError as e:
        raise click.BadParameter("a comma-separated list of integers, e.g. 1,4,16") from e
    if not levels or min(levels) < 1:
        raise click.BadParameter("concurrency levels must be at least 1")
    return levels


def _length(_: click.Context, __: click.Parameter, value: str | None) -> object:
    if value is None:
        return None
    from llmdeploy.bench import LengthSpec

    try:
        return LengthSpec.parse(value)
    except ValueError as e:
        raise click.BadParameter(f"want N or MIN:MAX with 1 <= MIN <= MAX ({e})") from e


F = TypeVar("F", bound=Callable[..., object])

_SLO_FLAGS = (
    "p99_ttft_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "p99_e2el_ms",
    "min_output_tok_s",
    "max_failed_fraction",
)


def _slo_options(command: F) -> F:
    for name in reversed(_SLO_FLAGS):
        flag = "--slo-" + name.replace("_", "-")
        command = click.option(flag, name, type=float, help=f"SLO {name} (overrides the recipe's).")(command)
    return command


def _ignore_eos(flag: object, recipe: Recipe | None) -> bool | None:
    """TGI has no ignore_eos: a TGI recipe does not send it unless --ignore-eos says so."""
    if flag is None and recipe is not None and not get_engine(recipe.engine.type).accepts_ignore_eos:
        return False
    return flag if isinstance(flag, bool) else None


@click.command("bench")
@endpoint_options
@click.option("--num-requests", type=int, help="Measured requests per concurrency level (recipe default 64).")
@click.option(
    "--concurrency", multiple=True, callback=_levels, help="Levels to sweep, e.g. 1,4,16 (default 1,8)."
)
@click.option(
    "--request-rate", type=float, help="Poisson arrivals per second (seeded); concurrency caps in-flight."
)
@click.option("--input-len", callback=_length, help="Prompt tokens: N or MIN:MAX uniform (default 128).")
@click.option("--output-len", callback=_length, help="Output tokens: N or MIN:MAX uniform (default 128).")
@click.option(
    "--dataset",
    type=click.Path(exists=True, dir_okay=False),
    help='JSONL: {"prompt": ..., "output_len": ...}.',
)
@click.option("--ignore-eos/--no-ignore-eos", default=None, help="Send ignore_eos (vLLM, built-in engine).")
@click.option("--warmup-requests", type=int, help="Unmeasured requests sent first (default 2).")
@click.option("--seed", type=int, help="Seed for prompts and arrivals (default 0).")
@click.option(
    "--endpoint",
    "endpoint_kind",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
    help="OpenAI route: /v1/completions or /v1/chat/completions.",
)
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds per request.",
)
@_slo_options
@click.option("--output-json", type=click.Path(dir_okay=False), help="Write the report as JSON.")
@click.option(
    "--chart",
    type=click.Path(dir_okay=False),
    help="Write a PNG chart (latency and throughput vs concurrency).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
def bench_command(**kw: object) -> None:
    """Benchmark an endpoint at one or more concurrency levels (metrics as vLLM's serving benchmark)."""
    from llmdeploy.bench import BenchOptions, bench
    from llmdeploy.bench.chart import write_chart
    from llmdeploy.bench.report import format_table
    from llmdeploy.recipe.schema import BenchSection, SLOs

    if kw["chart"] and importlib.util.find_spec("matplotlib") is None:
        # checked before the run, so a missing extra does not waste a whole benchmark
        raise UserError.one(
            "--chart needs matplotlib, which is not installed", fix="pip install 'llmdeploy[chart]'"
        )
    endpoint = resolve_endpoint(kw["recipe_path"], kw["url"], kw["model"], kw["api_key"], kw["overrides"])  # type: ignore[arg-type]
    section = endpoint.recipe.bench if endpoint.recipe is not None else BenchSection()
    slo_updates = {name: kw[name] for name in _SLO_FLAGS if kw[name] is not None}
    try:
        slo = SLOs(**{**section.slo.model_dump(), **slo_updates})
        options = BenchOptions.from_section(
            section,
            num_requests=kw["num_requests"],
            concurrency=kw["concurrency"],
            request_rate=kw["request_rate"],
            input_len=kw["input_len"],
            output_len=kw["output_len"],
            dataset=kw["dataset"],
            ignore_eos=_ignore_eos(kw["ignore_eos"], endpoint.recipe),
            warmup_requests=kw["warmup_requests"],
            seed=kw["seed"],
            endpoint=kw["endpoint_kind"],
            request_timeout_s=kw["request_timeout_s"],
            api_key=endpoint.api_key,
            slo=slo,
        )
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise UserError.one(f"bad benchmark option: {e}", fix="see llmdeploy bench --help") from e
    model = endpoint.model or first_served_model(endpoint.url, endpoint.api_key)
    if endpoint.model is None:
        click.echo(f"model: {model} (first served)", err=True)
    report = bench(
        endpoint.url,
        model,
        options,
        progress=not kw["no_progress"],
        progress_stream=sys.stderr,
    )
    click.echo(format_table(report))
    if kw["output_json"]:
        Path(str(kw["output_json"])).write_text(report.to_json_text(), encoding="utf-8")
    if kw["chart"]:
        write_chart(report, str(kw["chart"]))
    if not report.passed:
        # sys.exit, not ctx.exit: main() runs click with standalone_mode=False, which drops Exit's code
        sys.exit(1)
