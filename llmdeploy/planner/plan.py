"""`make_plan(recipe) -> MemoryPlan`, plus the concrete fixes offered when a plan does not fit."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import combinations
from typing import TYPE_CHECKING, Any

from llmdeploy.catalog.gpus import list_gpus
from llmdeploy.engines import get_engine
from llmdeploy.errors import UserError
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import PlanInputs

if TYPE_CHECKING:  # the recipe's pydantic models cost ~0.3 s to import; `plan --model` needs none
    from llmdeploy.recipe.schema import Recipe

_INT4_FROM = {"none", "fp8", "int8"}


def refuse_rocm(inputs: PlanInputs) -> None:
    """The memory rules are read from the engines' CUDA builds; on an AMD GPU (vLLM's ROCm build) the
    accounting differs where it matters (AITER kernels and their workspaces, HIP graphs, the ROCm
    caching allocator, its own sampler and attention backends), none of it read, so no plan is given."""
    gpu = inputs.gpu
    if gpu is not None and gpu.vendor != "nvidia":
        raise UserError.one(
            f"{gpu.name} is an AMD GPU: the planner's memory rules are the engines' CUDA builds' and "
            "were not derived for ROCm (AITER kernels, HIP graphs and the ROCm allocator account differently)",
            path="hardware.gpu",
            value=gpu.name,
            fix="plan an NVIDIA GPU of the same memory with hardware.gpu_memory_gib / --gpu-memory-gib "
            "(an estimate only), or set the KV cache size yourself (limits.kv_cache_memory_gib / --kv-cache-memory-gib)",
        )


def plan_for(inputs: PlanInputs) -> MemoryPlan:
    """The memory plan of `inputs` by its engine's own start-up accounting (no suggestions)."""
    refuse_rocm(inputs)
    plan = get_engine(inputs.engine).memory_plan(inputs)
    assert math.isfinite(plan.max_concurrency)
    return plan


def recipe_inputs(recipe: Recipe) -> PlanInputs:
    """What the memory model reads from `recipe`, as its engine reads it."""
    return get_engine(recipe.engine.type).plan_inputs(recipe)


def make_plan(recipe: Recipe) -> MemoryPlan:
    return plan_from_inputs(recipe_inputs(recipe))


def plan_from_inputs(inputs: PlanInputs) -> MemoryPlan:
    plan = plan_for(inputs)
    if inputs.draft is not None:
        draft = inputs.draft
        note = (
            f"speculative draft {draft.hf_id}: its weights are in weights_gib and its "
            f"{draft.num_layers} attention layers in kv_bytes_per_token (vLLM keeps them in the same KV pool)"
        )
        plan = replace(plan, notes=(*plan.notes, note))
    if plan.fits:
        return plan
    return replace(plan, suggestions=tuple(suggest_fixes(inputs, plan)))


def _outcome(plan: MemoryPlan) -> str:
    return (
        f"KV cache {plan.kv_cache_gib:.2f} GiB = {plan.kv_cache_tokens:,} tokens, "
        f"{plan.max_concurrency:.2f}x at {plan.max_model_len:,}"
    )


# A change is (what to tell the user, the PlanInputs fields it sets); each is re-planned and offered
# only when the plan then fits.
Change = tuple[str, dict[str, Any]]


def suggest_fixes(inputs: PlanInputs, plan: MemoryPlan) -> list[str]:
    """The changes after which the plan fits (each re-planned); single changes first, else pairs of
    them; when none fits, one line saying so and what was tried."""
    fixes = []
    context = _largest_context(inputs, plan)
    if context is not None:
        fixes.append(
            f"--max-model-len {context:,} (limits.max_model_len): the largest context the KV cache holds"
        )
    kinds = _change_kinds(inputs, plan)
    for kind in kinds:
        for label, fields in kind:
            result = plan_for(replace(inputs, **fields))
            if result.fits:
                fixes.append(f"{label}: {_outcome(result)}")
                break  # the smallest change of its kind that fits (kinds are ordered small to large)
    if fixes:
        return fixes
    for first, second in combinations(kinds, 2):
        found = _first_fitting_pair(inputs, first, second)
        if found is not None:
            fixes.append(found)
    if fixes:
        return fixes[:3]
    tried = ", ".join(["a shorter --max-model-len", *(kind[0][0].split(" (")[0] for kind in kinds)])
    return [
        f"none of the usual changes makes it fit, alone or two together (tried: {tried}); "
        "what is short is in the problem above: a smaller model, pipeline parallelism or more memory"
    ]


def _holds(plan: MemoryPlan, spec_max: int | None) -> bool:
    """The KV cache holds one request of the plan's max_model_len, within the model's positions
    (the engine's start-up check; the planner's own headroom caution is a separate problem)."""
    within = not spec_max or plan.max_model_len <= spec_max
    return plan.kv_cache_gib > 0 and plan.max_concurrency >= 1 and within


def _largest_context(inputs: PlanInputs, plan: MemoryPlan) -> int | None:
    """The largest max_model_len the KV cache holds (the engine starts with it), searched from the KV
    cache's token count; None when the length is not what is short."""
    spec_max = inputs.spec.max_position_embeddings
    high = min(plan.kv_cache_tokens, inputs.context_len - 1, spec_max or plan.kv_cache_tokens)
    if high < 1 or _holds(plan, spec_max):
        return None

    def fits(length: int) -> bool:
        return _holds(plan_for(replace(inputs, max_model_len=length)), spec_max)

    if fits(high):
        return high
    low = 0  # fits(low) is taken to hold; 0 stands for "no context fits"
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low or None


def _change_kinds(inputs: PlanInputs, plan: MemoryPlan) -> list[list[Change]]:
    kinds: list[list[Change]] = []
    # the activation peak grows with the tokens a step batches: fewer is the cheapest change
    fewer: list[Change] = [
        (
            f"--max-num-batched-tokens {tokens:,} (limits.max_num_batched_tokens)",
            {"max_num_batched_tokens": tokens},
        )
        for tokens in _halvings(plan.max_num_batched_tokens, 512)
    ]
    if fewer:
        kinds.append(fewer)
    if inputs.kv_dtype_bytes > 1:
        kinds.append([("--kv-cache-dtype fp8 (kv_cache.dtype)", {"kv_cache_dtype": "fp8"})])
    if inputs.effective_quantization in _INT4_FROM and inputs.spec.source != "gguf":
        label = "int4 weights (model.quantization awq/gptq, an AWQ/GPTQ checkpoint)"
        kinds.append([(label, {"quantization": "awq"})])
    if inputs.device == "cuda":
        heads = inputs.spec.num_attention_heads
        parallel: list[Change] = [
            (f"--tensor-parallel-size {tp} (parallelism.tensor, {tp} GPUs)", {"tensor_parallel_size": tp})
            for tp in (2, 4, 8)
            if tp > inputs.tensor_parallel_size and not heads % tp
        ]
        if parallel:
            kinds.append(parallel)
        current = inputs.total_memory_gib
        larger: list[Change] = [
            (f"a larger GPU, {gpu.name} ({gpu.memory_gib} GiB)", {"gpu": gpu, "gpu_memory_gib": None})
            for gpu in sorted(list_gpus(), key=lambda g: g.memory_gib)
            if gpu.memory_gib > current and gpu.vendor == "nvidia"
        ]
        if larger:
            kinds.append(larger)
    return kinds


def _halvings(value: int, floor: int) -> list[int]:
    """value / 2, value / 4, ... down to floor (the smallest change first)."""
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def _first_fitting_pair(inputs: PlanInputs, first: list[Change], second: list[Change]) -> str | None:
    for label_a, fields_a in first:
        for label_b, fields_b in second:
            result = plan_for(replace(inputs, **fields_a, **fields_b))
            if result.fits:
                return f"{label_a} and {label_b}: {_outcome(result)}"
    return None
