"""ops.rope_and_cache on the CPU (the pure-torch path): RoPE and the KV-cache write in one call, and
paged_attention(kv_written=True) attending over what it stored without writing again."""

from __future__ import annotations

import pytest
import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.kernels.attention import build_attention_metadata, paged_attention
from llmdeploy_engine.kernels.kv_cache import write_kv


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_rope_and_cache_then_attention_matches_the_unfused_path(cache_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    num_heads, num_kv_heads, head_dim, bs, num_blocks = 4, 2, 16, 4, 8
    # two decodes (contexts 6 and 3) and a 2-token prefill chunk after a 3-token prefix
    seqs, tables = [(5, 1), (2, 1), (3, 2)], [[3, 1], [0], [6, 2]]
    positions, slots, starts = [], [], []
    for (cached, new), table in zip(seqs, tables, strict=True):
        starts.append(len(positions))
        for p in range(cached, cached + new):
            positions.append(p)
            slots.append(table[p // bs] * bs + p % bs)
    n = len(positions)
    batch = ForwardBatch(
        [0] * n, positions, slots, starts, [s[1] for s in seqs], [sum(s) for s in seqs], tables, [0, 1, 2]
    )
    meta = build_attention_metadata(batch, bs, torch.device("cpu"))
    q = torch.randn(n, num_heads, head_dim, generator=gen)
    k = torch.randn(n, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(n, num_kv_heads, head_dim, generator=gen)
    emb = torch.tensor(positions, dtype=torch.float32)[:, None] * torch.rand(head_dim // 2, generator=gen)
    cos, sin = torch.cat([emb, emb], -1).cos()[:, None], torch.cat([emb, emb], -1).sin()[:, None]
    fill = torch.randn(num_blocks, bs, num_kv_heads, head_dim, generator=gen)
    fused_cache = (fill.to(cache_dtype).clone(), fill.to(cache_dtype).clone())  # four tensors
    plain_cache = (fill.to(cache_dtype).clone(), fill.to(cache_dtype).clone())
    k_scale, v_scale = torch.tensor([0.5]), torch.tensor([2.0])

    fq, fk = ops.rope_and_cache(q, k, v, cos, sin, fused_cache, meta.slot_mapping, k_scale, v_scale)
    pq, pk = ops.apply_rope(q, k, cos, sin)
    assert torch.equal(fq, pq) and torch.equal(fk, pk)
    want = tuple(c.clone() for c in plain_cache)
    write_kv(want[0], meta.slot_mapping, pk, k_scale)
    write_kv(want[1], meta.slot_mapping, v, v_scale)
    for got, ref in zip(fused_cache, want, strict=True):
        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8))

    scale = head_dim**-0.5
    before = tuple(c.clone() for c in fused_cache)
    out = paged_attention(fq, fk, v, fused_cache, meta, scale, k_scale, v_scale, kv_written=True)
    for got, ref in zip(fused_cache, before, strict=True):  # attention did not write again
        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
    ref_out = paged_attention(pq, pk, v, plain_cache, meta, scale, k_scale, v_scale)
    assert torch.equal(out, ref_out)
    # kv_written=True must really skip the write: garbage k/v leave the same output
    out_garbage = paged_attention(
        fq, fk * 0 + 99, v * 0 + 99, fused_cache, meta, scale, k_scale, v_scale, kv_written=True
    )
    decodes = meta.decode_token_index
    assert torch.equal(out_garbage[decodes], out[decodes])


@pytest.mark.parametrize("n", [1, 5])
def test_rope_over_merged_q_and_k_equals_rope_of_each(n: int) -> None:
    """q and k split from one QKV output are rotated in one pass (ops.apply_rope): the same values,
    bit for bit, as rotating separate copies of each on their own."""
    gen = torch.Generator().manual_seed(1)
    num_heads, num_kv_heads, head_dim = 6, 2, 16
    qkv = torch.randn(n, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1)
    q, k = q.view(n, num_heads, head_dim), k.view(n, num_kv_heads, head_dim)
    assert ops._adjacent_heads(q, k) is not None  # the merged path is the one under test
    emb = torch.arange(n, dtype=torch.float32)[:, None] * torch.rand(head_dim // 2, generator=gen)
    cos, sin = torch.cat([emb, emb], -1).cos()[:, None], torch.cat([emb, emb], -1).sin()[:, None]
    got_q, got_k = ops.apply_rope(q, k, cos, sin)
    qc, kc = q.clone(), k.clone()
    assert ops._adjacent_heads(qc, kc) is None
    want_q, want_k = ops.apply_rope(qc, kc, cos, sin)
    assert got_q.shape == want_q.shape and got_k.shape == want_k.shape
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
