"""Cross-field rules `validate` checks: the mistakes the schema alone cannot see.

Each rule returns problems naming the field to change and the values that would work. The facts
come from the catalog (model shape, GPU features) and the memory plan; nothing here guesses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Protocol

from llmdeploy.catalog import GPUSpec, ModelSpec, resolve_gpu, resolve_model
from llmdeploy.engines import get_engine
from llmdeploy.engines.recipe_rules import engine_support_problems, speculative_problems
from llmdeploy.errors import Problem, UserError
from llmdeploy.recipe.schema import LengthRange, Recipe

# vLLM's fp8 KV cache and FP8 Marlin (weight-only fp8) need Ampere or newer
MIN_FP8_STORAGE_CAPABILITY = 8.0


class PlanVerdict(Protocol):
    """What the rules read of the memory plan (`planner.MemoryPlan`, which is built from a recipe and
    so sits above this package)."""

    @property
    def fits(self) -> bool: ...
    @property
    def problems(self) -> tuple[str, ...]: ...
    @property
    def suggestions(self) -> tuple[str, ...]: ...
    @property
    def max_model_len(self) -> int: ...


def check_recipe(recipe: Recipe, plan: PlanVerdict) -> list[Problem]:
    """Every cross-field problem of `recipe`, plus the plan's own when it does not fit."""
    try:
        model = resolve_model(recipe.model)
    except UserError as e:
        return [_with_path(p, "model") for p in e.problems]
    gpu: GPUSpec | None = None
    if recipe.hardware.device == "cuda" and recipe.hardware.gpu:
        try:
            gpu = resolve_gpu(recipe.hardware.gpu)
        except UserError as e:
            return list(e.problems)
    problems = [
        *_parallelism(recipe, model),
        *_fp8(recipe, model, gpu),
        *(get_engine(recipe.engine.type).gpu_problems(recipe, model, gpu) if gpu is not None else ()),
        *_context(recipe, model, plan),
        *engine_support_problems(recipe, model),
        *speculative_problems(recipe, model),
    ]
    if not plan.fits:
        fix = "\n         or ".join(plan.suggestions) if plan.suggestions else None
        problems += [Problem(f"does not fit: {text}", fix=fix) for text in plan.problems] or [
            Problem("the memory plan does not fit", fix=fix)
        ]
    return problems


def recipe_notes(recipe: Recipe) -> list[str]:
    """Things worth knowing that are not errors (shown by `validate`, never failing it)."""
    return get_engine(recipe.engine.type).notes(recipe, _gpu_or_none(recipe))


def _gpu_or_none(recipe: Recipe) -> GPUSpec | None:
    if recipe.hardware.device != "cuda" or not recipe.hardware.gpu:
        return None
    try:
        return resolve_gpu(recipe.hardware.gpu)
    except UserError:
        return None


def _with_path(problem: Problem, path: str) -> Problem:
    if problem.path is not None:
        return problem
    return dataclasses.replace(problem, path=path)


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _parallelism(recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
    tp, pp = recipe.parallelism.tensor, recipe.parallelism.pipeline
    hw = recipe.hardware
    available = hw.gpus_per_node * hw.nodes
    heads, kv_heads = model.num_attention_heads, model.num_kv_heads
    if heads % tp:
        yield Problem(
            f"tensor parallelism {tp} does not divide the model's {heads} attention heads",
            path="parallelism.tensor",
            value=tp,
            has_value=True,
            fix=f"use one of: {', '.join(map(str, _divisors(heads, max(tp, available, 8))))}",
        )
    elif not model.is_mla and kv_heads % tp and tp % kv_heads:
        yield Problem(
            f"tensor parallelism {tp} and the model's {kv_heads} KV heads: one must divide the other",
            path="parallelism.tensor",
            value=tp,
            has_value=True,
            fix=f"use a divisor or a multiple of {kv_heads}",
        )
    if pp > model.num_layers:
        yield Problem(
            f"pipeline parallelism {pp} exceeds the model's {model.num_layers} layers",
            path="parallelism.pipeline",
            value=pp,
            has_value=True,
            fix=f"at most {model.num_layers}",
        )
    if hw.device == "cuda" and tp * pp > available:
        yield Problem(
            f"one replica needs tensor x pipeline = {tp} x {pp} = {tp * pp} GPUs, "
            f"but the hardware has gpus_per_node x nodes = {hw.gpus_per_node} x {hw.nodes} = {available}",
            path="parallelism",
            fix=f"raise hardware.gpus_per_node (or hardware.nodes) to give {tp * pp} GPUs, or lower the parallelism",
        )


def _fp8(recipe: Recipe, model: ModelSpec, gpu: GPUSpec | None) -> Iterator[Problem]:
    kv_fp8 = recipe.kv_cache.dtype.startswith("fp8")
    weights_fp8 = recipe.model.quantization == "fp8"
    if gpu is None or not (kv_fp8 or weights_fp8):
        return
    capability = float(gpu.compute_capability)
    if capability < MIN_FP8_STORAGE_CAPABILITY:
        what = "an fp8 KV cache" if kv_fp8 else "fp8 weights"
        yield Problem(
            f"{what} needs compute capability {MIN_FP8_STORAGE_CAPABILITY} or newer; "
            f"{gpu.name} is {gpu.compute_capability}",
            path="kv_cache.dtype" if kv_fp8 else "model.quantization",
            fix="use kv_cache.dtype auto / fp16, or a newer GPU",
        )
    if weights_fp8 and model.is_moe and not gpu.fp8_support:
        yield Problem(
            f"fp8 MoE weights need a GPU with fp8 support (compute capability 8.9+); {gpu.name} has none",
            path="model.quantization",
            fix="use an H100/L40S/RTX-4090-class GPU, or awq/gptq int4 weights",
        )


def derived_max_model_len(model: ModelSpec) -> int:
    """vLLM's derived context limit: max_position_embeddings, times the RoPE factor for scaling types
    that stretch it (llama3 and longrope already state the stretched length)."""
    length = model.max_position_embeddings
    scaling = dict(model.rope_scaling or {})
    kind = str(scaling.get("rope_type") or scaling.get("type") or "default")
    factor = float(scaling.get("factor", 1.0) or 1.0)
    if kind in ("default", "llama3", "longrope", "su", "mrope") or factor <= 1:
        return length
    if kind == "yarn" and "original_max_position_embeddings" in scaling:
        return int(scaling["original_max_position_embeddings"] * factor)
    return int(length * factor)


def _context(recipe: Recipe, model: ModelSpec, plan: PlanVerdict) -> Iterator[Problem]:
    limit = derived_max_model_len(model)
    wanted = recipe.limits.max_model_len
    if wanted is not None and wanted > limit:
        yield Problem(
            f"max_model_len {wanted:,} exceeds the model's context of {limit:,} tokens (max_position_embeddings)",
            path="limits.max_model_len",
            value=wanted,
            has_value=True,
            fix=f"set limits.max_model_len to at most {limit}",
        )
    context = wanted if wanted is not None else min(limit, plan.max_model_len or limit)
    longest = _longest(recipe.bench.input_len) + _longest(recipe.bench.output_len)
    # only a load shape the user wrote: the defaults should not fail a recipe that never benchmarks
    shaped = {"input_len", "output_len"} & recipe.bench.model_fields_set
    if shaped and longest > context:
        yield Problem(
            f"bench requests of up to {longest:,} tokens (input + output) exceed max_model_len {context:,}; "
            "the engine would reject them",
            path="bench",
            fix="shorten bench.input_len / bench.output_len, or raise limits.max_model_len",
        )
    for index, prompt in enumerate(recipe.smoke.prompts):
        if prompt.max_tokens >= context:
            yield Problem(
                f"max_tokens {prompt.max_tokens} leaves no room for the prompt in max_model_len {context}",
                path=f"smoke.prompts.{index}.max_tokens",
                value=prompt.max_tokens,
                has_value=True,
                fix="use far fewer tokens for a smoke reply, e.g. 32",
            )
    yield from get_engine(recipe.engine.type).length_problems(recipe, context)


def _longest(length: int | LengthRange) -> int:
    return length.max if isinstance(length, LengthRange) else length
