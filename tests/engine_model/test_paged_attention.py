"""Paged attention against a per-token, per-head reference on random data (no model needed)."""

from __future__ import annotations

import random

import pytest
import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels.attention import build_attention_metadata, paged_attention

MIXED = [(5, 1), (0, 7), (9, 3), (12, 1), (0, 1), (30, 1)]
# every row a decode, in order: the decode-only path, which attends straight into its output
DECODES = [(5, 1), (12, 1), (30, 1), (2, 1)]


@pytest.mark.parametrize("seqs", [MIXED, DECODES], ids=["mixed", "decodes"])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(6, 2), (4, 4), (8, 1)])
def test_batch_matches_reference(num_heads: int, num_kv_heads: int, seqs: list[tuple[int, int]]) -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    head_dim, block_size, num_blocks = 16, 4, 64
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim)
    # seqs: (tokens already cached, new tokens): decodes, a fresh prefill, a prefill chunk after a prefix
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables, positions, slots, starts = [], [], [], []
    for cached, new in seqs:
        n_blocks = -(-(cached + new) // block_size)
        table, free = free[:n_blocks], free[n_blocks:]
        tables.append(table)
        starts.append(len(positions))
        positions += list(range(cached, cached + new))
        slots += [table[p // block_size] * block_size + p % block_size for p in range(cached, cached + new)]
    n = len(positions)
    batch = ForwardBatch(
        [0] * n,
        positions,
        slots,
        starts,
        [s[1] for s in seqs],
        [sum(s) for s in seqs],
        tables,
        list(range(len(seqs))),
    )
    # q, k and v as views of one merged projection output, as the model hands them over
    qkv = torch.randn(n, (num_heads + 2 * num_kv_heads) * head_dim)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1)
    q = q.view(n, num_heads, head_dim)
    k, v = k.view(n, num_kv_heads, head_dim), v.view(n, num_kv_heads, head_dim)
    scale = head_dim**-0.5
    out = paged_attention(
        q, k, v, (k_cache, v_cache), build_attention_metadata(batch, block_size, q.device), scale
    )

    group = num_heads // num_kv_heads
    for i, (cached, new) in enumerate(seqs):
        ctx_slots = [tables[i][p // block_size] * block_size + p % block_size for p in range(cached + new)]
        keys = k_cache.view(-1, num_kv_heads, head_dim)[ctx_slots]
        values = v_cache.view(-1, num_kv_heads, head_dim)[ctx_slots]
        # the new K/V were written to their slots
        assert torch.equal(keys[cached:], k[starts[i] : starts[i] + new])
        for j in range(new):
            p = cached + j
            for h in range(num_heads):
                scores = keys[: p + 1, h // group] @ q[starts[i] + j, h] * scale
                ref = torch.softmax(scores, 0) @ values[: p + 1, h // group]
                torch.testing.assert_close(out[starts[i] + j, h], ref, atol=1e-5, rtol=1e-4)
