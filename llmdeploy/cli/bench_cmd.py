"""`llmdeploy bench`: load-test an endpoint, print the curve as it fills, write JSON / PNG / llm-d
reports, exit 1 when an SLO is missed; `llmdeploy bench compare` gates a pipeline on two reports."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click
import httpx

from llmdeploy.cli.endpoint_args import endpoint_options, first_served_model, resolve_endpoint
from llmdeploy.engines import get_engine
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe

if TYPE_CHECKING:
    from llmdeploy.bench.llmd_report import StackFacts

_EPILOG = """\b
Compare two --output-json reports (exit 1 when a figure regresses past the bound):
  llmdeploy bench compare BASE.json NEW.json --max-regression 5%
"""


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


def _rates(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> tuple[float, ...] | None:
    if not values:
        return None
    try:
        rates = tuple(float(v) for value in values for v in value.split(",") if v.strip())
    except ValueError as e:
        raise click.BadParameter("a comma-separated list of requests per second, e.g. 1,2,4") from e
    if not rates or not all(0 < r < float("inf") for r in rates):
        raise click.BadParameter("request rates must be positive and finite")
    return rates


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


def _num_gpus(recipe: Recipe | None) -> int | None:
    """GPUs behind the endpoint, for per-GPU throughput: only a GPU recipe knows them."""
    if recipe is None or recipe.hardware.device == "cpu":
        return None
    p = recipe.parallelism
    return p.tensor * p.pipeline * p.replicas


def _stack_facts(recipe: Recipe | None, url: str) -> StackFacts:
    """The recipe, its plan's capacity and the capacity the engine reports on /metrics, where known."""
    from llmdeploy.bench.llmd_report import StackFacts
    from llmdeploy.smoke.kv_capacity import capacity_from_metrics

    planned_tokens = planned_concurrency = None
    if recipe is not None:
        from llmdeploy.planner import make_plan

        plan = make_plan(recipe)
        planned_tokens, planned_concurrency = plan.kv_cache_tokens, round(plan.max_concurrency, 2)
    try:
        response = httpx.get(url + "/metrics", timeout=10.0)
        actual = capacity_from_metrics(response.text) if response.status_code == 200 else None
    except httpx.HTTPError:
        actual = None
    return StackFacts(
        recipe,
        planned_tokens,
        planned_concurrency,
        None if actual is None else actual.tokens,
        None if actual is None else actual.source,
    )


def _ignore_eos(flag: object, recipe: Recipe | None) -> bool | None:
    """TGI has no ignore_eos: a TGI recipe does not send it unless --ignore-eos says so."""
    if flag is None and recipe is not None and not get_engine(recipe.engine.type).accepts_ignore_eos:
        return False
    return flag if isinstance(flag, bool) else None


class _BenchCommand(click.Command):
    """`bench [RECIPE] [OPTIONS]` runs a benchmark; `bench compare BASE NEW` hands over to `compare`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args[:1] == ["compare"]:
            ctx.meta["bench_compare_args"] = args[1:]
            return []
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        if "bench_compare_args" in ctx.meta:
            with compare_command.make_context(
                "bench compare", ctx.meta["bench_compare_args"], parent=ctx.parent
            ) as sub:
                return compare_command.invoke(sub)
        return super().invoke(ctx)


@click.command("compare")
@click.argument("base", type=click.Path(exists=True, dir_okay=False))
@click.argument("new", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--max-regression",
    default="5%",
    show_default=True,
    help="Largest tolerated move the worse way, per figure (higher TTFT/TPOT/ITL/E2EL, lower tok/s).",
)
def compare_command(base: str, new: str, max_regression: str) -> None:
    """Compare two `bench --output-json` reports point by point; exit 1 when a figure regresses past the bound."""
    from llmdeploy.bench.compare import compare_reports, format_comparison, load_report, parse_bound

    bound = parse_bound(max_regression)
    changes, notes = compare_reports(load_report(base), load_report(new), bound)
    click.echo(format_comparison(changes, notes, bound))
    if not changes:
        raise UserError.one(
            "the reports share no sweep point", file=new, fix="compare runs of the same sweep"
        )
    if any(c.regressed for c in changes):
        sys.exit(1)


@click.command("bench", cls=_BenchCommand, epilog=_EPILOG)
@endpoint_options
@click.option("--num-requests", type=int, help="Measured requests per sweep point (recipe default 64).")
@click.option(
    "--concurrency", multiple=True, callback=_levels, help="Levels to sweep, e.g. 1,4,16 (default 1,8)."
)
@click.option(
    "--request-rate",
    multiple=True,
    callback=_rates,
    help="Poisson arrivals per second (seeded), a sweep e.g. 1,2,4; concurrency caps in-flight.",
)
@click.option("--input-len", callback=_length, help="Prompt tokens: N or MIN:MAX uniform (default 128).")
@click.option("--output-len", callback=_length, help="Output tokens: N or MIN:MAX uniform (default 128).")
@click.option(
    "--dataset",
    type=click.Path(exists=True, dir_okay=False),
    help='JSONL file: {"prompt": ..., "output_len": ...} or ShareGPT {"conversations": [...]} a line.',
)
@click.option(
    "--workload",
    type=click.Choice(["random", "shared-prefix", "multi-turn"]),
    help="Generated requests when no --dataset: random lengths (default), N prefixes x M suffixes, "
    "or multi-turn chat sessions resending their history.",
)
@click.option("--num-prefixes", type=int, help="shared-prefix: N prefixes (default 4).")
@click.option("--suffixes-per-prefix", type=int, help="shared-prefix: M suffixes per prefix (default 8).")
@click.option("--prefix-len", type=int, help="shared-prefix: tokens per prefix (default 256).")
@click.option("--num-turns", type=int, help="multi-turn: user turns per session (default 4).")
@click.option("--ignore-eos/--no-ignore-eos", default=None, help="Send ignore_eos (vLLM, built-in engine).")
@click.option("--warmup-requests", type=int, help="Unmeasured requests sent first (default 2).")
@click.option("--seed", type=int, help="Seed for prompts and arrivals (default 0).")
@click.option(
    "--endpoint",
    "endpoint_kind",
    type=click.Choice(["completions", "chat"]),
    help="OpenAI route: /v1/completions (default) or /v1/chat/completions (default for multi-turn).",
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
    "--report",
    "report_kind",
    type=click.Choice(["llmd"]),
    help="Also write llm-d's benchmark report v0.2, one JSON file per sweep point (see --report-dir).",
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False),
    default=".",
    show_default=True,
    help="Folder for --report files.",
)
@click.option(
    "--chart",
    type=click.Path(dir_okay=False),
    help="Write a PNG: the Pareto chart (tok/s per user vs tok/s), latency and throughput per point.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
def bench_command(**kw: object) -> None:
    """Benchmark an endpoint over a sweep of concurrency levels and request rates (metrics as `vllm
    bench serve` defines them); each point's row prints as it finishes."""
    from llmdeploy.bench import BenchOptions, bench
    from llmdeploy.bench.chart import write_chart
    from llmdeploy.bench.curve import CurveTable
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
            request_rates=kw["request_rate"],
            input_len=kw["input_len"],
            output_len=kw["output_len"],
            override_dataset_output_len=kw["output_len"] is not None,
            dataset=kw["dataset"],
            workload=kw["workload"],
            num_prefixes=kw["num_prefixes"],
            suffixes_per_prefix=kw["suffixes_per_prefix"],
            prefix_len=kw["prefix_len"],
            num_turns=kw["num_turns"],
            ignore_eos=_ignore_eos(kw["ignore_eos"], endpoint.recipe),
            warmup_requests=kw["warmup_requests"],
            seed=kw["seed"],
            endpoint=kw["endpoint_kind"] or ("chat" if kw["workload"] == "multi-turn" else None),
            request_timeout_s=kw["request_timeout_s"],
            api_key=endpoint.api_key,
            slo=slo,
        )
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise UserError.one(f"bad benchmark option: {e}", fix="see llmdeploy bench --help") from e
    model = endpoint.model or first_served_model(endpoint.url, endpoint.api_key)
    if endpoint.model is None:
        click.echo(f"model: {model} (first served)", err=True)
    num_gpus = _num_gpus(endpoint.recipe)
    curve = CurveTable(num_gpus)
    click.echo(curve.header())
    report = bench(
        endpoint.url,
        model,
        options,
        progress=not kw["no_progress"],
        progress_stream=sys.stderr,
        on_point=lambda level: click.echo(curve.row(level)),
        num_gpus=num_gpus,
    )
    click.echo()
    click.echo(format_table(report))
    if kw["output_json"]:
        Path(str(kw["output_json"])).write_text(report.to_json_text(), encoding="utf-8")
    if kw["chart"]:
        write_chart(report, str(kw["chart"]))
    if kw["report_kind"] == "llmd":
        from llmdeploy.bench.llmd_report import write_llmd_reports

        facts = _stack_facts(endpoint.recipe, endpoint.url)
        for path in write_llmd_reports(report, facts, str(kw["report_dir"])):
            click.echo(f"wrote {path}", err=True)
    if not report.passed:
        # sys.exit, not ctx.exit: main() runs click with standalone_mode=False, which drops Exit's code
        sys.exit(1)
