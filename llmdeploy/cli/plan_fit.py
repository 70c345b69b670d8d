"""`llmdeploy plan --fit` and `plan --calibration`: the parts of `plan` beyond one memory budget."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from llmdeploy.errors import UserError
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import PlanInputs

if TYPE_CHECKING:  # the recipe's pydantic models cost ~0.3 s to import; `plan --model` needs none
    from llmdeploy.recipe.schema import Recipe

T = TypeVar("T")


@dataclass(frozen=True)
class FitFlags:
    """The --fit options as given on the command line (None: take the recipe's limits.target_*)."""

    gpus: tuple[str, ...]
    max_model_len: int | None
    target_concurrency: int | None
    target_context: int | None
    requests_per_s: float | None
    input_tokens: int | None
    output_tokens: int | None
    p99_tpot_ms: float | None
    p99_ttft_ms: float | None
    prices: Path | None
    limit: int | None


def _either(flag: T | None, recipe_value: T | None) -> T | None:
    return flag if flag is not None else recipe_value


def recipe_fit_inputs(recipe: Recipe) -> PlanInputs:
    """The recipe's model and engine settings; the GPU is left to --fit to choose."""
    from llmdeploy.planner.plan import recipe_inputs

    if recipe.hardware.device != "cuda":
        raise UserError.one(
            "plan --fit sizes GPU deployments",
            path="hardware.device",
            value=recipe.hardware.device,
            fix="set hardware.device: cuda (or drop --fit for a CPU plan)",
        )
    if recipe.hardware.gpu is None and recipe.hardware.gpu_memory_gib is None:
        # any catalog GPU: --fit replaces it with each candidate
        recipe = recipe.model_copy(
            update={"hardware": recipe.hardware.model_copy(update={"gpu": "H100-SXM"})}
        )
    return recipe_inputs(recipe)


def run_fit(base: PlanInputs, flags: FitFlags, recipe: Recipe | None, output: str) -> None:
    from llmdeploy.catalog.gpus import list_gpus, resolve_gpu
    from llmdeploy.catalog.prices import load_prices
    from llmdeploy.planner.fit import FitTarget, fit, render_table

    limits = recipe.limits if recipe is not None else None

    def from_recipe(field: str) -> Any:
        return getattr(limits, field) if limits is not None else None

    # a target kind given on the command line replaces the recipe's target altogether
    flag_target = flags.target_concurrency is not None or flags.requests_per_s is not None
    concurrency = flags.target_concurrency if flag_target else from_recipe("target_concurrency")
    rate = flags.requests_per_s if flag_target else from_recipe("target_requests_per_s")
    if concurrency is None and rate is None:
        raise UserError.one(
            "plan --fit needs a target",
            path="limits.target_concurrency",
            fix="add --target-concurrency N, or --requests-per-s R --input-len I --output-len O "
            "(or set limits.target_concurrency / limits.target_requests_per_s in the recipe)",
        )
    by_rate = rate is not None
    target = FitTarget(
        max_model_len=flags.max_model_len
        or from_recipe("max_model_len")
        or base.spec.max_position_embeddings,
        concurrency=concurrency,
        context_tokens=_either(flags.target_context, from_recipe("target_context")),
        requests_per_s=rate,
        input_tokens=_either(flags.input_tokens, from_recipe("target_input_tokens")) if by_rate else None,
        output_tokens=_either(flags.output_tokens, from_recipe("target_output_tokens")) if by_rate else None,
        p99_tpot_ms=_either(flags.p99_tpot_ms, from_recipe("target_p99_tpot_ms")),
        p99_ttft_ms=_either(flags.p99_ttft_ms, from_recipe("target_p99_ttft_ms")),
    )
    gpus = [resolve_gpu(n) for n in flags.gpus] if flags.gpus else list(list_gpus())
    result = fit(base, target, gpus, load_prices(flags.prices))
    if output == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(render_table(result, flags.limit))


def show_plan(inputs: PlanInputs, plan: MemoryPlan, calibration: Path | None, output: str) -> None:
    """Print the plan, or the calibrated plan when `calibration` holds a record of these settings."""
    from llmdeploy.planner.calibration import calibrate, read_calibration

    calibrated = None
    if calibration is not None:
        calibrated = calibrate(inputs, plan, read_calibration(calibration), str(calibration))
    if calibrated is not None:
        text = json.dumps(calibrated.to_json(), indent=2) if output == "json" else calibrated.to_table()
    else:
        text = json.dumps(plan.to_json(), indent=2) if output == "json" else plan.to_table()
        if calibration is not None and output != "json":
            text += f"\n  calibration: no record in {calibration} matches these settings (modeled figures)"
    click.echo(text)
