"""`PlanInputs`: every knob the memory model reads, resolved from a recipe or from vLLM-style flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmdeploy_engine import facts as builtin_rule

from llmdeploy.catalog.gpus import GPUSpec, resolve_gpu
from llmdeploy.catalog.model_spec import ModelSpec
from llmdeploy.catalog.models import infer_quantization, resolve_model
from llmdeploy.errors import UserError

if TYPE_CHECKING:  # the recipe's pydantic models cost ~0.3 s to import; `plan --model` needs none
    from llmdeploy.recipe.schema import Recipe

GIB = 2**30

# bytes per KV element for each --kv-cache-dtype but auto (the model dtype): the built-in engine's table,
# which holds vLLM's names
KV_DTYPE_BYTES = builtin_rule.KV_CACHE_DTYPE_BYTES
MODEL_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
CPU_DEFAULT_KV_GIB = 4.0  # vLLM's CPU backend default KV space (VLLM_CPU_KVCACHE_SPACE)


@dataclass(frozen=True)
class PlanInputs:
    spec: ModelSpec
    engine: str = "vllm"
    engine_version: str | None = None
    device: str = "cuda"
    gpu: GPUSpec | None = None
    gpu_memory_gib: float | None = None  # overrides the catalog figure
    gpu_memory_utilization: float = builtin_rule.DEFAULT_GPU_MEMORY_UTILIZATION
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    block_size: int = builtin_rule.DEFAULT_BLOCK_SIZE
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    kv_cache_memory_gib: float | None = None
    enforce_eager: bool = False
    # vLLM V1's top-k/top-p sampler: True FlashInfer, False PyTorch/Triton, None the release's default
    flashinfer_sampler: bool | None = None
    draft: ModelSpec | None = None  # speculative decoding draft model (same GPUs, same KV pool)
    # SGLang's --mem-fraction-static when the deployment sets it (engine.extra_args, `plan
    # --mem-fraction-static`); None: llmdeploy derives it from gpu_memory_utilization
    mem_fraction_static: float | None = None

    @property
    def total_memory_gib(self) -> float:
        if self.gpu_memory_gib is not None:
            return self.gpu_memory_gib
        if self.gpu is not None:
            return self.gpu.memory_gib
        raise UserError.one(
            "no GPU memory known",
            path="hardware.gpu",
            fix="give hardware.gpu (a catalog name) or hardware.gpu_memory_gib (--gpu / --gpu-memory-gib)",
        )

    @property
    def model_dtype_bytes(self) -> int:
        if self.dtype != "auto":
            return MODEL_DTYPE_BYTES[self.dtype]
        return 2  # auto: bf16 (fp32 checkpoints are cast down too); an engine that differs resolves dtype

    @property
    def kv_dtype_bytes(self) -> int:
        return KV_DTYPE_BYTES.get(self.kv_cache_dtype, self.model_dtype_bytes)

    @property
    def effective_quantization(self) -> str:
        if self.quantization != "none":
            return self.quantization
        return infer_quantization(self.spec.hf_id) or "none"

    @property
    def context_len(self) -> int:
        """max_model_len, else the model's context (the engines' rule, builtin_rule.requested_context_len)."""
        return builtin_rule.requested_context_len(self.max_model_len, self.spec.max_position_embeddings)


def inputs_from_recipe(recipe: Recipe) -> PlanInputs:
    """The engine-neutral inputs of a recipe; an engine adds its own (`Engine.plan_inputs`)."""
    hw, lim = recipe.hardware, recipe.limits
    spec = resolve_model(recipe.model)
    gpu = resolve_gpu(hw.gpu) if hw.gpu else None
    if hw.device == "cuda" and gpu is None and hw.gpu_memory_gib is None:
        raise UserError.one(
            "the plan needs the GPU",
            path="hardware.gpu",
            fix="set hardware.gpu (e.g. 'A100-80GB') or hardware.gpu_memory_gib",
        )
    eager = "--enforce-eager" in recipe.engine.extra_args
    spec_dec = recipe.speculative
    draft = None
    if spec_dec is not None and spec_dec.method == "draft" and spec_dec.draft_model:
        draft = resolve_model(spec_dec.draft_model)
    return PlanInputs(
        spec=spec,
        engine=recipe.engine.type,
        engine_version=recipe.engine.version,
        device=hw.device,
        gpu=gpu,
        gpu_memory_gib=hw.gpu_memory_gib,
        gpu_memory_utilization=lim.gpu_memory_utilization,
        tensor_parallel_size=recipe.parallelism.tensor,
        pipeline_parallel_size=recipe.parallelism.pipeline,
        dtype=recipe.model.dtype,
        quantization=recipe.model.quantization,
        kv_cache_dtype=recipe.kv_cache.dtype,
        block_size=recipe.kv_cache.block_size,
        max_model_len=lim.max_model_len,
        max_num_batched_tokens=lim.max_num_batched_tokens,
        max_num_seqs=lim.max_num_seqs,
        kv_cache_memory_gib=lim.kv_cache_memory_gib,
        enforce_eager=eager,
        draft=draft,
    )
