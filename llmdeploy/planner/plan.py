"""`make_plan(recipe) -> MemoryPlan`, plus the concrete fixes offered when a plan does not fit."""

from __future__ import annotations

from dataclasses import replace

from llmdeploy.catalog.gpus import list_gpus
from llmdeploy.planner.engine_rules import plan_for
from llmdeploy.planner.memory_plan import MemoryPlan
from llmdeploy.planner.plan_inputs import PlanInputs, inputs_from_recipe
from llmdeploy.recipe.schema import Recipe

_INT4_FROM = {"none", "fp8", "int8"}


def make_plan(recipe: Recipe) -> MemoryPlan:
    return plan_from_inputs(inputs_from_recipe(recipe))


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
    verdict = "fits" if plan.fits else "still does not fit"
    return (
        f"KV cache {plan.kv_cache_gib:.2f} GiB = {plan.kv_cache_tokens:,} tokens, "
        f"{plan.max_concurrency:.2f}x at {plan.max_model_len:,} ({verdict})"
    )


def suggest_fixes(inputs: PlanInputs, plan: MemoryPlan) -> list[str]:
    fixes: list[str] = []
    if plan.kv_cache_tokens > 0:
        largest = plan.kv_cache_tokens
        fixes.append(
            f"--max-model-len {largest:,} (limits.max_model_len): the largest context the KV cache holds"
        )
    if inputs.kv_dtype_bytes > 1:
        fp8 = plan_for(replace(inputs, kv_cache_dtype="fp8"))
        fixes.append(f"--kv-cache-dtype fp8 (kv_cache.dtype): {_outcome(fp8)}")
    if inputs.effective_quantization in _INT4_FROM and inputs.spec.source != "gguf":
        int4 = plan_for(replace(inputs, quantization="awq"))
        fixes.append(f"int4 weights (model.quantization awq/gptq, an AWQ/GPTQ checkpoint): {_outcome(int4)}")
    if inputs.device == "cuda":
        heads = inputs.spec.num_attention_heads
        for tp in (2, 4, 8):
            if tp <= inputs.tensor_parallel_size or heads % tp:
                continue
            more = plan_for(replace(inputs, tensor_parallel_size=tp))
            fixes.append(f"--tensor-parallel-size {tp} (parallelism.tensor, {tp} GPUs): {_outcome(more)}")
            if more.fits:
                break
        current = inputs.total_memory_gib
        for gpu in sorted(list_gpus(), key=lambda g: g.memory_gib):
            if gpu.memory_gib <= current:
                continue
            bigger = plan_for(replace(inputs, gpu=gpu, gpu_memory_gib=None))
            if bigger.fits:
                fixes.append(f"a larger GPU, {gpu.name} ({gpu.memory_gib} GiB): {_outcome(bigger)}")
                break
    return fixes
