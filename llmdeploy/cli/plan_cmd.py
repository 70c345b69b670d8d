"""`llmdeploy plan`: the per-GPU memory budget of a recipe, of vLLM-style flags, or of a bare shape."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click
from llmdeploy_engine import facts as builtin_rule

from llmdeploy.catalog.gpus import GPUSpec
from llmdeploy.engines import ENGINES, get_engine
from llmdeploy.errors import UserError
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.planner.envelope import EnvelopeBudget

_QUANT = ["none", "awq", "gptq", "fp8", "int8", "int4", "bitsandbytes", "gguf"]
_KV = list(builtin_rule.KV_CACHE_DTYPES)


@click.command("plan")
@click.argument("recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE", help="Override a recipe field.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--model", help="Recipe-free mode: hub id, catalog name, checkpoint folder or GGUF file.")
@click.option(
    "--gpu",
    "gpu_names",
    multiple=True,
    help="GPU catalog name (e.g. H100, A100-80GB, RTX-4090); shape-only mode without it: the smallest that fits; "
    "with --fit, repeat it to limit the candidates.",
)
@click.option("--gpu-memory-gib", type=float, help="Memory per GPU as CUDA reports it, instead of --gpu.")
@click.option(
    "--gpu-memory-utilization",
    type=float,
    default=builtin_rule.DEFAULT_GPU_MEMORY_UTILIZATION,
    show_default=True,
)
@click.option("--max-model-len", type=int)
@click.option("--tensor-parallel-size", "-tp", type=int, default=1, show_default=True)
@click.option("--pipeline-parallel-size", "-pp", type=int, default=1, show_default=True)
@click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]), default="auto")
@click.option("--quantization", type=click.Choice(_QUANT), default="none")
@click.option("--kv-cache-dtype", type=click.Choice(_KV), default="auto")
@click.option("--block-size", type=int, default=builtin_rule.DEFAULT_BLOCK_SIZE, show_default=True)
@click.option("--max-num-batched-tokens", type=int)
@click.option("--max-num-seqs", type=int)
@click.option("--kv-cache-memory-gib", type=float, help="Explicit KV budget per GPU (or CPU).")
@click.option(
    "--mem-fraction-static",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="SGLang: its --mem-fraction-static as given (weights + KV pool share); default: derived.",
)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda")
@click.option("--engine", type=click.Choice(list(ENGINES)), default="vllm", show_default=True)
@click.option("--engine-version", help="Engine release (vLLM >= 0.21 counts CUDA graphs in the budget).")
@click.option("--params-b", type=float, help="Shape-only mode: parameters in billions.")
@click.option("--num-layers", type=int, help="Shape-only mode: decoder layers.")
@click.option("--num-kv-heads", type=int, help="Shape-only mode: KV heads.")
@click.option("--head-dim", type=int, help="Shape-only mode: head dimension.")
@click.option(
    "--weight-bytes", type=float, default=2.0, show_default=True, help="Shape-only mode: bytes/param."
)
@click.option(
    "--fit", is_flag=True, help="List every GPU type x TP x replicas that meets a target, cheapest first."
)
@click.option(
    "--target-concurrency", type=click.IntRange(1, 10**7), help="--fit: concurrent sequences to serve."
)
@click.option(
    "--target-context",
    type=click.IntRange(1, 2**31 - 1),
    help="--fit: tokens a sequence holds (default max-model-len).",
)
@click.option(
    "--requests-per-s", type=float, help="--fit: request rate to serve (with --input-len, --output-len)."
)
@click.option("--input-len", type=click.IntRange(1, 2**31 - 1), help="--fit: prompt tokens per request.")
@click.option("--output-len", type=click.IntRange(1, 2**31 - 1), help="--fit: output tokens per request.")
@click.option("--p99-tpot-ms", type=float, help="--fit: time-per-output-token limit, ms.")
@click.option("--p99-ttft-ms", type=float, help="--fit: time-to-first-token limit, ms.")
@click.option(
    "--prices",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="--fit: YAML/JSON mapping of GPU name to US dollars per GPU-hour (replaces the shipped figures).",
)
@click.option(
    "--top", "top", type=click.IntRange(1, 10**4), default=20, show_default=True, help="--fit: rows shown."
)
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False, path_type=Path),
    help="KV capacities measured by `smoke --calibration`: a matching record replaces the modeled figure.",
)
def plan_command(
    recipe: Path | None,
    overrides: tuple[str, ...],
    output: str,
    model: str | None,
    gpu_names: tuple[str, ...],
    gpu_memory_gib: float | None,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    dtype: str,
    quantization: str,
    kv_cache_dtype: str,
    block_size: int,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    kv_cache_memory_gib: float | None,
    mem_fraction_static: float | None,
    device: str,
    engine: str,
    engine_version: str | None,
    params_b: float | None,
    num_layers: int | None,
    num_kv_heads: int | None,
    head_dim: int | None,
    weight_bytes: float,
    fit: bool,
    target_concurrency: int | None,
    target_context: int | None,
    requests_per_s: float | None,
    input_len: int | None,
    output_len: int | None,
    p99_tpot_ms: float | None,
    p99_ttft_ms: float | None,
    prices: Path | None,
    top: int,
    calibration: Path | None,
) -> None:
    """Show the per-GPU memory budget: weights / activations / non-torch / graphs / KV / headroom.

    \b
    llmdeploy plan recipes/production.yaml [--set limits.max_model_len=32768] [--output json]
    llmdeploy plan --model meta-llama/Llama-3.1-8B-Instruct --gpu H100 --max-model-len 32768
    llmdeploy plan --params-b 70 --num-layers 80 --num-kv-heads 8 --head-dim 128 --weight-bytes 0.5 --gpu H100
    llmdeploy plan --fit --model meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768 --target-concurrency 64
    llmdeploy plan recipes/production.yaml --calibration calibration.yaml
    """
    from llmdeploy.catalog.gpus import resolve_gpu
    from llmdeploy.cli.plan_fit import FitFlags, recipe_fit_inputs, run_fit, show_plan
    from llmdeploy.memory.plan_inputs import PlanInputs
    from llmdeploy.planner.plan import plan_from_inputs, recipe_inputs

    takes_fraction = get_engine(engine).takes_mem_fraction_static
    if mem_fraction_static is not None and (not takes_fraction or model is None or fit):
        raise click.UsageError(
            "--mem-fraction-static is SGLang's knob: use it with --engine sglang and --model "
            "(in a recipe, put it in engine.extra_args)"
        )
    if len(gpu_names) > 1 and not fit:
        raise click.UsageError("--gpu names one GPU (repeat it only with --fit)")
    gpu = gpu_names[0] if gpu_names and not fit else None
    plan: MemoryPlan
    if recipe is not None and (model or params_b):
        raise click.UsageError("give a RECIPE or --model/--params-b flags, not both")
    if fit:
        if params_b is not None:
            raise click.UsageError("--fit needs a model (RECIPE or --model), not the shape-only flags")
        if recipe is None and model is None:
            raise click.UsageError("--fit needs a RECIPE or --model")
        flags = FitFlags(
            gpu_names,
            max_model_len,
            target_concurrency,
            target_context,
            requests_per_s,
            input_len,
            output_len,
            p99_tpot_ms,
            p99_ttft_ms,
            prices,
            top if output != "json" else None,
        )
        if recipe is not None:
            from llmdeploy.recipe import load_recipe

            loaded = load_recipe(recipe, overrides)
            run_fit(recipe_fit_inputs(loaded), flags, loaded, output)
        else:
            from llmdeploy.catalog.models import resolve_model

            base = PlanInputs(
                spec=resolve_model(model or ""),
                engine=engine,
                engine_version=engine_version,
                gpu_memory_utilization=gpu_memory_utilization,
                pipeline_parallel_size=pipeline_parallel_size,
                dtype=dtype,
                quantization=quantization,
                kv_cache_dtype=kv_cache_dtype,
                block_size=block_size,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
            )
            run_fit(base, flags, None, output)
        return
    if recipe is not None:
        from llmdeploy.recipe import load_recipe
        from llmdeploy.targets import get_target

        loaded_recipe = load_recipe(recipe, overrides)
        inputs = recipe_inputs(loaded_recipe)
        plan = plan_from_inputs(inputs)
        plan = replace(plan, notes=(*plan.notes, *get_target(loaded_recipe.target.type).notes(loaded_recipe)))
        show_plan(inputs, plan, calibration, output)
        if not plan.fits:
            # the memory gate every target shares: the plan is shown, and the recipe refused
            click.echo(
                "error: the memory plan does not fit (problems and fixes above); validate, render "
                "and apply refuse this recipe on every target",
                err=True,
            )
            sys.exit(2)
        return
    if params_b is not None:
        plan = _shape_only(
            params_b,
            num_layers,
            num_kv_heads,
            head_dim,
            weight_bytes,
            gpu,
            gpu_memory_gib,
            kv_cache_dtype,
            max_model_len,
            tensor_parallel_size,
        )
    elif model is not None:
        from llmdeploy.catalog.models import resolve_model

        if device == "cuda" and gpu is None and gpu_memory_gib is None:
            raise UserError.one("the plan needs the GPU", fix="add --gpu NAME or --gpu-memory-gib X")
        inputs = PlanInputs(
            spec=resolve_model(model),
            engine=engine,
            engine_version=engine_version,
            device=device,
            gpu=resolve_gpu(gpu) if gpu else None,
            gpu_memory_gib=gpu_memory_gib,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            dtype=dtype,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            kv_cache_memory_gib=kv_cache_memory_gib,
            mem_fraction_static=mem_fraction_static,
        )
        show_plan(inputs, plan_from_inputs(inputs), calibration, output)
        return
    else:
        raise click.UsageError(
            "give a RECIPE, or --model with --gpu, or the shape-only flags (--params-b ...)"
        )
    if output == "json":
        click.echo(json.dumps(plan.to_json(), indent=2))
    else:
        click.echo(plan.to_table())


def _shape_only(
    params_b: float,
    num_layers: int | None,
    num_kv_heads: int | None,
    head_dim: int | None,
    weight_bytes: float,
    gpu: str | None,
    gpu_memory_gib: float | None,
    kv_cache_dtype: str,
    max_model_len: int | None,
    tensor_parallel_size: int,
) -> MemoryPlan:
    from llmdeploy.catalog.gpus import resolve_gpu
    from llmdeploy.planner.envelope import GB, GIB, envelope_budget, envelope_plan

    missing = [
        f
        for f, v in (("--num-layers", num_layers), ("--num-kv-heads", num_kv_heads), ("--head-dim", head_dim))
        if v is None
    ]
    if missing:
        raise click.UsageError(f"shape-only mode also needs {', '.join(missing)}")
    assert num_layers is not None and num_kv_heads is not None and head_dim is not None

    def budget_on(memory_gb: float) -> EnvelopeBudget:
        return envelope_budget(
            params_b,
            num_layers,
            num_kv_heads,
            head_dim,
            memory_gb,
            weight_bytes,
            builtin_rule.kv_cache_dtype_bytes(kv_cache_dtype, 2),
            max_model_len or 8192,
            tensor_parallel_size,
        )

    note = None
    spec: GPUSpec | None
    if gpu is None and gpu_memory_gib is None:
        spec, note = _smallest_gpu(lambda g: budget_on(float(g.marketing_gb)), tensor_parallel_size)
    else:
        spec = resolve_gpu(gpu) if gpu else None
    # the rule of thumb uses the GPU's marketing size in decimal GB
    memory_gb = float(spec.marketing_gb) if spec else (gpu_memory_gib or 0.0) * GIB / GB
    name = f"shape-only {params_b:g}B ({num_layers} layers, {num_kv_heads} KV heads x {head_dim})"
    plan = envelope_plan(
        budget_on(memory_gb), name, spec.name if spec else f"{memory_gb:.1f} GB", tensor_parallel_size
    )
    return replace(plan, notes=(note, *plan.notes)) if note else plan


def _smallest_gpu(budget_on: Callable[[GPUSpec], EnvelopeBudget], tp: int) -> tuple[GPUSpec, str]:
    """No GPU given: the smallest catalog GPU on which the model and one full-length sequence fit."""
    from llmdeploy.catalog.gpus import list_gpus

    # NVIDIA only: the full planner refuses ROCm, so the envelope does not name an AMD GPU either
    gpus = sorted(
        (g for g in list_gpus() if g.vendor == "nvidia"), key=lambda g: (g.marketing_gb, g.memory_gib)
    )
    for gpu in gpus:
        budget = budget_on(gpu)
        if budget.fits:
            needed_gb = (
                budget.weights_gb + budget.overhead_gb + budget.kv_bytes_per_token * budget.context_len / 1e9
            )
            return gpu, (
                f"no --gpu given: sized on {gpu.name}, the smallest catalog GPU that holds the weights, "
                f"the overhead and one {budget.context_len:,}-token sequence ({needed_gb:.1f} GB per GPU "
                f"at TP {tp}); pass --gpu NAME or --gpu-memory-gib X for another"
            )
    largest = gpus[-1]
    return largest, (
        f"no --gpu given and no catalog GPU holds this at TP {tp}: shown on the largest, {largest.name}; "
        "raise --tensor-parallel-size or lower --weight-bytes"
    )
