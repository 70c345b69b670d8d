"""Paged decode attention in Triton: one query token per sequence against its KV blocks, read in place.

The pure-torch path (attention.py) copies every sequence's blocks into a padded tensor (index_select,
padded to the longest context in the batch) and then runs SDPA over that copy with a mask: the KV
bytes are written once and read twice, padding included. This kernel reads each sequence's real
context once, through its block table, with an online softmax (one program per sequence and KV
head; the query heads of a GQA group share the K/V tiles).

`paged_attention_triton` has `attention.paged_attention`'s contract and uses the kernel for
pure-decode batches; batches with prefill chunks go to the pure-torch path unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from llmdeploy_engine.attention import AttentionMetadata, paged_attention

TILE_TOKENS = 64


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    tables_ptr,
    lengths_ptr,
    scale,
    stride_qn,
    stride_qh,
    stride_on,
    stride_oh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_tn,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    ctx = tl.load(lengths_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    gmask = g < GROUP
    q = tl.load(
        q_ptr + seq * stride_qn + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0
    )
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    t = tl.arange(0, TILE)
    for start in range(0, ctx, TILE):
        pos = start + t
        valid = pos < ctx
        block = tl.load(tables_ptr + seq * stride_tn + pos // BLOCK_SIZE, mask=valid, other=0)
        off = block.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    o_off = seq * stride_on + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=gmask[:, None])


def paged_decode(
    q: torch.Tensor,  # [n, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [n, max_blocks] (int32 or int64)
    context_lens: torch.Tensor,  # [n], >= 1
    scale: float,
) -> torch.Tensor:
    """Attention of each sequence's one query token over its first context_lens[i] cached tokens."""
    n, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_dim = k_cache.shape
    assert kv_dim == head_dim and num_heads % num_kv_heads == 0 and v_cache.shape == k_cache.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and q.stride(-1) == 1
    assert head_dim & (head_dim - 1) == 0, "head_dim must be a power of two"
    assert q.dtype == k_cache.dtype, "the KV cache must have the query's dtype"
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if n == 0:
        return out
    _paged_decode_kernel[(n, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        context_lens,
        scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE=TILE_TOKENS,
    )
    return out


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
    meta: AttentionMetadata,
    scale: float,
) -> Any:
    """attention.paged_attention's contract; pure-decode batches on the GPU go through the kernel."""
    if kv_cache is None or meta.prefills or not meta.num_decodes or kv_cache[0].dtype != q.dtype:
        return paged_attention(q, k, v, kv_cache, meta, scale)
    assert meta.slot_mapping is not None
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)
    v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, meta.slot_mapping, k.to(k_flat.dtype))
    v_flat.index_copy_(0, meta.slot_mapping, v.to(v_flat.dtype))
    n = meta.num_decodes
    tables = meta.decode_blocks.view(n, -1)
    lengths = meta.decode_mask.view(n, -1).sum(-1)
    out = torch.empty_like(q)
    out[meta.decode_token_index] = paged_decode(
        q[meta.decode_token_index], kv_cache[0], kv_cache[1], tables, lengths, scale
    )
    return out
