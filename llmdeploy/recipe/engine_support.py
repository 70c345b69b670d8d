"""What each engine can honour: the built-in engine's architectures and dtypes, TGI's limits,
and speculative decoding's requirements (draft shares the vocabulary, and is smaller)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from llmdeploy.catalog import ModelSpec, resolve_model
from llmdeploy.errors import Problem, UserError
from llmdeploy.recipe.schema import Recipe

# What the built-in engine can run: engine/model.py SUPPORTED_ARCHITECTURES and engine/kv_cache.py's
# KV dtypes (tests keep them equal). The toolkit never imports the engine (it imports torch).
BUILTIN_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# fp8 is e4m3 (vLLM's meaning), stored with per-layer scales; 1 byte per element in the plan
BUILTIN_KV_DTYPES = ("auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")
# weight formats the built-in engine loads: GGUF files (dequantized to 16-bit at load) and AWQ / GPTQ
# int4 and fp8 (compressed-tensors) checkpoints, kept quantized (engine/quant_config.py)
BUILTIN_QUANTIZATIONS = ("none", "gguf", "awq", "gptq", "fp8")
# TGI's --quantize has no GGUF loader
TGI_UNSUPPORTED_QUANTIZATIONS = ("gguf",)


def engine_support_problems(recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
    engine = recipe.engine.type
    if engine == "builtin":
        if model.architecture not in BUILTIN_ARCHITECTURES or model.is_moe or model.is_mla:
            yield Problem(
                f"the built-in engine cannot run {model.architecture}"
                + (" with MoE/MLA layers" if model.is_moe or model.is_mla else ""),
                path="engine.type",
                value=engine,
                has_value=True,
                fix=f"use engine vllm, or a {' / '.join(BUILTIN_ARCHITECTURES.values())} model",
            )
        if recipe.kv_cache.dtype not in BUILTIN_KV_DTYPES:
            yield Problem(
                "the built-in engine has no such KV cache dtype",
                path="kv_cache.dtype",
                value=recipe.kv_cache.dtype,
                has_value=True,
                fix=f"use one of: {', '.join(BUILTIN_KV_DTYPES)}",
            )
        if recipe.model.quantization not in BUILTIN_QUANTIZATIONS and not recipe.model.random_weights:
            yield Problem(
                "the built-in engine loads 16/32-bit, AWQ / GPTQ int4 and fp8 checkpoints and GGUF files only",
                path="model.quantization",
                value=recipe.model.quantization,
                has_value=True,
                fix=f"use one of: {', '.join(BUILTIN_QUANTIZATIONS)}, or engine vllm",
            )
    if engine in ("builtin", "tgi") and recipe.parallelism.pipeline > 1:
        yield Problem(
            f"{_engine_name(engine)} has no pipeline parallelism",
            path="parallelism.pipeline",
            value=recipe.parallelism.pipeline,
            has_value=True,
            fix="use parallelism.tensor instead, or engine vllm",
        )
    if engine == "tgi" and recipe.model.quantization in TGI_UNSUPPORTED_QUANTIZATIONS:
        yield Problem(
            "TGI cannot load GGUF files",
            path="model.quantization",
            value=recipe.model.quantization,
            has_value=True,
            fix="use an AWQ/GPTQ/fp8 checkpoint with TGI, or engine vllm / builtin for GGUF",
        )


def _engine_name(engine: str) -> str:
    return {"builtin": "the built-in engine", "tgi": "TGI", "vllm": "vLLM"}[engine]


def speculative_problems(recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
    spec = recipe.speculative
    if spec is None:
        return
    if recipe.engine.type == "builtin" and spec.method == "draft" and not recipe.model.random_weights:
        yield Problem(
            "the built-in engine loads local files only, so it cannot fetch a draft model by hub id "
            "(a draft runs here only as random weights, next to a random-weights target)",
            path="speculative.draft_model",
            value=spec.draft_model,
            has_value=True,
            fix="use speculative.method: ngram, set model.random_weights: true (benchmarks), or use engine vllm",
        )
        return
    if recipe.engine.type == "tgi" and spec.method == "draft":
        yield Problem(
            "TGI cannot speculate with a separate draft model (only n-gram or Medusa heads, via --speculate)",
            path="speculative.method",
            value=spec.method,
            has_value=True,
            fix="use speculative.method: ngram, or engine vllm for a draft model",
        )
        return
    if spec.method == "draft" and spec.draft_model:
        try:
            draft = resolve_model(spec.draft_model)
        except UserError as e:
            yield from (dataclasses.replace(p, path="speculative.draft_model") for p in e.problems)
            return
        if draft.vocab_size != model.vocab_size:
            yield Problem(
                f"the draft model's vocabulary ({draft.vocab_size:,} tokens) differs from the target's "
                f"({model.vocab_size:,}); draft and target must share a tokenizer",
                path="speculative.draft_model",
                value=spec.draft_model,
                has_value=True,
                fix="pick a smaller model of the same family as the draft",
            )
        if draft.num_params >= model.num_params:
            yield Problem(
                f"the draft model ({draft.num_params / 1e9:.1f}B parameters) is not smaller than the target "
                f"({model.num_params / 1e9:.1f}B); speculation would only slow decoding down",
                path="speculative.draft_model",
                value=spec.draft_model,
                has_value=True,
                fix="pick a much smaller model of the same family",
            )
