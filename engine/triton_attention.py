"""Paged attention in Triton: the KV-cache write, decode (one token per sequence, split-KV) and a
varlen kernel for everything else, all reading K/V in place through block tables.

The pure-torch path (attention.py) copies every sequence's blocks into a padded tensor and runs SDPA
over the copy (decodes) or one SDPA call per prefill chunk. Here:

- `write_kv`: one launch stores the step's k and v into their slots (fp8 caches: x / scale,
  saturated to the format's max, as the contract in attention.py says).
- `paged_decode`: one query token per sequence; programs per (sequence, KV head, split). The query
  heads of a GQA group share each K/V tile. Long contexts with few sequences split the context
  (flash-decoding) so every SM works; a second small kernel merges the splits by log-sum-exp.
- `varlen_attention` (triton_varlen.py): any mix of prefill chunks, prefix hits, chunked prefill and
  multi-token decode, in one launch.

fp8 caches: K/V tiles are loaded as fp8 and converted exactly to the dot dtype; the per-tensor scales
are folded in once (k_scale into the softmax scale, v_scale into the output), so
read = stored.float() * scale holds. A bf16 query over an fp8 cache runs its dots in fp16 (q, K, V
and P): Hopper converts e4m3/e5m2 to fp16 in one instruction but has no fp8 -> bf16 conversion, and
fp16 holds every fp8 value and (with the power-of-two rescale in `_fp16_query`) every bf16 query.
paged_decode over fp8 takes 128-key tiles (half the bytes of a bf16 tile of 64); `PREFETCH` (the
next tile loaded before the current one's math) is a measured alternative, off by default. Grid sizes come only from tensor shapes and host ints carried by
the metadata, never from tensor values, so every launch here can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl
from llmdeploy_engine.attention import AttentionMetadata

TILE_TOKENS = 64
MAX_SPLITS = 32
MIN_SPLIT_TOKENS = 256  # below this a split's partial result costs more than its parallelism gains
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# paged_decode's (keys per tile, warps, pipeline stages, prefetch), by whether the cache is fp8.
# H200, Llama-3.1-8B layer, 32 x 8k, kernel only, e4m3 (benchmarks/gpu_kernels.py --fp8-only):
# bf16 dots tile 64 365 us; fp16 dots 334; + prefetch 291; fp16 dots tile 128 no prefetch 260 (the
# bf16 cache: 263). Prefetch with 128-key tiles spills (890 us), so it stays off there.
DECODE_CONFIG = {False: (TILE_TOKENS, 4, 3, False), True: (128, 4, 3, False)}


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
def _load_kv_tile(k_ptr, v_ptr, table_row, pos, hi, kv_head, stride_kb, stride_kt, stride_kh,
                  HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):  # fmt: skip
    """K and V rows at positions pos (< hi; others read as 0 without touching memory), as stored."""
    valid = pos < hi
    d = tl.arange(0, HEAD_DIM)
    block = tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0)
    off = block.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
    k = tl.load(k_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    v = tl.load(v_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    return k, v


@triton.jit
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
    num_heads,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FP8: tl.constexpr,
    F16_DOT: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lengths_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    gmask = g < GROUP
    q = tl.load(
        q_ptr + seq * stride_qn + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0
    )
    qk_scale = scale
    if FP8:
        qk_scale = scale * tl.load(k_scale_ptr)
    if F16_DOT:
        # K, V and P follow q's dtype below: fp16 for the dots
        q, qk_scale = _fp16_query(q, qk_scale)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    t = tl.arange(0, TILE)
    lo = split * split_tokens
    hi = tl.minimum(ctx, lo + split_tokens)
    table_row = tables_ptr + seq * stride_tn
    if PREFETCH:
        # the next tile's K/V are loaded (as stored) before this tile's math: two tiles in flight
        # per program whatever the compiler's pipelining does with converted loads
        k_raw, v_raw = _load_kv_tile(k_ptr, v_ptr, table_row, lo + t, hi, kv_head, stride_kb, stride_kt,
                                     stride_kh, HEAD_DIM, BLOCK_SIZE)  # fmt: skip
        for start in range(lo, hi, TILE):
            k = k_raw.to(q.dtype)
            v = v_raw.to(q.dtype)
            k_raw, v_raw = _load_kv_tile(k_ptr, v_ptr, table_row, start + TILE + t, hi, kv_head,
                                         stride_kb, stride_kt, stride_kh, HEAD_DIM, BLOCK_SIZE)  # fmt: skip
            valid = start + t < hi
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
            m_i = m_new
    else:
        for start in range(lo, hi, TILE):
            pos = start + t
            valid = pos < hi
            block = tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0)
            off = block.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
            k = tl.load(k_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
            m_i = m_new
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
        lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
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
):
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


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Context splits per (sequence, KV head): enough programs for ~2 per SM, each split at least
    MIN_SPLIT_TOKENS long, a power of two (the merge kernel's tile). From shapes only."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    want = min(-(-2 * sms // max(1, num_seqs * num_kv_heads)), max_context // MIN_SPLIT_TOKENS, MAX_SPLITS)
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
    tile: int | None = None,  # keys per loop step; None: DECODE_CONFIG (tuning knobs: the benchmark
    num_warps: int | None = None,  # times others)
    num_stages: int | None = None,
    fp16_dot: bool | None = None,  # None: fp16 dots for a bf16 query over an fp8 cache
    prefetch: bool | None = None,  # load the next K/V tile before this one's math; None: DECODE_CONFIG
) -> torch.Tensor:
    """Attention of each sequence's one query token over its first context_lens[i] cached tokens."""
    n, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_dim = k_cache.shape
    assert kv_dim == head_dim and num_heads % num_kv_heads == 0 and q.stride(-1) == 1
    fp8 = check_cache(q, k_cache, v_cache)
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale")
    default_tile, default_warps, default_stages, default_prefetch = DECODE_CONFIG[fp8]
    prefetch = default_prefetch if prefetch is None else prefetch
    tile = tile or default_tile
    num_warps = num_warps or default_warps
    num_stages = num_stages or default_stages
    if fp16_dot is None:
        fp16_dot = fp8 and q.dtype == torch.bfloat16
    if fp16_dot and q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"fp16 dots need a 16-bit query, got {q.dtype}")
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if n == 0:
        return out
    max_context = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(n, num_kv_heads, max_context, q.device)
    assert num_splits >= 1 and num_splits & (num_splits - 1) == 0
    split_tokens = -(-max_context // num_splits)
    split_tokens = -(-split_tokens // tile) * tile
    if num_splits > 1:
        part_o = torch.empty(n, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(n, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # not touched
    dummy = context_lens
    _paged_decode_kernel[(n, num_kv_heads, num_splits)](
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
        num_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE=tile,
        NUM_SPLITS=num_splits,
        FP8=fp8,
        F16_DOT=fp16_dot,
        PREFETCH=prefetch,
        num_warps=num_warps,
        num_stages=num_stages,
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
    cache (unless kv_written: ops.rope_and_cache did), then decode-only batches run paged_decode and
    everything else one varlen launch."""
    if not supports(q, kv_cache, meta):
        raise NotImplementedError(
            "not supported by the Triton attention path (see triton_attention.supports)"
        )
    assert kv_cache is not None and meta.slot_mapping is not None
    if not kv_written:
        write_kv(k, v, kv_cache, meta.slot_mapping, k_scale, v_scale)
    if not meta.prefills:
        n = meta.num_decodes
        tables = meta.decode_blocks.view(n, -1)
        lengths = meta.decode_context_lens()  # per step in the metadata: no reduction per layer
        # every token a decode, in order (decode_token_index is arange(n)): no gather, no scatter
        in_order = meta.decodes_in_order and n == q.shape[0]
        qd = q if in_order else q[meta.decode_token_index]
        decode_out = paged_decode(qd, kv_cache[0], kv_cache[1], tables, lengths, scale, k_scale, v_scale)
        if in_order:
            return decode_out
        out = torch.empty_like(q)
        out[meta.decode_token_index] = decode_out
        return out
    from llmdeploy_engine.triton_varlen import varlen_attention

    assert meta.varlen is not None
    return varlen_attention(q, kv_cache[0], kv_cache[1], meta.varlen, scale, k_scale, v_scale)
