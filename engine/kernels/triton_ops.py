"""Fused elementwise kernels of the decoder (Triton): RMSNorm with the residual add, RoPE on q and k
(alone, or with the store of the rotated k and v into the paged KV cache), SiLU(gate) * up.

`ops.py` sends 16-bit CUDA tensors here. Each function keeps the contract of its pure-torch twin in
ops.py and computes in float32, rounding once at the end, so it stays within bf16 rounding of the
torch version (which rounds after every elementwise op). One launch replaces the 6-10 small kernels
eager torch runs for each (casts, pow, mean, rsqrt, mul, add; slices, neg, cat for rotate_half).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from llmdeploy_engine.kernels import triton_pdl


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    eps,
    hidden,
    heads,
    stride_x,
    stride_xh,
    stride_r,
    stride_o,
    stride_s,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    triton_pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # x's rows may be the heads of a strided [n, heads, hidden] view (heads == 1: plain rows)
    x = tl.load(x_ptr + (row // heads) * stride_x + (row % heads) * stride_xh + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # torch's add: float32, one rounding
        tl.store(sum_ptr + row * stride_s + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    var = tl.sum(x32 * x32, 0) / hidden
    normed = (x32 * tl.rsqrt(var + eps)).to(x.dtype)  # ops.rms_norm casts before the weight
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) over the last axis; residual None: x is the residual."""
    shape = x.shape
    hidden = shape[-1]
    if residual is None and x.dim() == 3 and x.stride(-1) == 1:
        # [n, heads, head_dim] views of the fused QKV output (Qwen3's q/k norms): read in place,
        # where reshape would copy
        x2, heads, stride_x, stride_xh = x, shape[1], x.stride(0), x.stride(1)
        rows = shape[0] * shape[1]
    else:
        x2 = x.reshape(-1, hidden)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        heads, stride_x, stride_xh = 1, x2.stride(0), 0
        rows = x2.shape[0]
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    if residual is None:
        res2 = summed = out  # not read or written
    else:
        assert residual.shape == shape and residual.dtype == x.dtype
        res2 = residual.reshape(-1, hidden)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
        summed = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    if rows:
        block = triton.next_power_of_2(hidden)
        _add_rms_norm_kernel[(rows,)](
            x2,
            res2,
            weight,
            out,
            summed,
            eps,
            hidden,
            heads,
            stride_x,
            stride_xh,
            res2.stride(0),
            out.stride(0),
            summed.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
            **triton_pdl.launch_args(x2),
        )
    if residual is None:
        return out.view(shape), x
    return out.view(shape), summed.view(shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return add_rms_norm(x, None, weight, eps)[0]


@triton.jit
def _rope_heads(src_ptr, dst_ptr, tok, stride_n, stride_h, stride_on, stride_oh, h, mask, cos, sin, d,
                HALF: tl.constexpr):  # fmt: skip
    """Rotate the heads h (rows under mask) of token tok by neox RoPE from src into dst; returns the
    two rotated halves in the model dtype, as stored."""
    base = src_ptr + tok * stride_n + h[:, None] * stride_h + d[None, :]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    r1 = (a * cos - b * sin).to(x1.dtype)
    r2 = (b * cos + a * sin).to(x1.dtype)
    obase = dst_ptr + tok * stride_on + h[:, None] * stride_oh + d[None, :]
    tl.store(obase, r1, mask=mask)
    tl.store(obase + HALF, r2, mask=mask)
    return r1, r2


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    cos_ptr,
    sin_ptr,
    num_heads,
    num_kv_heads,
    stride_qn,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_qon,
    stride_qoh,
    stride_kon,
    stride_koh,
    stride_cn,
    stride_sn,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)
    # neox tables repeat the frequencies in both halves: the first half is all the kernel needs
    cos = tl.load(cos_ptr + tok * stride_cn + d).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + tok * stride_sn + d).to(tl.float32)[None, :]
    h = tl.arange(0, HEADS_PAD)
    hm = (h < num_heads)[:, None]
    _rope_heads(q_ptr, qo_ptr, tok, stride_qn, stride_qh, stride_qon, stride_qoh, h, hm, cos, sin, d, HALF)
    km = (h < num_kv_heads)[:, None]
    _rope_heads(k_ptr, ko_ptr, tok, stride_kn, stride_kh, stride_kon, stride_koh, h, km, cos, sin, d, HALF)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.apply_rope in one launch: q [n, heads, d], k [n, kv_heads, d], cos/sin [n, 1, d] neox
    tables (the two halves equal, as Model.rope_tables builds them)."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert k.shape[0] == n and k.shape[2] == head_dim and head_dim % 2 == 0
    half = head_dim // 2
    if half & (half - 1):
        raise NotImplementedError(
            f"not supported: Triton RoPE needs a power-of-two head_dim/2, got {head_dim}"
        )
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cos2, sin2 = cos.reshape(n, -1), sin.reshape(n, -1)
    assert cos2.shape[1] == head_dim and cos2.stride(-1) == 1 and sin2.stride(-1) == 1
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if n:
        _rope_kernel[(n,)](
            q,
            k,
            q_out,
            k_out,
            cos2,
            sin2,
            num_heads,
            num_kv_heads,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            q_out.stride(0),
            q_out.stride(1),
            k_out.stride(0),
            k_out.stride(1),
            cos2.stride(0),
            sin2.stride(0),
            HALF=half,
            HEADS_PAD=triton.next_power_of_2(max(num_heads, num_kv_heads)),
            num_warps=4,
        )
    return q_out, k_out


@triton.jit
def _rope_tables_kernel(pos_ptr, inv_freq_ptr, cos_ptr, sin_ptr, HALF: tl.constexpr, USE_PDL: tl.constexpr):
    triton_pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, HALF)
    # the same float32 product as the torch twin, then cos / sin in float32, one rounding
    freq = tl.load(pos_ptr + row).to(tl.float32) * tl.load(inv_freq_ptr + j)
    c = tl.cos(freq).to(cos_ptr.dtype.element_ty)
    s = tl.sin(freq).to(sin_ptr.dtype.element_ty)
    base = row * 2 * HALF
    tl.store(cos_ptr + base + j, c)
    tl.store(cos_ptr + base + HALF + j, c)
    tl.store(sin_ptr + base + j, s)
    tl.store(sin_ptr + base + HALF + j, s)


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.rope_tables in one launch (the torch twin takes ~7 a step): cos and sin [n, 1, 2 * half]
    of positions[:, None] * inv_freq, both halves equal. inv_freq float32 [half], half a power of two."""
    half = inv_freq.shape[0]
    assert inv_freq.dtype == torch.float32 and half & (half - 1) == 0
    n = positions.shape[0]
    cos = torch.empty((n, 1, 2 * half), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    if n:
        _rope_tables_kernel[(n,)](
            positions, inv_freq.contiguous(), cos, sin, HALF=half, num_warps=1, **triton_pdl.launch_args(cos)
        )
    return cos, sin


@triton.jit
def _silu_mul_kernel(
    gate_ptr,
    up_ptr,
    out_ptr,
    cols,
    stride_g,
    stride_u,
    stride_o,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    triton_pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < cols
    g = tl.load(gate_ptr + row * stride_g + c, mask=mask, other=0.0)
    u = tl.load(up_ptr + row * stride_u + c, mask=mask, other=0.0)
    g32 = g.to(tl.float32)
    # torch rounds F.silu's result to the input dtype before the product: the same two roundings
    act = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)
    out = act.to(tl.float32) * u.to(tl.float32)
    tl.store(out_ptr + row * stride_o + c, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ops.silu_mul in one launch. gate and up [..., cols] may be strided views (the two halves of
    the merged gate_up GEMM output): rows are read in place, the result is contiguous."""
    assert gate.shape == up.shape and gate.dtype == up.dtype
    shape = gate.shape
    cols = shape[-1]
    g2 = gate.reshape(-1, cols)  # a view for the merged GEMM's halves (unit column stride)
    u2 = up.reshape(-1, cols)
    if g2.stride(-1) != 1:
        g2 = g2.contiguous()
    if u2.stride(-1) != 1:
        u2 = u2.contiguous()
    rows = g2.shape[0]
    out = torch.empty((rows, cols), dtype=gate.dtype, device=gate.device)
    if rows and cols:
        block = min(1024, triton.next_power_of_2(cols))
        _silu_mul_kernel[(rows, triton.cdiv(cols, block))](
            g2,
            u2,
            out,
            cols,
            g2.stride(0),
            u2.stride(0),
            out.stride(0),
            BLOCK=block,
            num_warps=4,
            **triton_pdl.launch_args(out),
        )
    return out.view(shape)


@triton.jit
def _saturate(x, scale, FP8_MAX):
    """x / scale in float32, correctly rounded, clamped to the fp8 format's finite range."""
    return tl.clamp(tl.div_rn(x.to(tl.float32), scale), -FP8_MAX, FP8_MAX)


@triton.jit
def _rope_cache_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qo_ptr,
    ko_ptr,
    kc_ptr,
    vc_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_heads,
    num_kv_heads,
    stride_qn,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_qon,
    stride_qoh,
    stride_kon,
    stride_koh,
    stride_cn,
    stride_sn,
    stride_cb,
    stride_ct,
    stride_ch,
    FP8_MAX,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    FP8: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    triton_pdl.start(USE_PDL)
    tok = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)
    cos = tl.load(cos_ptr + tok * stride_cn + d).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + tok * stride_sn + d).to(tl.float32)[None, :]

    h = tl.arange(0, HEADS_PAD)
    hm = (h < num_heads)[:, None]
    _rope_heads(q_ptr, qo_ptr, tok, stride_qn, stride_qh, stride_qon, stride_qoh, h, hm, cos, sin, d, HALF)
    kh = tl.arange(0, KV_HEADS_PAD)
    km = (kh < num_kv_heads)[:, None]
    # rounded to the model dtype first: the cache holds what apply_rope then write_kv would store
    k1, k2 = _rope_heads(
        k_ptr, ko_ptr, tok, stride_kn, stride_kh, stride_kon, stride_koh, kh, km, cos, sin, d, HALF
    )
    vbase = v_ptr + tok * stride_vn + kh[:, None] * stride_vh + d[None, :]
    v1 = tl.load(vbase, mask=km, other=0.0)
    v2 = tl.load(vbase + HALF, mask=km, other=0.0)

    slot = tl.load(slots_ptr + tok).to(tl.int64)
    cm = km & (slot >= 0)  # negative slots are skipped, as triton_attention.write_kv does
    dst = (
        (slot // BLOCK_SIZE) * stride_cb
        + (slot % BLOCK_SIZE) * stride_ct
        + kh[:, None] * stride_ch
        + d[None, :]
    )
    if FP8:
        # triton_attention.write_kv's rounding: correctly rounded division, saturation, then
        # round-to-nearest-even (the bits torch's quantize stores)
        ks = tl.load(k_scale_ptr)
        vs = tl.load(v_scale_ptr)
        ty = kc_ptr.dtype.element_ty
        tl.store(kc_ptr + dst, _saturate(k1, ks, FP8_MAX).to(ty, fp_downcast_rounding="rtne"), mask=cm)
        tl.store(kc_ptr + dst + HALF, _saturate(k2, ks, FP8_MAX).to(ty, fp_downcast_rounding="rtne"), mask=cm)
        tl.store(vc_ptr + dst, _saturate(v1, vs, FP8_MAX).to(ty, fp_downcast_rounding="rtne"), mask=cm)
        tl.store(vc_ptr + dst + HALF, _saturate(v2, vs, FP8_MAX).to(ty, fp_downcast_rounding="rtne"), mask=cm)
    else:
        tl.store(kc_ptr + dst, k1.to(kc_ptr.dtype.element_ty), mask=cm)
        tl.store(kc_ptr + dst + HALF, k2.to(kc_ptr.dtype.element_ty), mask=cm)
        tl.store(vc_ptr + dst, v1.to(vc_ptr.dtype.element_ty), mask=cm)
        tl.store(vc_ptr + dst + HALF, v2.to(vc_ptr.dtype.element_ty), mask=cm)


def rope_and_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.rope_and_cache in one launch: (q, k) rotated as apply_rope returns them, and the rotated k
    and v stored into their slots of a cache of q's dtype or fp8 (with k_scale / v_scale)."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    k_cache, v_cache = kv_cache
    assert k.shape == (n, num_kv_heads, head_dim) and v.shape == k.shape
    assert k_cache.shape[2:] == (num_kv_heads, head_dim) and v_cache.shape == k_cache.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert slot_mapping.shape == (n,)
    half = head_dim // 2
    if head_dim % 2 or half & (half - 1):
        raise NotImplementedError(
            f"not supported: Triton RoPE needs a power-of-two head_dim/2, got {head_dim}"
        )
    fp8 = k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale")
    if not fp8 and k_cache.dtype != q.dtype:
        raise ValueError(f"the KV cache ({k_cache.dtype}) must have the query's dtype ({q.dtype}) or be fp8")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    cos2, sin2 = cos.reshape(n, -1), sin.reshape(n, -1)
    assert cos2.shape[1] == head_dim and cos2.stride(-1) == 1 and sin2.stride(-1) == 1
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if n:
        dummy = slot_mapping  # the scales are read only for fp8 caches
        _rope_cache_kernel[(n,)](
            q,
            k,
            v,
            q_out,
            k_out,
            k_cache,
            v_cache,
            cos2,
            sin2,
            slot_mapping,
            k_scale if fp8 else dummy,
            v_scale if fp8 else dummy,
            num_heads,
            num_kv_heads,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            q_out.stride(0),
            q_out.stride(1),
            k_out.stride(0),
            k_out.stride(1),
            cos2.stride(0),
            sin2.stride(0),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            float(torch.finfo(k_cache.dtype).max) if fp8 else 0.0,
            HALF=half,
            HEADS_PAD=triton.next_power_of_2(num_heads),
            KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
            BLOCK_SIZE=k_cache.shape[1],
            FP8=fp8,
            num_warps=4,
            **triton_pdl.launch_args(q_out),
        )
    return q_out, k_out


ARGMAX_BLOCK = 1024
ARGMAX_MAX_PARTS = 128


# `parts` varies with the row count and `out` may be any row of a window's [steps, rows] tensor (8-byte
# aligned for odd row counts): neither may pick a compiled variant, or a batch size or step seen first
# mid-run compiles one there (five compilations, ~0.6 s, once stalled a 0.5B model's throughput run)
@triton.jit(do_not_specialize=["parts"])
def _argmax_part_kernel(x_ptr, val_ptr, idx_ptr, V, stride_x, chunk, parts, BLOCK: tl.constexpr,
                        USE_PDL: tl.constexpr):  # fmt: skip
    """Stage 1: the first maximum of one chunk of one row (NaN counts as +inf, as torch.argmax ranks
    NaN highest); an empty chunk leaves (-inf, V)."""
    triton_pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    lo = part * chunk
    hi = tl.minimum(lo + chunk, V)
    best = float("-inf")
    best_idx = V
    for start in tl.range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + offs, mask=offs < hi, other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("inf"), x)
        m, i = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        # strictly greater: an equal maximum in a later tile is not the first; a chunk of -inf
        # keeps its first index
        take = (m > best) | (best_idx == V)
        best_idx = tl.where(take, start + i, best_idx)
        best = tl.where(take, m, best)
    tl.store(val_ptr + row * parts + part, best)
    tl.store(idx_ptr + row * parts + part, best_idx)


@triton.jit(do_not_specialize=["parts"], do_not_specialize_on_alignment=["out_ptr"])
def _argmax_merge_kernel(val_ptr, idx_ptr, out_ptr, V, parts, MAX_PARTS: tl.constexpr, USE_PDL: tl.constexpr):
    """Stage 2: the largest chunk maximum, the smallest index among equal ones (the `parts` chunks of
    the row; the masked tail counts as (-inf, V), which never wins)."""
    triton_pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, MAX_PARTS)
    live = p < parts
    vals = tl.load(val_ptr + row * parts + p, mask=live, other=float("-inf"))
    idxs = tl.load(idx_ptr + row * parts + p, mask=live, other=V)
    top = tl.max(vals, 0)
    idx = tl.min(tl.where((vals == top) & (idxs < V), idxs, V), 0)
    tl.store(out_ptr + row, idx.to(out_ptr.dtype.element_ty))


def argmax_parts(rows: int, vocab: int) -> int:
    """Chunks per row of argmax_rows: up to ARGMAX_MAX_PARTS, about 4,096 programs in all."""
    return triton.next_power_of_2(
        max(1, min(ARGMAX_MAX_PARTS, triton.cdiv(vocab, ARGMAX_BLOCK), 4096 // rows))
    )


def argmax_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for a 2-D float CUDA tensor (the greedy pick from the logits), in two
    launches spread over the GPU: torch's reduction runs one row on few SMs (the 8B's 128k-entry
    LM-head row: ~27 us on the H200). The first maximum of each row (NaN ranks highest, as in
    torch); into `out` (int64 [rows]) when given. One compiled variant per input dtype serves every
    row count and any `out`."""
    assert x.dim() == 2 and x.stride(-1) == 1, "argmax_rows takes [rows, V] with unit column stride"
    n, v = x.shape
    if out is None:
        out = torch.empty(n, dtype=torch.long, device=x.device)
    assert out.shape == (n,) and out.dtype == torch.long
    if n == 0:
        return out
    if v == 0:
        raise ValueError("argmax of an empty row")
    parts = argmax_parts(n, v)
    chunk = triton.cdiv(triton.cdiv(v, parts), ARGMAX_BLOCK) * ARGMAX_BLOCK
    vals = torch.empty((n, parts), dtype=torch.float32, device=x.device)
    idxs = torch.empty((n, parts), dtype=torch.int32, device=x.device)
    pdl = triton_pdl.launch_args(x)
    _argmax_part_kernel[(n, parts)](x, vals, idxs, v, x.stride(0), chunk, parts, BLOCK=ARGMAX_BLOCK, **pdl)
    _argmax_merge_kernel[(n,)](vals, idxs, out, v, parts, MAX_PARTS=ARGMAX_MAX_PARTS, num_warps=1, **pdl)
    return out
    if v == 0:
        raise ValueError("argmax of an empty row")
    parts = max(1, min(ARGMAX_MAX_PARTS, triton.cdiv(v, ARGMAX_BLOCK), 4096 // n))
    parts = triton.next_power_of_2(parts)
    chunk = triton.cdiv(triton.cdiv(v, parts), ARGMAX_BLOCK) * ARGMAX_BLOCK
    vals = torch.empty((n, parts), dtype=torch.float32, device=x.device)
    idxs = torch.empty((n, parts), dtype=torch.int32, device=x.device)
    pdl = triton_pdl.launch_args(x)
    _argmax_part_kernel[(n, parts)](
        x, vals, idxs, v, x.stride(0), chunk, PARTS=parts, BLOCK=ARGMAX_BLOCK, **pdl
    )
    _argmax_merge_kernel[(n,)](vals, idxs, out, v, PARTS=parts, num_warps=1, **pdl)
    return out
