"""The built-in engine (`llmdeploy-engine serve`, engine/): what it runs, its flags (vLLM's names),
its memory rule (`llmdeploy_engine.facts`, the code its allocator runs), image and metrics."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from llmdeploy_engine import facts as builtin_rule

from llmdeploy import __version__
from llmdeploy.engines.base import EngineDefaults, KVCapacity, LocalPython, MetricSample, PlanFigures
from llmdeploy.engines.flags import Flags, speculative_config_json, vllm_style_flags
from llmdeploy.engines.plan_assembly import assemble_plan
from llmdeploy.engines.problems import knob_problems
from llmdeploy.errors import Problem
from llmdeploy.memory.footprint import activation_bytes
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import CPU_DEFAULT_KV_GIB, GIB, PlanInputs

if TYPE_CHECKING:  # the recipe models (pydantic) stay unimported: `plan --model` needs none
    from llmdeploy.catalog.model_spec import ModelSpec
    from llmdeploy.recipe.schema import Recipe

# What the built-in engine can run: the architectures and --kv-cache-dtype spellings of its facts module
# (torch-free; the toolkit never imports the rest of the engine). fp8 is e4m3 (vLLM's meaning), stored
# with per-layer scales, 1 byte per element in the plan.
BUILTIN_ARCHITECTURES = builtin_rule.ARCHITECTURES
_KV_DTYPES = {dtype: dtype for dtype in builtin_rule.KV_CACHE_STORAGE}
# --quantization methods: GGUF files (dequantized to 16-bit at load) and AWQ / GPTQ int4 and fp8
# (compressed-tensors) checkpoints, kept quantized (engine/quant_config.py)
_QUANTIZATION = {method: method for method in ("gguf", "awq", "gptq", "fp8")}
# what validate accepts is what the flags can say, so the two lists cannot drift apart
BUILTIN_KV_DTYPES = ("auto", *_KV_DTYPES)
BUILTIN_QUANTIZATIONS = ("none", *_QUANTIZATION)
# its images are the tags docs/docker.md's build commands give docker/engine*.Dockerfile
ENGINE_IMAGE = "llmdeploy/engine"
CPU_IMAGE_SUFFIX = "-cpu"
NON_TORCH_GIB = 0.67  # calibrated: built-in engine's measured non-torch (CUDA context, cuBLAS), H200
KV_TOKENS_GAUGE = "llmdeploy:kv_cache_tokens"


class BuiltinEngine(EngineDefaults):
    name = "builtin"
    display_name = "the built-in engine"
    pinned_version = "0.1.0"
    entrypoint: tuple[str, ...] = ("llmdeploy-engine", "serve")
    api_key_env = "VLLM_API_KEY"
    image = f"{ENGINE_IMAGE}:{__version__}"
    queue_metric: str | None = "vllm:num_requests_waiting"
    kv_usage_metric: str | None = "vllm:kv_cache_usage_perc"
    reexports_metrics = True
    kv_log_line: re.Pattern[str] | None = re.compile(r"(?:GPU|CPU) KV cache size:\s*([\d,]+)\s*tokens")
    executable = "llmdeploy-engine"
    install_hint = "pip install 'llmdeploy[engine]' so `llmdeploy-engine` is on PATH"
    local_python: LocalPython | None = LocalPython("llmdeploy_engine", ("llmdeploy",))
    bundled = True
    echoes_instance_id = True
    downloads_from_hub = False
    random_weights_prefix: str | None = "random:"
    drain_timeout_s: int | None = builtin_rule.DRAIN_TIMEOUT_S

    def container_image(self, recipe: Recipe) -> str:
        return self.image + (CPU_IMAGE_SUFFIX if recipe.hardware.device == "cpu" else "")

    def local_argv(self, rendered: list[str], executable: str, python: str | None) -> list[str]:
        assert tuple(rendered[: len(self.entrypoint)]) == self.entrypoint, rendered
        if python is not None and executable == python:
            # the engine found as this package's module: its script may not be on PATH
            return [python, "-m", "llmdeploy_engine.cli", *rendered[1:]]
        return [executable, *rendered[1:]]

    def support_problems(self, recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
        other_layers = " with MoE/MLA layers" if model.is_moe or model.is_mla else ""
        quantization = recipe.model.quantization
        yield from knob_problems(
            (
                model.architecture not in BUILTIN_ARCHITECTURES or model.is_moe or model.is_mla,
                "engine.type",
                self.name,
                f"the built-in engine cannot run {model.architecture}{other_layers}",
                f"use engine vllm, or a {' / '.join(BUILTIN_ARCHITECTURES.values())} model",
            ),
            (
                recipe.kv_cache.dtype not in BUILTIN_KV_DTYPES,
                "kv_cache.dtype",
                recipe.kv_cache.dtype,
                "the built-in engine has no such KV cache dtype",
                f"use one of: {', '.join(BUILTIN_KV_DTYPES)}",
            ),
            (
                quantization not in BUILTIN_QUANTIZATIONS and not recipe.model.random_weights,
                "model.quantization",
                quantization,
                "the built-in engine loads 16/32-bit, AWQ / GPTQ int4 and fp8 checkpoints and GGUF files only",
                f"use one of: {', '.join(BUILTIN_QUANTIZATIONS)}, or engine vllm",
            ),
            (
                recipe.parallelism.pipeline > 1,
                "parallelism.pipeline",
                recipe.parallelism.pipeline,
                "the built-in engine has no pipeline parallelism",
                "use parallelism.tensor instead, or engine vllm",
            ),
        )

    def speculative_problems(self, recipe: Recipe) -> Iterator[Problem]:
        spec = recipe.speculative
        if spec is not None and _draft_by_hub_id(recipe):
            yield Problem(
                "the built-in engine loads local files only, so it cannot fetch a draft model by hub id "
                "(a draft runs here only as random weights, next to a random-weights target)",
                path="speculative.draft_model",
                value=spec.draft_model,
                has_value=True,
                fix="use speculative.method: ngram, set model.random_weights: true (benchmarks), or use engine vllm",
            )

    def map_flags(self, recipe: Recipe, plan: PlanFigures, flags: Flags) -> None:
        device = (("--device", "cpu"),) if recipe.hardware.device == "cpu" else ()
        vllm_style_flags(
            recipe, flags, _KV_DTYPES, _QUANTIZATION, device, single_node=True, local_files_only=True
        )
        spec = recipe.speculative
        if spec is not None:
            if _draft_by_hub_id(recipe):
                flags.unsupported(
                    "speculative.draft_model",
                    spec.draft_model,
                    "it loads local files only and cannot fetch a draft model by hub id",
                    "use speculative.method: ngram, model.random_weights: true, or engine.type: sglang or vllm",
                )
            else:
                # a random-weights target gets a random-weights draft of the catalog model
                flags.add(
                    "--speculative-config", speculative_config_json(recipe, f"random:{spec.draft_model}")
                )

    def memory_plan(self, inputs: PlanInputs) -> MemoryPlan:
        if inputs.device == "cpu" and inputs.dtype == "auto":
            inputs = replace(inputs, dtype="float32")  # it computes in float32 on CPU
        seqs = inputs.max_num_seqs or builtin_rule.DEFAULT_MAX_NUM_SEQS
        batched = inputs.max_num_batched_tokens or builtin_rule.default_max_num_batched_tokens(
            inputs.context_len
        )
        weights = _weights_bytes(inputs)
        act = activation_bytes(inputs, batched, min(seqs, batched))
        if inputs.device == "cpu":
            budget = int((inputs.kv_cache_memory_gib or CPU_DEFAULT_KV_GIB) * GIB)
            kv = builtin_rule.kv_cache_bytes(0, 0.0, 0, 0, 0, 0, budget)
            note = ("built-in engine on CPU: the KV cache is limits.kv_cache_memory_gib (default 4 GiB)",)
            return assemble_plan(inputs, budget, weights, act, 0, 0, kv, batched, seqs, note)
        total = int(inputs.total_memory_gib * GIB)
        usable = int(total * inputs.gpu_memory_utilization)
        # the engine profiles one prefill of `batched` tokens through the server's path (paged K/V, the
        # varlen attention kernel): linear in the tokens (facts.prefill_activation_bytes)
        act = prefill_activation_bytes(inputs, batched, min(seqs, batched))
        # it counts everything outside torch's pool, the CUDA context included (0.67 GiB measured)
        non_torch = int(NON_TORCH_GIB * GIB)
        explicit = int(inputs.kv_cache_memory_gib * GIB) if inputs.kv_cache_memory_gib else None
        graphs = 0 if inputs.enforce_eager else graph_bytes(inputs, seqs)
        kv = builtin_rule.kv_cache_bytes(
            total, inputs.gpu_memory_utilization, weights, act, non_torch, graphs, explicit
        )
        return assemble_plan(inputs, usable, weights, act, non_torch, graphs, kv, batched, seqs)

    def kv_capacity_from_metrics(self, samples: list[MetricSample]) -> KVCapacity | None:
        for name, _, value in samples:
            if name == KV_TOKENS_GAUGE and value > 0:
                return KVCapacity(int(value), f"/metrics {KV_TOKENS_GAUGE}")
        return None


def _draft_by_hub_id(recipe: Recipe) -> bool:
    """A draft model it would have to download: it runs a draft only as random weights."""
    spec = recipe.speculative
    return spec is not None and spec.method == "draft" and not recipe.model.random_weights


def _weights_bytes(inputs: PlanInputs) -> int:
    """int4 / fp8 checkpoints stay quantized; GGUF files are dequantized to the compute dtype on CUDA
    and kept compact on the CPU (one process: tensor_parallel_size 1)."""
    if inputs.device == "cpu" and inputs.spec.gguf_tensors and inputs.tensor_parallel_size == 1:
        return builtin_rule.compact_gguf_weights_bytes(
            list(inputs.spec.gguf_tensors), inputs.model_dtype_bytes
        )
    return math.ceil(
        builtin_rule.weights_bytes(
            inputs.spec.num_params,
            inputs.spec.params.linear,
            inputs.model_dtype_bytes,
            inputs.effective_quantization,
        )
        / inputs.tensor_parallel_size
    )


def prefill_activation_bytes(inputs: PlanInputs, batched: int, logit_rows: int) -> int:
    """The engine's profiled activation peak on CUDA (builtin_rule.prefill_activation_bytes) for this
    rank's shards. int4 weights are dequantized into a temporary at prefill sizes (the largest
    projection: gate/up merged, or q/k/v); fp8 weights quantize the down projection's input per token
    into a 16-bit and an fp8 temporary."""
    spec, tp = inputs.spec, inputs.tensor_parallel_size
    inter = spec.intermediate_size // tp
    dtype = inputs.model_dtype_bytes
    temp = 0
    if inputs.effective_quantization in ("awq", "gptq"):
        qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim // tp
        temp = max(2 * inter, qkv) * spec.hidden_size * dtype
    elif inputs.effective_quantization == "fp8":
        temp = batched * inter * (dtype + 1)
    return builtin_rule.prefill_activation_bytes(
        num_tokens=batched,
        logit_rows=logit_rows,
        hidden_size=spec.hidden_size,
        intermediate_size=inter,
        q_size=spec.num_attention_heads * spec.head_dim // tp,
        kv_size=max(1, spec.num_kv_heads // tp) * spec.head_dim,
        vocab_size=spec.vocab_size,
        dtype_bytes=dtype,
        quantization_temp_bytes=temp,
    )


def graph_bytes(inputs: PlanInputs, seqs: int) -> int:
    """What the built-in engine sets aside for its decode CUDA graphs (builtin_rule.cuda_graph_bytes);
    assumes the Triton kernels are installed, which read 16-bit caches of the model's dtype and fp8
    caches in place (a float32 model or another cache dtype takes the gathering torch path)."""
    spec, tp = inputs.spec, inputs.tensor_parallel_size
    return builtin_rule.cuda_graph_bytes(
        max_num_seqs=seqs,
        max_model_len=inputs.context_len,
        block_size=inputs.block_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size // tp,
        q_size=spec.num_attention_heads * spec.head_dim // tp,
        kv_size=max(1, spec.num_kv_heads // tp) * spec.head_dim,
        vocab_size=spec.vocab_size,
        dtype_bytes=inputs.model_dtype_bytes,
        gathered_kv=inputs.model_dtype_bytes == 4
        or inputs.kv_dtype_bytes not in (inputs.model_dtype_bytes, 1),
    )


BUILTIN = BuiltinEngine()
