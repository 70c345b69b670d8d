"""Text Generation Inference (`text-generation-launcher`): its limits, launcher flags and environment,
its memory rule (free memory after warm-up becomes blocks), image and metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from llmdeploy.engines.base import EngineDefaults, PlanFigures
from llmdeploy.engines.flags import Flags, is_gguf, kv_dtype_flag, model_flags
from llmdeploy.engines.plan_assembly import assemble_plan
from llmdeploy.engines.problems import knob_problems
from llmdeploy.errors import Problem
from llmdeploy.memory import footprint
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import GIB, PlanInputs

if TYPE_CHECKING:  # the recipe models (pydantic) stay unimported: `plan --model` needs none
    from llmdeploy.catalog.gpus import GPUSpec
    from llmdeploy.catalog.model_spec import ModelSpec
    from llmdeploy.recipe.schema import Recipe

WIGGLE_ROOM = 0.95
DEFAULT_PREFILL_TOKENS = 4096
DEFAULT_BLOCK_SIZE = 16
# TGI's --quantize has no GGUF loader
UNSUPPORTED_QUANTIZATIONS = ("gguf",)
_KV_DTYPES = {"fp8": "fp8_e4m3fn", "fp8_e4m3": "fp8_e4m3fn", "fp8_e5m2": "fp8_e5m2"}
_QUANTIZATION = {
    "awq": "awq",
    "gptq": "gptq",
    "fp8": "fp8",
    "bitsandbytes": "bitsandbytes",
    "int8": "eetq",
    "int4": "bitsandbytes-nf4",
}


# TGI's repository was archived upstream in March 2026: it is still rendered, pinned, and named deprecated
DEPRECATION_NOTE = (
    "TGI is deprecated: its repository was archived upstream in March 2026, so llmdeploy renders it "
    "pinned to {version} and it gets no fixes; move to engine.type: sglang or vllm (same recipe, "
    "an OpenAI-compatible API; TGI's /generate API is served by engine.type: builtin)"
)


class TGIEngine(EngineDefaults):
    name = "tgi"
    display_name = "TGI"
    pinned_version = "3.1.0"
    entrypoint: tuple[str, ...] = ("text-generation-launcher",)
    api_key_env = "API_KEY"
    model_flag = "--model-id"
    host_flag = "--hostname"
    image = "ghcr.io/huggingface/text-generation-inference:3.1.0"
    queue_metric: str | None = "tgi_queue_size"
    executable = "text-generation-launcher"
    install_hint = "install Text Generation Inference so `text-generation-launcher` is on PATH"
    local_flag_check: str | None = "help-text"
    tgi_api = True
    accepts_ignore_eos = False

    def notes(self, recipe: Recipe, gpu: GPUSpec | None) -> list[str]:
        return [DEPRECATION_NOTE.format(version=recipe.engine.version or self.pinned_version)]

    def health_command(self, url: str) -> list[str]:
        # TGI's image has curl (and no python3 on PATH to rely on)
        return ["CMD", "curl", "-fsS", url]

    def support_problems(self, recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
        yield from knob_problems(
            (
                recipe.parallelism.pipeline > 1,
                "parallelism.pipeline",
                recipe.parallelism.pipeline,
                "TGI has no pipeline parallelism",
                "use parallelism.tensor instead, or engine vllm",
            ),
            (
                recipe.model.quantization in UNSUPPORTED_QUANTIZATIONS,
                "model.quantization",
                recipe.model.quantization,
                "TGI cannot load GGUF files",
                "use an AWQ/GPTQ/fp8 checkpoint with TGI, or engine vllm / builtin for GGUF",
            ),
        )

    def gpu_problems(self, recipe: Recipe, model: ModelSpec, gpu: GPUSpec) -> Iterator[Problem]:
        if recipe.model.quantization == "fp8" and not gpu.fp8_support:
            # TGI's launcher docs: fp8 (e4m3) weights need fp8 hardware; it has no weight-only fallback like vLLM's
            yield Problem(
                f"TGI's fp8 weights need a GPU with fp8 support (compute capability 8.9+); {gpu.name} has none",
                path="model.quantization",
                value="fp8",
                has_value=True,
                fix="use awq/gptq weights with TGI on this GPU, or engine vllm (fp8 weight-only via Marlin)",
            )

    def length_problems(self, recipe: Recipe, max_model_len: int) -> Iterator[Problem]:
        # TGI's launcher: max_input_tokens < max_total_tokens <= ..., max_batch_prefill_tokens >= max_input_tokens
        max_input_tokens = max_model_len - 1
        prefill = recipe.limits.max_num_batched_tokens
        if prefill is not None and prefill < max_input_tokens:
            yield Problem(
                f"TGI needs --max-batch-prefill-tokens ({prefill:,}) >= --max-input-tokens "
                f"({max_input_tokens:,} = max_model_len - 1); it refuses to start otherwise",
                path="limits.max_num_batched_tokens",
                value=prefill,
                has_value=True,
                fix=f"set limits.max_num_batched_tokens to at least {max_input_tokens}, or lower limits.max_model_len",
            )

    def speculative_problems(self, recipe: Recipe) -> Iterator[Problem]:
        spec = recipe.speculative
        if spec is not None and spec.method == "draft":
            yield Problem(
                "TGI cannot speculate with a separate draft model (only n-gram or Medusa heads, via --speculate)",
                path="speculative.method",
                value=spec.method,
                has_value=True,
                fix="use speculative.method: ngram, or engine vllm for a draft model",
            )

    def map_flags(self, recipe: Recipe, plan: PlanFigures, flags: Flags) -> None:
        lim, kv, par = recipe.limits, recipe.kv_cache, recipe.parallelism
        gguf_file = recipe.model.pypi.file if recipe.model.pypi else recipe.model.path
        flags.refuse_where(
            (
                recipe.hardware.device == "cpu",
                "hardware.device",
                "cpu",
                "the pinned TGI launcher image serves on CUDA only",
                "use hardware.device: cuda, or engine.type: vllm / builtin",
            ),
            (
                recipe.model.random_weights,
                "model.random_weights",
                True,
                "it has no dummy weight loader",
                "use engine.type: sglang or vllm (--load-format dummy), or builtin",
            ),
            (
                is_gguf(recipe.model),
                "model",
                gguf_file,
                "TGI's launcher loads safetensors checkpoints, not GGUF files",
                "point model.id at a checkpoint, or use engine.type: builtin",
            ),
        )
        model_flags(recipe, flags, ("float16", "bfloat16"), _QUANTIZATION, "--quantize", quantize_gguf=True)
        kv_dtype_flag(recipe, flags, "--kv-cache-dtype", _KV_DTYPES)
        if par.tensor > 1:
            flags.add("--num-shard", str(par.tensor))
        flags.refuse_where(
            (
                par.pipeline > 1,
                "parallelism.pipeline",
                par.pipeline,
                "TGI shards by tensor parallelism only",
                "use parallelism.tensor (TGI --num-shard), or engine.type: sglang or vllm",
            ),
            (
                recipe.hardware.nodes > 1,
                "hardware.nodes",
                recipe.hardware.nodes,
                "TGI serves from one node",
                "use hardware.nodes: 1, or engine.type: vllm",
            ),
        )
        if lim.max_model_len is not None:
            flags.add("--max-input-tokens", str(max(1, lim.max_model_len - 1)))
            flags.add("--max-total-tokens", str(lim.max_model_len))
        flags.add("--max-concurrent-requests", str(lim.max_num_seqs))
        if lim.max_num_batched_tokens is not None:
            flags.add("--max-batch-prefill-tokens", str(lim.max_num_batched_tokens))
        flags.add("--cuda-memory-fraction", str(lim.gpu_memory_utilization))
        if lim.kv_cache_memory_gib is not None:
            if plan.kv_cache_tokens is None:
                flags.unsupported(
                    "limits.kv_cache_memory_gib",
                    lim.kv_cache_memory_gib,
                    "TGI takes a KV budget in tokens (--max-batch-total-tokens), computed from the plan",
                    "render with a plan (llmdeploy render does), or drop kv_cache_memory_gib",
                )
            else:
                flags.add("--max-batch-total-tokens", str(plan.kv_cache_tokens))
        flags.env["PREFIX_CACHING"] = "1" if kv.prefix_caching else "0"
        name = recipe.server.served_model_name
        flags.refuse_where(
            (
                kv.block_size != DEFAULT_BLOCK_SIZE,
                "kv_cache.block_size",
                kv.block_size,
                "TGI picks its block size from its attention kernel",
                f"leave kv_cache.block_size at {DEFAULT_BLOCK_SIZE}",
            ),
            (
                not lim.enable_chunked_prefill,
                "limits.enable_chunked_prefill",
                False,
                "TGI 3 always chunks long prefills",
                "set limits.enable_chunked_prefill: true, or engine.type: sglang or vllm",
            ),
            (
                bool(name) and name != recipe.model.id,
                "server.served_model_name",
                name,
                "the pinned TGI launcher reports the model id",
                "remove server.served_model_name or set it to model.id",
            ),
        )
        _speculate(recipe, flags)

    def memory_plan(self, inputs: PlanInputs) -> MemoryPlan:
        seqs = inputs.max_num_seqs or 128
        prefill = inputs.max_num_batched_tokens or max(DEFAULT_PREFILL_TOKENS, min(inputs.context_len, 8192))
        total = int(inputs.total_memory_gib * GIB)
        usable = int(total * inputs.gpu_memory_utilization)  # TGI's --cuda-memory-fraction
        weights = footprint.weights_bytes_per_gpu(inputs)
        act = footprint.activation_bytes(inputs, prefill, min(seqs, prefill))
        non_torch = footprint.fixed_non_torch_bytes(inputs) + int(footprint.CUDA_CONTEXT_GIB * GIB)
        graphs = footprint.cuda_graph_bytes(inputs, min(seqs, 128))
        free = usable - weights - act - non_torch - graphs
        kv = int(free * WIGGLE_ROOM) if free > 0 else free
        note = (f"TGI: --max-batch-total-tokens from the KV cache; --max-batch-prefill-tokens {prefill:,}",)
        return assemble_plan(inputs, usable, weights, act, non_torch, graphs, kv, prefill, seqs, note)


def _speculate(recipe: Recipe, flags: Flags) -> None:
    spec = recipe.speculative
    if spec is None:
        return
    ngram = spec.method == "ngram"
    default_window = (spec.prompt_lookup_max, spec.prompt_lookup_min) == (4, 1)
    flags.refuse_where(
        (
            not ngram,
            "speculative.method",
            spec.method,
            "TGI speculates with n-grams (or Medusa heads) only",
            "use speculative.method: ngram, or engine.type: sglang or vllm",
        ),
        (
            ngram and not default_window,
            "speculative.prompt_lookup_max",
            spec.prompt_lookup_max,
            "TGI's n-gram lookup window is fixed",
            "leave prompt_lookup_max/min at 4/1",
        ),
    )
    if ngram and default_window:
        flags.add("--speculate", str(spec.num_speculative_tokens))


TGI = TGIEngine()
