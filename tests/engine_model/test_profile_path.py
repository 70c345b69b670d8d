"""The memory profile's step (attention.profile_batch): the server's prefill path, paged K/V written to
a scratch cache, against the cache-free reference (build_profile_metadata) on random shapes, with GQA
and fp8 KV caches; and a prefill chunk over cached context against the plain float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels.attention import (
    build_attention_metadata,
    build_profile_metadata,
    paged_attention,
    profile_batch,
)

CPU = torch.device("cpu")


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """float64 causal attention of q's rows (positions prefix..) over k/v (positions 0..), GQA by repeat."""
    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    pos = torch.arange(q.shape[0])[:, None] + prefix
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)


@pytest.mark.parametrize(
    ("num_tokens", "max_seq_len", "heads", "kv_heads", "block_size"),
    [(300, 128, 8, 8, 16), (257, 100, 28, 4, 16), (64, 64, 16, 1, 32), (77, 2048, 12, 2, 16)],
)
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_profile_step_matches_cache_free_prefill(
    num_tokens: int, max_seq_len: int, heads: int, kv_heads: int, block_size: int, kv_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(num_tokens + heads)
    head_dim = 32
    q = torch.randn(num_tokens, heads, head_dim, generator=gen)
    k = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    batch = profile_batch(num_tokens, max_seq_len, block_size)
    assert sum(batch.query_len) == num_tokens and len(set(batch.slot_mapping)) == num_tokens
    blocks = sum(len(t) for t in batch.block_tables)
    assert max(batch.slot_mapping) < blocks * block_size
    cache = tuple(torch.zeros(blocks, block_size, kv_heads, head_dim, dtype=kv_dtype) for _ in range(2))
    ones = torch.ones(1)
    got = paged_attention(
        q, k, v, cache, build_attention_metadata(batch, block_size, CPU), scale, ones, ones
    )  # fmt: skip
    want = paged_attention(q, k, v, None, build_profile_metadata(num_tokens, max_seq_len, CPU), scale)
    torch.testing.assert_close(got, want)
    start = 0
    for length in batch.query_len:  # and both against float64, sequence by sequence
        rows = slice(start, start + length)
        ref = _reference(q[rows], k[rows], v[rows], 0, scale)
        assert float((got[rows].double() - ref).norm() / ref.norm()) < 1e-5
        start += length
    if kv_dtype == torch.float32:  # every new K/V landed in its slot
        flat = cache[0].view(-1, kv_heads, head_dim)
        torch.testing.assert_close(flat[torch.tensor(batch.slot_mapping)], k)


@pytest.mark.parametrize(("query_len", "prefix", "heads", "kv_heads"), [(40, 33, 8, 2), (17, 100, 4, 4)])
def test_prefill_chunk_over_cached_context(query_len: int, prefix: int, heads: int, kv_heads: int) -> None:
    """A chunk whose first `prefix` tokens' K/V are already cached (a prefix hit or chunked prefill)."""
    gen = torch.Generator().manual_seed(query_len * prefix)
    head_dim, block_size = 16, 16
    ctx = prefix + query_len
    blocks = -(-ctx // block_size)
    table = torch.randperm(blocks + 3, generator=gen)[:blocks].tolist()  # shuffled blocks
    k_all = torch.randn(ctx, kv_heads, head_dim, generator=gen)
    v_all = torch.randn(ctx, kv_heads, head_dim, generator=gen)
    q = torch.randn(query_len, heads, head_dim, generator=gen)
    cache = tuple(torch.zeros(blocks + 3, block_size, kv_heads, head_dim) for _ in range(2))
    slots = [table[p // block_size] * block_size + p % block_size for p in range(ctx)]
    for c, src in zip(cache, (k_all, v_all), strict=True):
        c.view(-1, kv_heads, head_dim)[torch.tensor(slots[:prefix], dtype=torch.long)] = src[:prefix]
    batch = ForwardBatch(
        input_ids=[0] * query_len,
        positions=list(range(prefix, ctx)),
        slot_mapping=slots[prefix:],
        query_start=[0],
        query_len=[query_len],
        context_len=[ctx],
        block_tables=[table],
        sample_indices=[0],
    )
    meta = build_attention_metadata(batch, block_size, CPU)
    got = paged_attention(q, k_all[prefix:], v_all[prefix:], cache, meta, head_dim**-0.5)
    ref = _reference(q, k_all, v_all, prefix, head_dim**-0.5)
    assert float((got.double() - ref).norm() / ref.norm()) < 1e-5


def test_gqa_sdpa_expansion_is_exact() -> None:
    """K/V expanded per head give SDPA's enable_gqa result (the CUDA fallback expands them)."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 8, 50, 16, generator=gen)
    k = torch.randn(1, 2, 50, 16, generator=gen)
    v = torch.randn(1, 2, 50, 16, generator=gen)
    gqa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expanded = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1), is_causal=True
    )
    torch.testing.assert_close(gqa, expanded)
