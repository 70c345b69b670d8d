"""Engine configuration: what `llmdeploy-engine serve` flags and `LLM(...)` keyword arguments set.

Names are vLLM's. A frozen value built once at start-up; derived facts (KV blocks, model shape) live
in the objects that measure them, never written back here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    model: str  # GGUF file, checkpoint folder, or "random:<catalog id>"
    tokenizer: str | None = None  # default: from the model (GGUF or folder)
    served_model_name: str | None = None
    dtype: str = "auto"  # auto | float16 | bfloat16 | float32 (auto: bf16 on CUDA, fp32 on CPU)
    device: str = "auto"  # auto | cuda | cpu
    quantization: str | None = None
    max_model_len: int | None = None  # default: the model's context, capped by the KV cache
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None  # explicit KV budget (required sizing rule on CPU)
    kv_cache_dtype: str = "auto"  # auto | fp16 | bf16 | fp8 | fp8_e4m3 | fp8_e5m2
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: max(max_model_len, 2048) capped at 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    tensor_parallel_size: int = 1
    seed: int = 0
    max_queue_len: int = 1024  # waiting requests beyond this are refused (HTTP 503)
    enforce_eager: bool = False
