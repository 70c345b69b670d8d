"""Random paged-KV batches and float64 references shared by the Triton kernel tests."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter: slow, small shapes
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the module marks of every Triton kernel test file: on a CUDA GPU, or on the CPU under the interpreter
TRITON_TEST_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
    pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="needs a CUDA GPU (or TRITON_INTERPRET=1)"),
]

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass
class PagedBatch:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # stored values (fp8 for fp8 caches)
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    tables: torch.Tensor  # [num_seqs, max_blocks] int32, shuffled blocks, padded with block 0
    query_start: list[int]
    query_len: list[int]
    context_len: list[int]


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """The contract's write: (x / scale) saturated to the format's max, cast to fp8."""
    top = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-top, top).to(dtype)


def make_batch(
    query_len: list[int],
    context_len: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    device: str,
    seed: int,
) -> PagedBatch:
    """Random q and a random cache holding every sequence's whole context (new tokens included) in
    blocks handed out in shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-c // block_size) for c in context_len]
    num_blocks = sum(per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(per_seq)
    tables = torch.zeros(len(query_len), max_blocks, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(per_seq):
        tables[i, :nb] = torch.tensor(perm[used : used + nb])
        used += nb
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    if cache_dtype in FP8:
        # scales chosen so some values saturate for e4m3 (|x| / 0.005 > 448 for |x| > 2.24)
        k_scale = torch.tensor([0.005 if cache_dtype == torch.float8_e4m3fn else 0.03], dtype=torch.float32)
        v_scale = torch.tensor([0.02], dtype=torch.float32)
        k_cache, v_cache = quantize(k, cache_dtype, k_scale), quantize(v, cache_dtype, v_scale)
        k_scale, v_scale = k_scale.to(device), v_scale.to(device)
    else:
        k_cache, v_cache = k.to(cache_dtype), v.to(cache_dtype)
        k_scale = v_scale = None
    num_tokens = sum(query_len)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    starts = [sum(query_len[:i]) for i in range(len(query_len))]
    return PagedBatch(
        q.to(device),
        k_cache.to(device),
        v_cache.to(device),
        k_scale,
        v_scale,
        tables.to(device),
        starts,
        list(query_len),
        list(context_len),
    )


def read_cache(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    x = cache.cpu().double()
    return x if scale is None else x * float(scale)


def reference(b: PagedBatch, scale: float) -> torch.Tensor:
    """float64 causal attention of each sequence's new tokens over its context, from the cache."""
    num_tokens, num_heads, head_dim = b.q.shape
    block_size, num_kv_heads = b.k_cache.shape[1], b.k_cache.shape[2]
    group = num_heads // num_kv_heads
    kc, vc = read_cache(b.k_cache, b.k_scale), read_cache(b.v_cache, b.v_scale)
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float64)
    for i, (start, qlen, ctx) in enumerate(zip(b.query_start, b.query_len, b.context_len, strict=True)):
        blocks = b.tables[i, : -(-ctx // block_size)].long().cpu()
        k = kc[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx].repeat_interleave(group, dim=1)
        v = vc[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx].repeat_interleave(group, dim=1)
        q = b.q[start : start + qlen].cpu().double()
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        qpos = torch.arange(qlen)[:, None] + (ctx - qlen)
        s = s.masked_fill(torch.arange(ctx)[None, :] > qpos, float("-inf"))
        out[start : start + qlen] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)
    return out


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.cpu().double()
    assert torch.isfinite(got).all()
    return float((got - ref).norm() / ref.norm())
