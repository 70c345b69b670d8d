"""Paged attention in Triton: the KV-cache write, decode (one token per sequence, split-KV) and a
varlen kernel for everything else, all reading K/V in place through block tables.

The pure-torch path (attention.py) copies every sequence's blocks into a padded tensor and runs SDPA
over the copy (decodes) or one SDPA call per prefill chunk. Here:

- `write_kv`: one launch stores the step's k and v into their slots (fp8 caches: x / scale,
  saturated to the format's max, as the contract in attention.py says).
- `paged_decode`: one query token per sequence; programs per (sequence, KV head, split), the KV
  heads fastest in the grid (DECODE_GRID_ORDER). The query heads of a GQA group share each K/V
  tile. Long contexts with few sequences split the context (flash-decoding) so every SM works; a
  second small kernel merges the splits by log-sum-exp.
- `varlen_attention` (triton_varlen.py): any mix of prefill chunks, prefix hits, chunked prefill and
  multi-token decode, in one launch.

fp8 caches: K/V tiles are loaded as fp8 and converted exactly to the dot dtype; the per-tensor scales
are folded in once (k_scale into the softmax scale, v_scale into the output), so
read = stored.float() * scale holds. A bf16 query over an fp8 cache runs its dots in fp16 (q, K, V
and P): Hopper converts e4m3/e5m2 to fp16 in one instruction but has no fp8 -> bf16 conversion, and
fp16 holds every fp8 value and (with the power-of-two rescale in `_fp16_query`) every bf16 query.
paged_decode converts fp8 tiles through `_fp8_to_f16` (see there why not `.to()`) after they land
in shared memory, and streams whole tiles without masks, a masked tile only at the end of a split.
Grid sizes come only from tensor shapes and host ints carried by the metadata, never from tensor
values, so every launch here can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from llmdeploy_engine.kernels import triton_pdl
from llmdeploy_engine.kernels.attention import AttentionMetadata

TILE_TOKENS = 64
MAX_SPLITS = 32
# splits of at least 64 tokens, and none below a 256-token context: single-sequence decode on the
# H200 inside a CUDA graph (`git show c2170a2:benchmarks/gpu_decode_small.py`) ran fastest with
# 64-token splits from 256 tokens on (0.5B layer at 512: 6.7 -> 4.4 us; 8B: 8.4 -> 5.3 us), while at
# 128 tokens one program per KV head beat any split (the merge costs more than it saves)
MIN_SPLIT_TOKENS = 64
MIN_SPLIT_CONTEXT = 256
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second and third dimensions
# DECODE_GRID_ORDER: paged_decode's grid is (KV heads, sequences, splits), so the GPU, which starts
# programs about in grid order, runs a sequence's KV heads together: they read the same block-table
# row and the neighbouring 256-byte head slices of each cached token. Measured on the H200 at the
# 8B's 256-request shapes (`git show c2170a2:benchmarks/gpu_batch_diag.py`): 1-3 % faster than
# sequences fastest, and up to 10 % with rows sorted longest context first; in the engine under the
# board's power limit, sorting the rows gained nothing, so the scheduler does not sort them.


@dataclass(frozen=True)
class DecodeConfig:
    """paged_decode's launch configuration for one kind of cache."""

    tile: int  # keys per loop step
    num_warps: int
    num_stages: int  # 5: two K/V buffers (the block-table load takes a stage of its own)
    fp8_cvt: str  # "to": Triton's `.to()`; "v": V tiles through `_fp8_to_f16`; "kv": K and V
    row_sum_at_end: bool  # softmax denominators summed once after the loop, not per tile
    programs_per_sm: int  # resident programs an SM holds (registers / shared memory), for the splits
    max_registers: int | None  # ptxas cap that keeps programs_per_sm (checked: no spills)


FP8_CONVERSIONS = ("to", "v", "kv")
# H200, Llama-3.1-8B layer (32 q / 8 KV heads, head_dim 128), kernel only (`git show c2170a2:benchmarks/gpu_fp8_sweep.py`).
# bf16 cache: 4 programs an SM (128 registers,
# 39 KB shared; without the cap the one-split variant takes 130-150 registers and only 3 fit).
# fp8 cache: 128-key tiles, 4 warps, 2 programs an SM (108 KB shared: two fp8 K/V buffers and the
# fp16 V tile) for small batches; from FP8_LARGE_BATCH_PROGRAMS programs (sequences x KV heads) on,
# 64-key tiles, 2 warps, sums at the end, 4 programs an SM (205 registers, 56 KB shared): 32 x 8k
# 153 us (128-key tiles: 165) and 256 x 2k 295 us (339) against the bf16 cache's 258 and 506; at
# 16 and fewer sequences the 128-key tiles measured faster (those rows ran while the other GPU of the
# machine ran the engine benchmark, and repeated cells differed by up to 1.7x: a lead, not a figure).
DECODE_CONFIG = {
    False: DecodeConfig(TILE_TOKENS, 4, 3, "to", False, 4, 128),
    True: DecodeConfig(128, 4, 5, "v", False, 2, None),
}
FP8_LARGE_BATCH_CONFIG = DecodeConfig(64, 2, 5, "v", True, 4, None)
FP8_LARGE_BATCH_PROGRAMS = 256


def decode_config(fp8: bool, num_seqs: int, num_kv_heads: int) -> DecodeConfig:
    """paged_decode's default configuration for a cache kind and batch shape."""
    if fp8 and num_seqs * num_kv_heads >= FP8_LARGE_BATCH_PROGRAMS:
        return FP8_LARGE_BATCH_CONFIG
    return DECODE_CONFIG[fp8]


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slots_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_kv_heads,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_cb,
    stride_ct,
    stride_ch,
    FP8_MAX,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    FP8: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + tok).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < num_kv_heads)[:, None] & (slot >= 0)
    dst = (
        (slot // BLOCK_SIZE) * stride_cb
        + (slot % BLOCK_SIZE) * stride_ct
        + h[:, None] * stride_ch
        + d[None, :]
    )
    k = tl.load(k_ptr + tok * stride_kn + h[:, None] * stride_kh + d[None, :], mask=mask, other=0.0)
    v = tl.load(v_ptr + tok * stride_vn + h[:, None] * stride_vh + d[None, :], mask=mask, other=0.0)
    if FP8:
        # correctly rounded division and round-to-nearest-even: the same bits as torch's write
        k = tl.clamp(tl.div_rn(k.to(tl.float32), tl.load(k_scale_ptr)), -FP8_MAX, FP8_MAX)
        v = tl.clamp(tl.div_rn(v.to(tl.float32), tl.load(v_scale_ptr)), -FP8_MAX, FP8_MAX)
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    slot_mapping: torch.Tensor,  # [num_tokens]; negative slots are skipped
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    k_cache, v_cache = kv_cache
    n, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape and k_cache.shape[2:] == (num_kv_heads, head_dim)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale")
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if n == 0:
        return
    dummy = slot_mapping  # never read when not fp8
    _write_kv_kernel[(n,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k_scale if fp8 else dummy,
        v_scale if fp8 else dummy,
        num_kv_heads,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        float(torch.finfo(k_cache.dtype).max) if fp8 else 0.0,
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        FP8=fp8,
    )


@triton.jit
def _fp16_query(q, qk_scale):
    """q (bf16) as fp16 for tl.dot with fp8 K/V tiles, which convert to fp16 natively on Hopper
    (fp8 -> bf16 has no single instruction). Every bf16 value up to 65504 is exact in fp16 apart from
    subnormals below 6.1e-5 (absolute error < 3e-8). Larger |q| would overflow fp16, so the tile is
    divided by a power of two bringing its largest |q| under 2**15 (exact) and the scores multiplied
    back through qk_scale: one reduction per program, outside the key loop."""
    qf = q.to(tl.float32)
    qmax = tl.max(tl.max(tl.abs(qf), 1), 0)
    shift = tl.where(qmax > 32768.0, tl.exp2(tl.ceil(tl.log2(qmax)) - 15.0), 1.0)
    return (qf / shift).to(tl.float16), qk_scale * shift


@triton.jit
def _fp8_to_f16(x, E5M2: tl.constexpr):
    """fp8 -> fp16 with cvt.rn.f16x2.{e4m3,e5m2}x2 (sm_89+), four bytes a call. Declared impure so
    that Triton cannot move it: an elementwise `.to()` is hoisted past the layout change into the
    dot operand, so the fp8 bytes (not fp16 pairs) get re-laid out, and V (the transposed operand
    of P @ V) is then read from shared memory one byte at a time (LDS.U8, 128 a thread per
    128-key tile). Converted here, the fp16 tile goes through shared memory once and ldmatrix
    reads it back (SASS of both: `git show c2170a2:benchmarks/decode_sass.py`)."""
    if E5M2:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e5m2x2 $0, lo; cvt.rn.f16x2.e5m2x2 $1, hi; }",
            "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4,
        )  # fmt: skip
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4,
    )  # fmt: skip


@triton.jit
def _decode_tile(q, acc, m_i, l_i, start, hi, k_ptr, v_ptr, table_row, kv_off, qk_scale, stride_kb,
                 stride_kt, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                 MASKED: tl.constexpr, CVT_K: tl.constexpr, CVT_V: tl.constexpr, E5M2: tl.constexpr,
                 SUM_AT_END: tl.constexpr):  # fmt: skip
    """One K/V tile of the online softmax (scores in the exp2 domain: qk_scale carries log2(e)).
    MASKED=False: every key start .. start + TILE - 1 is below hi. SUM_AT_END: l_i is [rows, TILE]
    of per-column partial sums (no cross-warp reduction per tile)."""
    t = tl.arange(0, TILE)
    d = tl.arange(0, HEAD_DIM)
    pos = start + t
    if TILE % BLOCK_SIZE == 0:
        # start is a multiple of TILE, so of BLOCK_SIZE: the divisions fold into constants
        block_idx = start // BLOCK_SIZE + t // BLOCK_SIZE
        in_block = t % BLOCK_SIZE
    else:
        block_idx = pos // BLOCK_SIZE
        in_block = pos % BLOCK_SIZE
    if MASKED:
        valid = pos < hi
        block = tl.load(table_row + block_idx, mask=valid, other=0)
    else:
        block = tl.load(table_row + block_idx)
    off = block.to(tl.int64) * stride_kb + (in_block * stride_kt + kv_off)
    if MASKED:
        k = tl.load(k_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + off[:, None] + d[None, :])
    if CVT_K:
        k = _fp8_to_f16(k, E5M2)
    s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
    if MASKED:
        s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha[:, None] + p if SUM_AT_END else l_i * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    else:
        v = tl.load(v_ptr + off[:, None] + d[None, :])
    if CVT_V:
        v = _fp8_to_f16(v, E5M2)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return acc, m_new, l_i


@triton.jit
def _gpu_fence(ON: tl.constexpr):
    """fence.acq_rel.gpu (CUDA's __threadfence) where ON (a GPU, not the interpreter): this thread's
    stores are performed at GPU scope (in L2) before its later memory operations. A CTA barrier alone
    orders them only at CTA scope, and the decode loop's K/V tiles are read with L2-only async copies."""
    if ON:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rope_query_store_kv(
    q_ptr, nk_ptr, nv_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, slots_ptr, k_scale_ptr, v_scale_ptr, seq, kv_head,
    heads, gmask, writer, stride_qn, stride_qh, stride_nkn, stride_nkh, stride_nvn, stride_nvh, stride_cn,
    stride_sn, stride_kb, stride_kt, stride_kh, FP8_MAX, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, FP8: tl.constexpr, FENCE: tl.constexpr,
):  # fmt: skip
    """The fused decode's prologue (triton_ops._rope_cache_kernel's arithmetic and roundings, so the
    cache and the scores get the same bits): the program's query heads rotated, returned as the
    [GROUP_PAD, HEAD_DIM] tile; when `writer` (the program whose split holds the new token) the new
    token's k (rotated) and v of this KV head stored into its slot. A barrier then makes the store
    visible to the program's own tile loads."""
    HALF: tl.constexpr = HEAD_DIM // 2
    dh = tl.arange(0, HALF)
    cos = tl.load(cos_ptr + seq * stride_cn + dh).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + seq * stride_sn + dh).to(tl.float32)[None, :]
    base = q_ptr + seq * stride_qn + heads[:, None] * stride_qh + dh[None, :]
    x1 = tl.load(base, mask=gmask[:, None], other=0.0)
    x2 = tl.load(base + HALF, mask=gmask[:, None], other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    q1 = (a * cos - b * sin).to(x1.dtype)
    q2 = (b * cos + a * sin).to(x1.dtype)
    # [rows, HALF] x 2 -> [rows, 2, HALF] -> [rows, HEAD_DIM]: the halves side by side
    q = tl.reshape(tl.permute(tl.join(q1, q2), (0, 2, 1)), (GROUP_PAD, HEAD_DIM))
    if writer:
        slot = tl.load(slots_ptr + seq).to(tl.int64)
        cm = (dh >= 0)[None, :] & (slot >= 0)  # negative slots are skipped, as write_kv does
        kb = nk_ptr + seq * stride_nkn + kv_head * stride_nkh + dh[None, :]
        y1 = tl.load(kb)
        y2 = tl.load(kb + HALF)
        ka, kb2 = y1.to(tl.float32), y2.to(tl.float32)
        k1 = (ka * cos - kb2 * sin).to(y1.dtype)
        k2 = (kb2 * cos + ka * sin).to(y1.dtype)
        vb = nv_ptr + seq * stride_nvn + kv_head * stride_nvh + dh[None, :]
        v1 = tl.load(vb)
        v2 = tl.load(vb + HALF)
        dst = (
            (slot // BLOCK_SIZE) * stride_kb
            + (slot % BLOCK_SIZE) * stride_kt
            + kv_head * stride_kh
            + dh[None, :]
        )
        ty = kc_ptr.dtype.element_ty
        if FP8:
            ks = tl.load(k_scale_ptr)
            vs = tl.load(v_scale_ptr)
            k1 = tl.clamp(tl.div_rn(k1.to(tl.float32), ks), -FP8_MAX, FP8_MAX)
            k2 = tl.clamp(tl.div_rn(k2.to(tl.float32), ks), -FP8_MAX, FP8_MAX)
            v1 = tl.clamp(tl.div_rn(v1.to(tl.float32), vs), -FP8_MAX, FP8_MAX)
            v2 = tl.clamp(tl.div_rn(v2.to(tl.float32), vs), -FP8_MAX, FP8_MAX)
            tl.store(kc_ptr + dst, k1.to(ty, fp_downcast_rounding="rtne"), mask=cm)
            tl.store(kc_ptr + dst + HALF, k2.to(ty, fp_downcast_rounding="rtne"), mask=cm)
            tl.store(vc_ptr + dst, v1.to(ty, fp_downcast_rounding="rtne"), mask=cm)
            tl.store(vc_ptr + dst + HALF, v2.to(ty, fp_downcast_rounding="rtne"), mask=cm)
        else:
            tl.store(kc_ptr + dst, k1.to(ty), mask=cm)
            tl.store(kc_ptr + dst + HALF, k2.to(ty), mask=cm)
            tl.store(vc_ptr + dst, v1.to(ty), mask=cm)
            tl.store(vc_ptr + dst + HALF, v2.to(ty), mask=cm)
        _gpu_fence(FENCE)
    tl.debug_barrier()
    return q


@triton.jit(do_not_specialize=["stride_tn"])  # the block-table width varies by step (triton_varlen.py)
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    part_o_ptr,
    part_lse_ptr,
    tables_ptr,
    lengths_ptr,
    k_scale_ptr,
    v_scale_ptr,
    nk_ptr,  # ROPE: the new token's k and v ([n, kv_heads, head_dim] views), RoPE tables, slots
    nv_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    scale,
    split_tokens,
    stride_qn,
    stride_qh,
    stride_on,
    stride_oh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_tn,
    stride_nkn,
    stride_nkh,
    stride_nvn,
    stride_nvh,
    stride_cn,
    stride_sn,
    FP8_MAX,
    num_heads,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FP8: tl.constexpr,
    F16_DOT: tl.constexpr,
    CVT_K: tl.constexpr,
    CVT_V: tl.constexpr,
    E5M2: tl.constexpr,
    STAGES: tl.constexpr,
    SUM_AT_END: tl.constexpr,
    ROPE: tl.constexpr,  # q unrotated: RoPE on q, and the new token's k/v stored, in this launch
    FENCE: tl.constexpr,  # a GPU (fence.acq_rel.gpu), not Triton's interpreter
    HEADS_FASTEST: tl.constexpr,  # grid (kv_heads, n, splits): a sequence's programs start together
    USE_PDL: tl.constexpr,
):
    triton_pdl.start(USE_PDL)
    if HEADS_FASTEST:
        kv_head = tl.program_id(0)
        seq = tl.program_id(1)
    else:
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lengths_ptr + seq).to(tl.int32)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    gmask = g < GROUP
    if ROPE:
        q = _rope_query_store_kv(
            q_ptr, nk_ptr, nv_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slots_ptr, k_scale_ptr, v_scale_ptr, seq,
            kv_head, heads, gmask, split == (ctx - 1) // split_tokens, stride_qn, stride_qh, stride_nkn,
            stride_nkh, stride_nvn, stride_nvh, stride_cn, stride_sn, stride_kb, stride_kt, stride_kh, FP8_MAX,
            GROUP_PAD, HEAD_DIM, BLOCK_SIZE, FP8, FENCE,
        )  # fmt: skip
    else:
        q = tl.load(
            q_ptr + seq * stride_qn + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0
        )
    qk_scale = scale * 1.4426950408889634  # log2(e): the softmax runs on exp2
    if FP8:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    if F16_DOT:
        # K, V and P follow q's dtype below: fp16 for the dots
        q, qk_scale = _fp16_query(q, qk_scale)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD, TILE], tl.float32) if SUM_AT_END else tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    lo = split * split_tokens
    hi = tl.minimum(ctx, lo + split_tokens)
    table_row = tables_ptr + seq.to(tl.int64) * stride_tn
    kv_off = kv_head * stride_kh
    num_full = tl.maximum(hi - lo, 0) // TILE
    for i in tl.range(0, num_full, num_stages=STAGES):
        acc, m_i, l_i = _decode_tile(
            q, acc, m_i, l_i, lo + i * TILE, hi, k_ptr, v_ptr, table_row, kv_off, qk_scale, stride_kb,
            stride_kt, HEAD_DIM, BLOCK_SIZE, TILE, False, CVT_K, CVT_V, E5M2, SUM_AT_END,
        )  # fmt: skip
    tail = lo + num_full * TILE
    if tail < hi:
        acc, m_i, l_i = _decode_tile(
            q, acc, m_i, l_i, tail, hi, k_ptr, v_ptr, table_row, kv_off, qk_scale, stride_kb, stride_kt,
            HEAD_DIM, BLOCK_SIZE, TILE, True, CVT_K, CVT_V, E5M2, SUM_AT_END,
        )  # fmt: skip
    if SUM_AT_END:
        l_i = tl.sum(l_i, 1)
    if FP8:
        acc = acc * tl.load(v_scale_ptr)
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        o_off = seq * stride_on + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=gmask[:, None])
    else:
        # an empty split (lo >= ctx) leaves l_i == 0: its weight in the merge is exp(-inf) == 0
        nonempty = l_i > 0
        out = tl.where(nonempty[:, None], acc / tl.where(nonempty, l_i, 1.0)[:, None], 0.0)
        # the merge works in natural logs; m_i is in log2 units
        lse = tl.where(
            nonempty, m_i * 0.6931471805599453 + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf")
        )
        row = (seq * num_heads + heads) * NUM_SPLITS + split  # [n, num_heads, NUM_SPLITS]
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM + d[None, :], out, mask=gmask[:, None])
        tl.store(part_lse_ptr + row, lse, mask=gmask)


@triton.jit
def _merge_splits_kernel(
    part_o_ptr,
    part_lse_ptr,
    o_ptr,
    stride_on,
    stride_oh,
    num_heads,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    triton_pdl.start(USE_PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DIM)
    row = (seq * num_heads + head) * NUM_SPLITS + s
    lse = tl.load(part_lse_ptr + row)
    w = tl.exp(lse - tl.max(lse, 0))
    parts = tl.load(part_o_ptr + row[:, None] * HEAD_DIM + d[None, :])
    out = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    tl.store(o_ptr + seq * stride_on + head * stride_oh + d, out.to(o_ptr.dtype.element_ty))


@functools.cache
def _num_sms(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device, programs_per_sm: int = 4
) -> int:
    """Context splits per (sequence, KV head): enough programs to fill the SMs' resident slots once
    (a first wave that fills >= 90 % of them is not split further: each split adds a pipeline fill
    and a share of the merge), each split at least MIN_SPLIT_TOKENS long and none below a
    MIN_SPLIT_CONTEXT-token context, a power of two (the merge kernel's tile). From shapes only."""
    if max_context < MIN_SPLIT_CONTEXT:
        return 1
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    slots = 0.9 * programs_per_sm * sms
    want = min(
        math.ceil(slots / max(1, num_seqs * num_kv_heads)), max_context // MIN_SPLIT_TOKENS, MAX_SPLITS
    )
    if want <= 1:
        return 1
    return int(triton.next_power_of_2(want))


def check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """True for an fp8 cache; asserts the layout the kernels assume."""
    assert v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    fp8 = k_cache.dtype in FP8_DTYPES
    if not fp8 and k_cache.dtype != q.dtype:
        raise ValueError(f"the KV cache ({k_cache.dtype}) must have the query's dtype ({q.dtype}) or be fp8")
    head_dim = q.shape[-1]
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise NotImplementedError(
            f"not supported: Triton attention needs a power-of-two head_dim >= 16, got {head_dim}"
        )
    return fp8


@functools.cache
def _has_fp8_cvt(device_index: int) -> bool:
    """cvt.rn.f16x2.e4m3x2 / e5m2x2 exist from sm_89 (Ada, Hopper) on."""
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def fp8_cvt_available(q: torch.Tensor, fp8: bool, fp16_dot: bool, tile_elements: int, num_warps: int) -> bool:
    """Whether `_fp8_to_f16` may convert a K/V tile: fp8 tiles feeding fp16 dots, on a GPU that has
    the instruction, with 4 bytes a thread at least (the helper takes 4 at a time)."""
    return (
        fp8
        and (fp16_dot or q.dtype == torch.float16)
        and q.device.type == "cuda"
        and _has_fp8_cvt(q.device.index or 0)
        and tile_elements >= 4 * 32 * num_warps
    )


@dataclass(frozen=True)
class RopeStore:
    """What paged_decode needs to apply RoPE and store the new token itself: k and v [n, kv_heads,
    head_dim] (unrotated k; strided views of the QKV output are fine), the step's cos / sin tables
    ([n, ..., head_dim] with both halves equal, ops.rope_tables) and the new tokens' slots [n]
    (negative: not stored)."""

    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor

    def check(
        self, n: int, num_kv_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (self.k, self.v))
        if k.shape != (n, num_kv_heads, head_dim) or v.shape != k.shape:
            raise ValueError(f"rope: k and v must be [{n}, {num_kv_heads}, {head_dim}], got {tuple(k.shape)}")
        half = head_dim // 2
        if head_dim % 2 or half & (half - 1):
            raise NotImplementedError(
                f"not supported: fused RoPE needs a power-of-two head_dim/2, got {head_dim}"
            )
        cos, sin = self.cos.reshape(n, -1), self.sin.reshape(n, -1)
        if cos.shape[1] != head_dim or sin.shape != cos.shape or cos.stride(-1) != 1 or sin.stride(-1) != 1:
            raise ValueError(f"rope: cos and sin must be [{n}, {head_dim}] rows, got {tuple(self.cos.shape)}")
        if self.slots.shape != (n,):
            raise ValueError(f"rope: slots must be [{n}], got {tuple(self.slots.shape)}")
        return k, v, cos, sin, self.slots


def paged_decode(
    q: torch.Tensor,  # [n, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [n, max_blocks] (int32 or int64)
    context_lens: torch.Tensor,  # [n], 1 <= context_lens[i] <= max_blocks * block_size
    scale: float,
    k_scale: torch.Tensor | None = None,  # float32 one-element tensors; needed for fp8 caches
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,  # None: choose_num_splits
    tile: int | None = None,  # keys per loop step; None: decode_config (tuning knobs: the benchmark
    num_warps: int | None = None,  # times others)
    num_stages: int | None = None,
    fp16_dot: bool | None = None,  # None: fp16 dots for a bf16 query over an fp8 cache
    fp8_cvt: str | None = None,  # one of FP8_CONVERSIONS; None: decode_config where the GPU has the cvt
    row_sum_at_end: bool | None = None,  # None: decode_config
    rope: RopeStore | None = None,
    heads_fastest: bool = True,  # grid order (see DECODE_GRID_ORDER); False: sequences fastest
) -> torch.Tensor:
    """Attention of each sequence's one query token over its first context_lens[i] cached tokens.
    With `rope`, q is not yet rotated and the new token (position context_lens[i] - 1) is not yet in
    the cache: the kernel applies RoPE to q and stores the rotated k and v into `rope.slots` first
    (triton_ops.rope_and_cache's arithmetic), one launch for the three."""
    n, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_dim = k_cache.shape
    assert kv_dim == head_dim and num_heads % num_kv_heads == 0 and q.stride(-1) == 1
    fp8 = check_cache(q, k_cache, v_cache)
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale")
    config = decode_config(fp8, n, num_kv_heads)
    # the register cap belongs to the default tile and warps
    max_registers = config.max_registers if (tile or config.tile, num_warps or config.num_warps) == (
        config.tile, config.num_warps) else None  # fmt: skip
    tile = tile or config.tile
    num_warps = num_warps or config.num_warps
    num_stages = num_stages or config.num_stages
    if row_sum_at_end is None:
        row_sum_at_end = config.row_sum_at_end
    if fp16_dot is None:
        fp16_dot = fp8 and q.dtype == torch.bfloat16
    if fp16_dot and q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"fp16 dots need a 16-bit query, got {q.dtype}")
    cvt_ok = fp8_cvt_available(q, fp8, fp16_dot, tile * head_dim, num_warps)
    if fp8_cvt is None:
        fp8_cvt = config.fp8_cvt if cvt_ok else "to"
    if fp8_cvt not in FP8_CONVERSIONS:
        raise ValueError(f"fp8_cvt must be one of {FP8_CONVERSIONS}, got {fp8_cvt!r}")
    if fp8_cvt != "to" and not cvt_ok:
        raise ValueError(
            f"not supported: fp8_cvt={fp8_cvt!r} needs an fp8 cache, fp16 dots, a CUDA GPU of sm_89 or "
            "later and tile * head_dim >= 128 * num_warps"
        )
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 16, got {tile}")
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if n == 0:
        return out
    max_context = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(n, num_kv_heads, max_context, q.device, config.programs_per_sm)
    assert num_splits >= 1 and num_splits & (num_splits - 1) == 0
    split_tokens = -(-max_context // num_splits)
    split_tokens = -(-split_tokens // tile) * tile
    if num_splits > 1:
        part_o = torch.empty(n, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(n, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # not touched
    dummy = context_lens
    if rope is not None:
        nk, nv, cos, sin, slots = rope.check(n, num_kv_heads, head_dim)
    else:
        nk = nv = cos = sin = q  # not read
        slots = dummy
    pdl = triton_pdl.launch_args(q)
    # a grid's second dimension holds at most 65,535 programs: more sequences go on the first
    heads_fastest = heads_fastest and n <= MAX_GRID_Y
    grid = (num_kv_heads, n, num_splits) if heads_fastest else (n, num_kv_heads, num_splits)
    _paged_decode_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        part_o,
        part_lse,
        block_tables,
        context_lens,
        k_scale if fp8 else dummy,
        v_scale if fp8 else dummy,
        nk,
        nv,
        cos,
        sin,
        slots,
        scale,
        split_tokens,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        nk.stride(0),
        nk.stride(1),
        nv.stride(0),
        nv.stride(1),
        cos.stride(0),
        sin.stride(0),
        float(torch.finfo(k_cache.dtype).max) if fp8 else 0.0,
        num_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE=tile,
        NUM_SPLITS=num_splits,
        FP8=fp8,
        F16_DOT=fp16_dot,
        CVT_K=fp8_cvt == "kv",
        CVT_V=fp8_cvt in ("v", "kv"),
        E5M2=k_cache.dtype == torch.float8_e5m2,
        STAGES=num_stages,
        SUM_AT_END=row_sum_at_end,
        ROPE=rope is not None,
        FENCE=q.is_cuda,
        HEADS_FASTEST=heads_fastest,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl,
        **({"maxnreg": max_registers} if max_registers and q.device.type == "cuda" else {}),
    )
    if num_splits > 1:
        _merge_splits_kernel[(n, num_heads)](
            part_o,
            part_lse,
            out,
            out.stride(0),
            out.stride(1),
            num_heads,
            HEAD_DIM=head_dim,
            NUM_SPLITS=num_splits,
            **pdl,
        )
    return out


def supports(
    q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor] | None, meta: AttentionMetadata
) -> bool:
    """Whether paged_attention_triton takes this call (a cache of q's dtype or fp8, power-of-two
    head_dim, and a decode-only batch or varlen metadata). attention.py sends only 16-bit q here."""
    if kv_cache is None or meta.slot_mapping is None:
        return False
    cache_dtype = kv_cache[0].dtype
    if cache_dtype != q.dtype and cache_dtype not in FP8_DTYPES:
        return False
    head_dim = q.shape[-1]
    if head_dim & (head_dim - 1) or head_dim < 16:
        return False
    if not meta.prefills:
        return meta.num_decodes > 0
    return meta.varlen is not None


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_written: bool = False,
) -> Any:
    """attention.paged_attention's contract, for the calls `supports` accepts: write k/v into the
    cache (unless kv_written: ops.rope_and_cache did), then the decode rows run paged_decode and the
    prefill chunks (chunked or with cached prefixes, verification rows) one varlen launch. In a step
    that mixes them the decode rows once ran inside the varlen launch, in its row tiles (up to 128
    rows for a decode's GQA group of 4-7): the 8B's 8,192-token steps with 190-250 decodes took
    204-208 ms that way and 197-201 ms through paged_decode (H200)."""
    if not supports(q, kv_cache, meta):
        raise NotImplementedError(
            "not supported by the Triton attention path (see triton_attention.supports)"
        )
    assert kv_cache is not None and meta.slot_mapping is not None
    if not kv_written:
        write_kv(k, v, kv_cache, meta.slot_mapping, k_scale, v_scale)
    out: torch.Tensor | None = None
    if meta.prefills:
        from llmdeploy_engine.kernels.triton_varlen import varlen_attention

        assert meta.varlen is not None
        out = varlen_attention(q, kv_cache[0], kv_cache[1], meta.varlen, scale, k_scale, v_scale)
    n = meta.num_decodes
    if n == 0:
        assert out is not None
        return out
    tables = meta.decode_blocks.view(n, -1)
    lengths = meta.decode_context_lens()  # per step in the metadata: no reduction per layer
    # every token a decode, in order (decode_token_index is arange(n)): no gather, no scatter
    in_order = out is None and meta.decodes_in_order and n == q.shape[0]
    qd = q if in_order else q[meta.decode_token_index]
    decode_out = paged_decode(qd, kv_cache[0], kv_cache[1], tables, lengths, scale, k_scale, v_scale)
    if in_order:
        return decode_out
    if out is None:
        out = torch.empty_like(q)
    out[meta.decode_token_index] = decode_out  # the varlen launch left the decode rows unwritten
    return out
