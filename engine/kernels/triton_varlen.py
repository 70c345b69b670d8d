"""Varlen paged attention in Triton: every sequence of a batch in one launch, K/V read in place.

Sequence i has query_len[i] new tokens at the end of a context of context_len[i] tokens, all of whose
K/V are in the cache (this step's included) through its block table; new token j sits at position
context_len - query_len + j and sees keys 0..that position (causal, offset by the cached prefix).
That covers full prefills, prefill chunks after a prefix hit, chunked prefill, multi-token decode
(speculative verification) and single-token decode, mixed in one batch.

GQA: the query heads that share a KV head are folded into the rows of the query tile (row r is
token r // group, head r % group of the group), so each K/V tile is loaded once for the whole group
and a decode's group fills the 16 rows `tl.dot` needs. Programs: (sequence, KV head, row tile); a
tile past its sequence's rows exits at once. The grid comes from the number of sequences and
`VarlenMetadata.max_query_len` (a host int), never from tensor values, so the launch can be captured
in a CUDA graph for a fixed batch shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from llmdeploy_engine.kernels.attention import VarlenMetadata, default_block_m, varlen_launch
from llmdeploy_engine.kernels.triton_attention import _fp8_to_f16, _fp16_query, check_cache, fp8_cvt_available


@triton.jit
def _attend_tile(
    q,
    acc,
    m_i,
    l_i,
    start,
    k_ptr,
    v_ptr,
    table_row_ptr,
    qpos,
    hi,
    qk_scale,
    kv_head,
    stride_kb,
    stride_kt,
    stride_kh,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CVT_V: tl.constexpr,
    E5M2: tl.constexpr,
):
    """One K/V tile of the online softmax. MASKED=False: every key of the tile is at or before every
    row's position (no bounds or causal checks needed)."""
    pos = start + tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    if MASKED:
        valid = pos < hi
        block = tl.load(table_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
    else:
        block = tl.load(table_row_ptr + pos // BLOCK_SIZE)
    off = block.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
    if MASKED:
        k = tl.load(k_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
    else:
        k = tl.load(k_ptr + off[:, None] + d[None, :]).to(q.dtype)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        # row 0's key 0 is always visible, so every row's running max is finite after the first tile
        s = tl.where(valid[None, :] & (pos[None, :] <= qpos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    else:
        v = tl.load(v_ptr + off[:, None] + d[None, :])
    if CVT_V:
        # see _fp8_to_f16: without it the 16-row (mma.sync) path reads V byte by byte
        v = _fp8_to_f16(v, E5M2)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return acc, m_new, l_i


# the block-table width changes from step to step; specialising on it (== 1, divisible by 16) would
# compile new variants while serving
@triton.jit(do_not_specialize=["stride_tn"])
def _varlen_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    query_start_ptr,
    query_len_ptr,
    context_len_ptr,
    tables_ptr,
    k_scale_ptr,
    v_scale_ptr,
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
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
    F16_DOT: tl.constexpr,
    CVT_V: tl.constexpr,
    E5M2: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    qlen = tl.load(query_len_ptr + seq)
    if tile * BLOCK_M >= qlen * GROUP:
        return
    qstart = tl.load(query_start_ptr + seq).to(tl.int64)
    ctx = tl.load(context_len_ptr + seq)
    prefix = ctx - qlen
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    rmask = tok < qlen
    qpos = prefix + tok  # each row's position in its sequence
    d = tl.arange(0, HEAD_DIM)
    q_off = (qstart + tok)[:, None] * stride_qn + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=rmask[:, None], other=0.0)
    qk_scale = scale
    if FP8:
        qk_scale = scale * tl.load(k_scale_ptr)
    if F16_DOT:
        # K, V and P follow q's dtype in _attend_tile: fp16 for the dots
        q, qk_scale = _fp16_query(q, qk_scale)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    last_tok = tl.minimum(qlen - 1, (tile * BLOCK_M + BLOCK_M - 1) // GROUP)
    hi = prefix + last_tok + 1  # keys past the tile's last row are masked for every row
    # keys 0 .. prefix + first row's token are visible to every row: whole tiles there skip the masks
    free = (prefix + (tile * BLOCK_M) // GROUP + 1) // BLOCK_N * BLOCK_N
    table_row = tables_ptr + seq * stride_tn
    for start in range(0, free, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start, k_ptr, v_ptr, table_row, qpos, hi, qk_scale, kv_head,
            stride_kb, stride_kt, stride_kh, HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, CVT_V, E5M2,
        )  # fmt: skip
    for start in range(free, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start, k_ptr, v_ptr, table_row, qpos, hi, qk_scale, kv_head,
            stride_kb, stride_kt, stride_kh, HEAD_DIM, BLOCK_SIZE, BLOCK_N, True, CVT_V, E5M2,
        )  # fmt: skip
    out = acc / l_i[:, None]
    if FP8:
        out = out * tl.load(v_scale_ptr)
    o_off = (qstart + tok)[:, None] * stride_on + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


def varlen_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], this step's K/V written
    v_cache: torch.Tensor,
    meta: VarlenMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,  # float32 one-element tensors; needed for fp8 caches
    v_scale: torch.Tensor | None = None,
    block_m: int | None = None,  # rows per program; None: from max_query_len * group (16 to 64)
    fp16_dot: bool | None = None,  # None: fp16 dots for a bf16 query over an fp8 cache
    fp8_cvt: str | None = None,  # "to" or "v" (triton_attention.FP8_CONVERSIONS); None: "v" up to 32 rows
    block_n: int | None = None,  # keys per inner tile; None and below: attention.varlen_launch's
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal attention of every sequence's new tokens over its cached context (see the module doc).
    Rows of q that belong to no sequence are left uninitialised."""
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_dim = k_cache.shape
    assert kv_dim == head_dim and num_heads % num_kv_heads == 0 and q.stride(-1) == 1
    fp8 = check_cache(q, k_cache, v_cache)
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale")
    if fp16_dot is None:
        fp16_dot = fp8 and q.dtype == torch.bfloat16
    if fp16_dot and q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"fp16 dots need a 16-bit query, got {q.dtype}")
    group = num_heads // num_kv_heads
    num_seqs = meta.query_len.shape[0]
    out = torch.empty_like(q)
    if num_seqs == 0 or meta.max_query_len == 0:
        return out
    rows = meta.max_query_len * group
    if block_m is None:
        block_m = default_block_m(rows)
    tuned = varlen_launch(block_m, fp8)
    block_n = tuned[0] if block_n is None else block_n
    num_warps = tuned[1] if num_warps is None else num_warps
    num_stages = tuned[2] if num_stages is None else num_stages
    cvt_ok = fp8_cvt_available(q, fp8, fp16_dot, block_n * head_dim, num_warps)
    if fp8_cvt is None:
        # up to 32 rows the dots are mma.sync and V's fp8 bytes would be re-laid out one at a time
        # (as in paged_decode); from 64 rows on Hopper's wgmma path reads the fp8 tiles without that
        fp8_cvt = "v" if cvt_ok and block_m <= 32 else "to"
    if fp8_cvt not in ("to", "v"):
        raise ValueError(f"fp8_cvt must be 'to' or 'v', got {fp8_cvt!r}")
    if fp8_cvt == "v" and not cvt_ok:
        raise ValueError(
            "not supported: fp8_cvt='v' needs an fp8 cache, fp16 dots and a CUDA GPU of sm_89 or later"
        )
    dummy = meta.query_len
    _varlen_kernel[(num_seqs, num_kv_heads, triton.cdiv(rows, block_m))](
        q,
        k_cache,
        v_cache,
        out,
        meta.query_start,
        meta.query_len,
        meta.context_len,
        meta.block_tables,
        k_scale if fp8 else dummy,
        v_scale if fp8 else dummy,
        scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        meta.block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        FP8=fp8,
        F16_DOT=fp16_dot,
        CVT_V=fp8_cvt == "v",
        E5M2=k_cache.dtype == torch.float8_e5m2,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
