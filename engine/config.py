"""Engine configuration: what `llmdeploy-engine serve` flags and `LLM(...)` keyword arguments set.

Names are vLLM's. A frozen value built once at start-up; derived facts (KV blocks, model shape) live
in the objects that measure them, never written back here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmdeploy_engine import facts
from llmdeploy_engine.core.gc_tuning import GC_GEN0_THRESHOLD
from llmdeploy_engine.model.quant_config import QuantSpec
from llmdeploy_engine.spec_decode.config import SpeculativeConfig, parse_speculative_config

# the all-reduces tensor parallelism can use for decode-sized tensors (distributed.init_parallel)
ALLREDUCE_CHOICES = ("auto", "nccl", "symm_mem", "p2p", "push")


@dataclass(frozen=True)
class EngineConfig:
    model: str  # GGUF file, checkpoint folder, or "random:<catalog id>"
    tokenizer: str | None = None  # default: from the model (GGUF or folder)
    served_model_name: str | None = None
    dtype: str = "auto"  # auto | float16 | bfloat16 | float32 (auto: bf16 on CUDA, fp32 on CPU)
    device: str = "auto"  # auto | cuda | cpu
    quantization: str | None = None
    # GGUF weights on the CPU: auto | quantized (kept compact, torch's int4 / fp16 CPU kernels) |
    # float32 (dequantized at load); gguf_compact.py
    cpu_weights: str = "auto"
    # default (None): the model's context, refused at start-up when the KV cache cannot hold it (vLLM's
    # rule); facts.AUTO_MAX_MODEL_LEN (-1, `--max-model-len auto`): the longest context the KV cache holds
    max_model_len: int | None = None
    gpu_memory_utilization: float = facts.DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_memory_bytes: int | None = None  # explicit KV budget (required sizing rule on CPU)
    kv_cache_dtype: str = "auto"  # one of facts.KV_CACHE_DTYPES (auto: the model's dtype; fp8 = e4m3)
    calculate_kv_scales: bool = True  # fp8 KV: per-layer scales from a start-up calibration pass, else 1.0
    block_size: int = facts.DEFAULT_BLOCK_SIZE
    max_num_seqs: int = facts.DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None  # default: facts.default_max_num_batched_tokens
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    tensor_parallel_size: int = 1
    seed: int = 0
    max_queue_len: int = 1024  # waiting requests beyond this are refused (HTTP 503)
    enforce_eager: bool = False
    # decode steps run back to back per scheduler call, with one host sync (llm_engine.py); 1 = off.
    # None (auto): with asynchronous scheduling on a CUDA device the engine chooses each window's
    # length, 1 to 8 steps, longer while the host's work a window exceeds the device's
    # (window_sizing.WindowSizer); otherwise 1
    num_scheduler_steps: int | None = None
    # launch the next decode window before processing the last one's tokens, so the host's work
    # between windows overlaps the device (llm_engine.py; with num_scheduler_steps 1 a window is one
    # decode step). None (auto): on with num_scheduler_steps > 1 or on a CUDA device, off on the CPU
    async_scheduling: bool | None = None
    # while sequences decode, waiting requests join at most every admission_interval decode steps
    # (scheduler.py): their prompts then share one eager prefill step and the decode steps between run
    # as graph windows; 1 = every step (vLLM's behaviour)
    admission_interval: int = 1
    # vLLM's speculative_config: a dict (as on vLLM's CLI) becomes a SpeculativeConfig at construction
    speculative_config: SpeculativeConfig | Mapping[str, Any] | None = None
    # the cyclic collector's young-generation threshold the engine raises the process to (never
    # lowers; gc_tuning.py); 0 leaves Python's setting alone
    gc_gen0_threshold: int = GC_GEN0_THRESHOLD
    # the all-reduce of decode-sized tensors with tensor_parallel_size > 1 (distributed.py):
    # auto | nccl | symm_mem | p2p | push
    tp_all_reduce: str = "auto"
    # torch threads of the model's steps on the CPU (None: torch's own, OMP_NUM_THREADS or the cores)
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative_config", parse_speculative_config(self.speculative_config))
        steps = self.num_scheduler_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(
                f"num_scheduler_steps must be a whole number >= 1 (1 = one decode step per scheduler "
                f"call) or null (auto: the engine chooses), got {steps!r}"
            )
        interval = self.admission_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(
                f"admission_interval must be a whole number >= 1 (1 = waiting requests join every step), "
                f"got {interval!r}"
            )
        if self.tp_all_reduce not in ALLREDUCE_CHOICES:
            raise ValueError(
                f"tp_all_reduce must be one of {', '.join(ALLREDUCE_CHOICES)}, got {self.tp_all_reduce!r}"
            )
        threads = self.cpu_threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(
                f"cpu_threads must be a whole number >= 1 or null (torch's own), got {threads!r}"
            )
        if self.async_scheduling not in (None, True, False):
            raise ValueError(
                f"async_scheduling must be true, false or null (auto), got {self.async_scheduling!r}"
            )


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling, as Hugging Face `rope_scaling` names it (only the types the model applies)."""

    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192  # llama3


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only model, read once from a GGUF header, a config.json or the catalog."""

    architecture: str  # llama | mistral | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    rope_freq_factors: tuple[float, ...] | None = None  # per-frequency divisors (GGUF rope_freqs, Llama 3.1)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head before RoPE (Qwen3)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    quantization: QuantSpec | None = None  # the linear layers' stored format (None: dense)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + head + self.num_hidden_layers * (attn + mlp + 2 * self.hidden_size) + self.hidden_size
