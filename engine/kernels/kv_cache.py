"""The paged KV cache's storage formats: 16/32-bit, or fp8 (e4m3 / e5m2) with per-tensor scales.

An fp8 cache stores `(x / scale)` saturated to the format's largest finite value and cast to fp8; a
read gives `stored.float() * scale`. Each layer holds one float32 scale for K and one for V
(`Attention.k_scale` / `v_scale`, default 1.0). `KVAmaxObserver` records the largest |K| and |V| a
calibration pass sees, from which `calibrated_scale` derives a scale that maps amax (times a margin)
to the fp8 maximum: the full fp8 range is then in use, and values above it saturate instead of
becoming inf/NaN.

Writes and block reads of an fp8 cache go through uint8 views of it: index_copy_ has no fp8 kernel on
CPU, and a byte copy is the same copy on every device; 16/32-bit caches are indexed as they are.
"""

from __future__ import annotations

import torch
from llmdeploy_engine.facts import KV_CACHE_STORAGE

# --kv-cache-dtype names (facts.KV_CACHE_STORAGE) -> storage dtype, and torch's own names of the 16-bit
# formats (LLM(kv_cache_dtype="bfloat16")); "auto" is the model dtype
KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    **{name: getattr(torch, storage) for name, storage in KV_CACHE_STORAGE.items()},
    **{storage: getattr(torch, storage) for storage in KV_CACHE_STORAGE.values() if "float8" not in storage},
}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# calibrated scale = amax * margin / fp8 max: headroom for inputs whose K/V exceed what calibration saw
DEFAULT_SCALE_MARGIN = 2.0


def kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """Storage dtype for a --kv-cache-dtype name; ValueError naming the choices for anything else."""
    if name == "auto":
        return model_dtype
    if name not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype {name!r} is not supported by the built-in engine; "
            f"use auto, {', '.join(KV_CACHE_DTYPES)}"
        )
    return KV_CACHE_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 format (448 for e4m3fn, 57344 for e5m2)."""
    assert is_fp8(dtype), dtype
    return float(torch.finfo(dtype).max)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(x / scale) in float32, saturated to dtype's finite range, cast to fp8 (NaN stays NaN)."""
    limit = fp8_max(dtype)
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantize(stored: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """stored.float() * scale, cast to dtype. Every fp8 value is exact in fp16, bf16 and float32, and
    an in-place multiply by a float32 tensor computes in float32 and rounds once to dtype, so the
    result is the same bits without a float32 copy of the blocks (half the memory traffic)."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return stored.to(dtype).mul_(scale.float())
    return (stored.float() * scale).to(dtype)


def write_kv(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, scale: torch.Tensor | None) -> None:
    """Store x [num_tokens, kv_heads, head_dim] into cache [num_blocks, block_size, kv_heads, head_dim]
    at flat slots [num_tokens]; fp8 caches quantize with scale, others cast (scale unused)."""
    num_kv_heads, head_dim = cache.shape[2], cache.shape[3]
    if not is_fp8(cache.dtype):
        stored = x.to(cache.dtype).reshape(-1, num_kv_heads, head_dim)
        cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, stored)
        return
    if scale is None:
        raise ValueError("an fp8 KV cache needs its per-tensor scale (k_scale / v_scale)")
    stored = quantize(x, scale, cache.dtype)
    flat = cache.view(torch.uint8).view(-1, num_kv_heads, head_dim * cache.element_size())
    flat.index_copy_(0, slots, stored.reshape(-1, num_kv_heads, head_dim).contiguous().view(torch.uint8))


def read_blocks(
    cache: torch.Tensor, blocks: torch.Tensor, num_seqs: int, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """[num_seqs, kv_heads, blocks_per_seq * block_size, head_dim] in dtype from whole blocks (blocks is
    flat, num_seqs equal runs). index_select on blocks copies contiguous rows: several times faster
    on CPU than gathering single slots. fp8 blocks are dequantized with scale after the gather."""
    num_kv_heads, head_dim = cache.shape[2], cache.shape[3]
    if not is_fp8(cache.dtype):
        # typed rows: torch's uint8 index_select opens a parallel region even for a few blocks, which
        # stalls a decode step's layer for a scheduler slice when another process holds a core
        rows = cache.index_select(0, blocks).to(dtype)
        return rows.view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    rows = cache.view(torch.uint8).index_select(0, blocks).view(cache.dtype)
    if scale is None:
        raise ValueError("an fp8 KV cache needs its per-tensor scale (k_scale / v_scale)")
    rows = dequantize(rows, scale, dtype)
    return rows.view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)


def calibrated_scale(
    amax: torch.Tensor, dtype: torch.dtype, margin: float = DEFAULT_SCALE_MARGIN
) -> torch.Tensor:
    """float32 [1] scale that maps amax * margin to dtype's largest value (1.0 if amax is 0 or not finite)."""
    if margin < 1.0:
        raise ValueError(f"scale margin must be at least 1.0, got {margin}")
    amax = amax.float().reshape(1)
    scale = amax * margin / fp8_max(dtype)
    ok = torch.isfinite(scale) & (scale > 0)
    return torch.where(ok, scale, torch.ones_like(scale))


class KVAmaxObserver:
    """Running max of |K| and |V| over the forward passes it watches (one per attention layer)."""

    def __init__(self, device: torch.device) -> None:
        self.k_amax = torch.zeros(1, dtype=torch.float32, device=device)
        self.v_amax = torch.zeros(1, dtype=torch.float32, device=device)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.numel():
            torch.maximum(self.k_amax, k.detach().abs().amax().float().reshape(1), out=self.k_amax)
        if v.numel():
            torch.maximum(self.v_amax, v.detach().abs().amax().float().reshape(1), out=self.v_amax)
