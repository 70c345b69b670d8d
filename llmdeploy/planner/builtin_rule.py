"""The KV-cache sizing rule of the built-in engine. The engine's allocator calls these functions with
measured values; the planner calls them with its estimates, so the two can only differ in the inputs.
"""

from __future__ import annotations


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype_bytes: int) -> int:
    """2 (K and V) x layers x KV heads (per GPU) x head dim x bytes."""
    assert min(num_layers, num_kv_heads, head_dim, kv_dtype_bytes) > 0
    return 2 * num_layers * num_kv_heads * head_dim * kv_dtype_bytes


def kv_cache_bytes(
    total_memory_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    peak_activation_bytes: int,
    non_torch_bytes: int,
    cuda_graph_bytes: int = 0,
    kv_cache_memory_bytes: int | None = None,
) -> int:
    """An explicit `kv_cache_memory_bytes` wins; else total x utilization minus everything else.
    May be negative: the caller reports that as "does not fit"."""
    if kv_cache_memory_bytes is not None:
        return int(kv_cache_memory_bytes)
    usable = int(total_memory_bytes * gpu_memory_utilization)
    return usable - weights_bytes - peak_activation_bytes - non_torch_bytes - cuda_graph_bytes


def num_kv_blocks(kv_cache_bytes: int, kv_bytes_per_token: int, block_size: int) -> int:
    """Whole blocks only (floor); never negative."""
    assert kv_bytes_per_token > 0 and block_size > 0
    return max(0, kv_cache_bytes // (kv_bytes_per_token * block_size))


def max_concurrency(num_kv_blocks: int, block_size: int, max_model_len: int) -> float:
    """How many requests of max_model_len tokens fit at once: blocks / ceil(len / block_size)."""
    blocks_per_request = -(-max_model_len // block_size)
    return num_kv_blocks / blocks_per_request
