"""The classic back-of-envelope budget (shape-only mode, for models the catalog lacks):

    weights  = parameters x bytes per parameter
    overhead = 1.5 GB (CUDA context, activations, fragmentation: one flat figure)
    KV/token = 2 x layers x KV heads x head dim x bytes
    KV room  = GPU memory - weights - overhead

Decimal GB throughout, as the rule of thumb is usually quoted; docs/planner.md says where the full
planner differs and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy_engine.facts import kv_bytes_per_token

from llmdeploy.memory.memory_plan import MemoryPlan

GB = 10**9
GIB = 2**30
OVERHEAD_GB = 1.5


@dataclass(frozen=True)
class EnvelopeBudget:
    gpu_memory_gb: float
    weights_gb: float
    overhead_gb: float
    kv_budget_gb: float
    kv_bytes_per_token: int
    kv_tokens: int
    context_len: int
    max_concurrency: float

    @property
    def fits(self) -> bool:
        return self.kv_tokens >= self.context_len


def envelope_budget(
    params_b: float,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    gpu_memory_gb: float,
    weight_bytes: float = 2.0,
    kv_dtype_bytes: int = 2,
    context_len: int = 8192,
    tensor_parallel_size: int = 1,
) -> EnvelopeBudget:
    weights_gb = params_b * weight_bytes / tensor_parallel_size
    per_token = kv_bytes_per_token(
        num_layers, max(1, num_kv_heads // tensor_parallel_size), head_dim, kv_dtype_bytes
    )
    kv_gb = gpu_memory_gb - weights_gb - OVERHEAD_GB
    tokens = max(0, int(kv_gb * GB // per_token))
    return EnvelopeBudget(
        gpu_memory_gb, weights_gb, OVERHEAD_GB, kv_gb, per_token, tokens, context_len, tokens / context_len
    )


def envelope_plan(budget: EnvelopeBudget, model: str, gpu: str, tensor_parallel_size: int = 1) -> MemoryPlan:
    """The envelope in the plan's JSON shape (GiB fields converted; the overhead sits in non_torch_gib)."""
    problems: tuple[str, ...] = ()
    if budget.kv_budget_gb <= 0:
        problems = (
            f"weights ({budget.weights_gb:.1f} GB) + {OVERHEAD_GB} GB overhead exceed {budget.gpu_memory_gb} GB",
        )
    elif not budget.fits:
        problems = (
            f"max_model_len {budget.context_len:,} exceeds the KV cache's {budget.kv_tokens:,} tokens",
        )
    kv_bytes = max(0.0, budget.kv_budget_gb) * GB
    return MemoryPlan(
        engine="envelope",
        model=model,
        gpu=gpu,
        device="cuda",
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=1,
        total_gib=budget.gpu_memory_gb * GB / GIB,
        gpu_memory_utilization=1.0,
        usable_gib=budget.gpu_memory_gb * GB / GIB,
        weights_gib=budget.weights_gb * GB / GIB,
        activation_gib=0.0,
        non_torch_gib=OVERHEAD_GB * GB / GIB,
        cuda_graph_gib=0.0,
        kv_cache_gib=kv_bytes / GIB,
        headroom_gib=0.0,
        kv_bytes_per_token=budget.kv_bytes_per_token,
        kv_cache_tokens=budget.kv_tokens,
        num_kv_blocks=budget.kv_tokens // 16,
        block_size=16,
        max_model_len=budget.context_len,
        max_num_seqs=0,
        max_num_batched_tokens=0,
        max_concurrency=budget.max_concurrency,
        kv_cache_dtype="auto",
        quantization="shape-only",
        fits=not problems,
        problems=problems,
        notes=(
            "back-of-envelope: weights = params x bytes, flat 1.5 GB overhead (in non_torch_gib), decimal GB",
        ),
    )
