"""Small-batch GEMV kernels for decode (Triton): y = x @ w.T for M <= 8 rows, with the elementwise op
before the projection fused into the same launch.

- `linear`: x @ w.T (+ bias), written in x's dtype, float32 (the LM head's logits) or into `out`
  (a [M, N] view with any row stride: the tensor-parallel all-reduce buffer).
- `add_rms_norm_linear`: the residual add and RMSNorm of `triton_ops.add_rms_norm` (same roundings),
  then the projection: [add + RMSNorm + QKV] and [add + RMSNorm + gate_up] in one launch each.
- `silu_mul_linear`: SiLU(gate) * up of `triton_ops.silu_mul` (same roundings) read from the merged
  gate_up output, then the down projection.

cuBLAS runs these decode shapes (M = 1) well below HBM bandwidth and adds a split-K reduce kernel to
some; here one program owns BLOCK_N output columns for all M rows and loops over K, so the weights
are read once, the accumulation stays in float32 registers and nothing is reduced across programs.
The fused prologues read the activations again in every program (a few KB, from L2): the norm's
variance is recomputed per program and only program 0 writes the residual sum.

Launch parameters come from `TUNED` (filled from `git show c2170a2:benchmarks/gpu_gemv.py`'s sweep on the H200) or a
heuristic; every function takes `block_n`, `block_k`, `num_warps`, `num_stages`, `mode`, `prefetch`
keywords (the GemvConfig fields) to override them. `mode`: "reduce" (reduce over K every step, for each row), "defer"
(keep [BLOCK_N, BLOCK_K] partial sums, reduce once at the end; with more than one row the
[M, BLOCK_N, BLOCK_K] products of the tile path), "dot" (tensor-core dot with the rows padded to 16,
tile path). The row path ("reduce", and "defer" at one row) loads each input row in the layout of
the weight tile's columns, so the tile is used as loaded; the tile path re-lays the tile out through
shared memory every step. `prefetch`: load the next weight tile into registers before the current one is used
(double buffering by hand: Triton's pipeliner targets loads that feed dots), and the first before the
norm's variance pass.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl
from llmdeploy_engine.kernels import triton_pdl

MAX_ROWS = 8
NUM_SMS_DEFAULT = 132  # H200; the heuristic sizes BLOCK_N to fill the device's SMs
_16BIT = (torch.float16, torch.bfloat16)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MODES = {"reduce": 0, "defer": 1, "dot": 2}
_PLAIN, _NORM, _SILU = 0, 1, 2


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2
    mode: str = "defer"
    prefetch: bool = True


# (N, K, row bucket) -> config; row bucket: 1 for M == 1, 4 for M <= 4, 8 for M <= 8.
# The "best config" lines of the GEMV sweep (`git show c2170a2:benchmarks/gpu_gemv.py`) go here.
# H200, `git show c2170a2:benchmarks/gpu_gemv.py`: the fastest correct
# configuration per shape at one row, us a launch inside a CUDA graph, weights cycled out of L2
TUNED: dict[tuple[int, int, int], GemvConfig] = {
    # Qwen2.5-0.5B: qkv 2.98, o_proj 2.42, gate_up 7.40, down 5.77, lm_head 65.95
    (1152, 896, 1): GemvConfig(
        block_n=4, block_k=1024, num_warps=4, num_stages=2, mode="defer", prefetch=True
    ),
    (896, 896, 1): GemvConfig(
        block_n=2, block_k=1024, num_warps=4, num_stages=2, mode="defer", prefetch=False
    ),
    (9728, 896, 1): GemvConfig(
        block_n=16, block_k=256, num_warps=4, num_stages=2, mode="defer", prefetch=True
    ),
    (896, 4864, 1): GemvConfig(
        block_n=4, block_k=2048, num_warps=8, num_stages=2, mode="defer", prefetch=True
    ),
    (151936, 896, 1): GemvConfig(
        block_n=32, block_k=128, num_warps=4, num_stages=2, mode="reduce", prefetch=True
    ),
    # Llama-3.1-8B: qkv 15.45, o_proj 10.46, gate_up 57.35, down 30.47, lm_head 243.56
    (6144, 4096, 1): GemvConfig(
        block_n=16, block_k=512, num_warps=4, num_stages=2, mode="defer", prefetch=True
    ),
    (4096, 4096, 1): GemvConfig(
        block_n=4, block_k=1024, num_warps=4, num_stages=2, mode="defer", prefetch=True
    ),
    (28672, 4096, 1): GemvConfig(
        block_n=32, block_k=128, num_warps=4, num_stages=2, mode="defer", prefetch=False
    ),
    (4096, 14336, 1): GemvConfig(
        block_n=8, block_k=512, num_warps=8, num_stages=2, mode="defer", prefetch=True
    ),
    (128256, 4096, 1): GemvConfig(
        block_n=32, block_k=128, num_warps=4, num_stages=2, mode="defer", prefetch=False
    ),
    # Llama-3.1-8B at tensor_parallel_size 2, each rank's half (gpu_gemv.py; us a launch,
    # heuristic -> tuned): qkv 10.12 -> 8.39, o_proj 5.51 -> 5.24, gate_up 34.67 -> 32.98,
    # down 17.69 -> 15.42
    (3072, 4096, 1): GemvConfig(
        block_n=4, block_k=1024, num_warps=4, num_stages=2, mode="defer", prefetch=True
    ),
    (4096, 2048, 1): GemvConfig(
        block_n=4, block_k=512, num_warps=4, num_stages=2, mode="defer", prefetch=True
    ),
    (14336, 4096, 1): GemvConfig(
        block_n=16, block_k=256, num_warps=4, num_stages=2, mode="defer", prefetch=True
    ),
    (4096, 7168, 1): GemvConfig(
        block_n=16, block_k=512, num_warps=8, num_stages=2, mode="defer", prefetch=True
    ),
}


@triton.jit
def add_residual(h, r):
    """h + r in the model dtype (torch's add: float32, one rounding)."""
    return (h.to(tl.float32) + r.to(tl.float32)).to(h.dtype)


@triton.jit
def norm_times_weight(h, rstd, nw):
    """ops.rms_norm's roundings: h normed in the model dtype, then times the norm weight nw."""
    normed = (h.to(tl.float32) * rstd).to(h.dtype)
    return (normed.to(tl.float32) * nw.to(tl.float32)).to(h.dtype)


@triton.jit
def silu_times_up(g, u):
    """triton_ops._silu_mul_kernel's roundings: silu in the model dtype, then the product."""
    g32 = g.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)
    return (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype)


@triton.jit
def rows_rstd(x_rows, r_rows, s_rows, rmask, pid, K, eps, BLOCK_M: tl.constexpr, NORM_BLOCK: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """1 / RMS of each row (x_rows: [BLOCK_M, 1] row pointers) over all of K, as
    triton_ops._add_rms_norm_kernel computes it, of x + residual where HAS_RESIDUAL; program 0 stores
    that sum through s_rows."""
    sq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, NORM_BLOCK):
        kk = k0 + tl.arange(0, NORM_BLOCK)
        xm = rmask[:, None] & (kk[None, :] < K)
        h = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
        if HAS_RESIDUAL:
            h = add_residual(h, tl.load(r_rows + kk[None, :], mask=xm, other=0.0))
            if pid == 0:
                tl.store(s_rows + kk[None, :], h, mask=xm)
        h32 = h.to(tl.float32)
        sq += tl.sum(h32 * h32, 1)
    return tl.rsqrt(sq / K + eps)


@triton.jit
def _load_w(w_rows, kk, cmask, K, MASK_N: tl.constexpr, MASK_K: tl.constexpr):
    """A [BLOCK_N, BLOCK_K] weight tile; masks only where the shape needs them (vector loads)."""
    if MASK_N and MASK_K:
        w = tl.load(w_rows + kk[None, :], mask=cmask[:, None] & (kk[None, :] < K), other=0.0)
    elif MASK_N:
        w = tl.load(w_rows + kk[None, :], mask=cmask[:, None], other=0.0)
    elif MASK_K:
        w = tl.load(w_rows + kk[None, :], mask=kk[None, :] < K, other=0.0)
    else:
        w = tl.load(w_rows + kk[None, :])
    return w


@triton.jit
def _load_masked(ptrs, mask, MASKED: tl.constexpr):
    if MASKED:  # noqa: SIM108
        v = tl.load(ptrs, mask=mask, other=0.0)
    else:
        v = tl.load(ptrs)
    return v


@triton.jit
def _x_row(
    x_ptr,
    r_ptr,
    nw_ptr,
    m,
    kk,
    M,
    K,
    stride_xm,
    stride_rm,
    up_off,
    rstd_m,
    PROLOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    MASK_M: tl.constexpr,
    MASK_K: tl.constexpr,
):
    """Row m of the projection's input over the columns kk (1-D, the weight tile's column layout),
    after the fused prologue, in the model dtype."""
    if MASK_M and MASK_K:
        mask = (kk < K) & (m < M)
    elif MASK_M:
        mask = (kk >= 0) & (m < M)
    else:
        mask = kk < K
    xp = x_ptr + m * stride_xm + kk
    if PROLOGUE == 1:
        h = _load_masked(xp, mask, MASK_M or MASK_K)
        if HAS_RESIDUAL:
            h = add_residual(h, _load_masked(r_ptr + m * stride_rm + kk, mask, MASK_M or MASK_K))
        x = norm_times_weight(h, rstd_m, _load_masked(nw_ptr + kk, kk < K, MASK_K))
    elif PROLOGUE == 2:
        g = _load_masked(xp, mask, MASK_M or MASK_K)
        x = silu_times_up(g, _load_masked(xp + up_off, mask, MASK_M or MASK_K))
    else:
        x = _load_masked(xp, mask, MASK_M or MASK_K)
    return x


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    r_ptr,
    nw_ptr,
    s_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_rm,
    stride_sm,
    stride_wn,
    stride_ym,
    up_off,
    eps,
    PROLOGUE: tl.constexpr,  # 0: x as is, 1: add + RMSNorm, 2: SiLU(gate) * up
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    MODE: tl.constexpr,  # 0: reduce every step, 1: deferred reduce, 2: tl.dot
    PREFETCH: tl.constexpr,  # load the next weight tile before using this one
    IEEE: tl.constexpr,  # float32 inputs (the interpreter's tests): no tf32 in the dot
    USE_PDL: tl.constexpr,  # programmatic dependent launch (triton_pdl)
):
    triton_pdl.trigger(USE_PDL)
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_xm
    r_rows = r_ptr + rows[:, None].to(tl.int64) * stride_rm
    w_rows = w_ptr + cols[:, None].to(tl.int64) * stride_wn
    if PREFETCH:
        # the first tile is in flight while the norm's variance is computed
        w_next = _load_w(w_rows, ks, cmask, K, not EVEN_N, not EVEN_K)
    # no kernel writes the weights: only the activations (and every store) wait for the
    # predecessor, so the first tile streams in while it finishes
    triton_pdl.wait(USE_PDL)

    if PROLOGUE == 1:
        s_rows = s_ptr + rows[:, None].to(tl.int64) * stride_sm
        rstd = rows_rstd(x_rows, r_rows, s_rows, rmask, pid, K, eps, BLOCK_M, NORM_BLOCK, HAS_RESIDUAL)

    if MODE == 2 or (MODE == 1 and BLOCK_M > 1):
        # tile path: the weight tile is re-laid out for the dot or the [M, N, K] products
        if MODE == 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            if PREFETCH:
                w = w_next
                w_next = _load_w(w_rows, kk + BLOCK_K, cmask, K, not EVEN_N, True)
            else:
                w = _load_w(w_rows, kk, cmask, K, not EVEN_N, not EVEN_K)
            if EVEN_K:  # noqa: SIM108
                xm = rmask[:, None]
            else:
                xm = rmask[:, None] & (kk[None, :] < K)
            if PROLOGUE == 1:
                h = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
                if HAS_RESIDUAL:
                    h = add_residual(h, tl.load(r_rows + kk[None, :], mask=xm, other=0.0))
                nw = tl.load(nw_ptr + kk, mask=kk < K, other=0.0)
                x = norm_times_weight(h, rstd[:, None], nw[None, :])
            elif PROLOGUE == 2:
                g = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
                x = silu_times_up(g, tl.load(x_rows + up_off + kk[None, :], mask=xm, other=0.0))
            else:
                x = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
            if MODE == 2:
                if IEEE:  # constexpr: one dot is compiled
                    acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
                else:
                    acc = tl.dot(x, tl.trans(w), acc)
            else:
                acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]

        if MODE == 1:  # noqa: SIM108
            out = tl.sum(acc, 2)
        else:
            out = acc
        if HAS_BIAS:
            out += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        y_off = rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
        tl.store(y_ptr + y_off, out.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
    else:
        # row path: each input row is loaded in the weight tile's column layout, so the tile is used
        # as loaded (no layout conversion through shared memory); sums kept as [BLOCK_N, rows]
        if MODE == 1:
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            if PREFETCH:
                w = w_next
                w_next = _load_w(w_rows, kk + BLOCK_K, cmask, K, not EVEN_N, True)
            else:
                w = _load_w(w_rows, kk, cmask, K, not EVEN_N, not EVEN_K)
            wf = w.to(tl.float32)
            for m in tl.static_range(BLOCK_M):
                if PROLOGUE == 1:  # noqa: SIM108
                    rstd_m = tl.sum(tl.where(rows == m, rstd, 0.0), 0)  # loop-invariant: hoisted
                else:
                    rstd_m = 0.0
                x_m = _x_row(
                    x_ptr,
                    r_ptr,
                    nw_ptr,
                    m,
                    kk,
                    M,
                    K,
                    stride_xm,
                    stride_rm,
                    up_off,
                    rstd_m,
                    PROLOGUE,
                    HAS_RESIDUAL,
                    BLOCK_M > 1,
                    not EVEN_K,
                ).to(tl.float32)
                if MODE == 1:
                    acc += wf * x_m[None, :]
                else:
                    part = tl.sum(wf * x_m[None, :], 1)
                    acc += tl.where(rows[None, :] == m, part[:, None], 0.0)
        if MODE == 1:  # noqa: SIM108
            out_t = tl.sum(acc, 1)[:, None]
        else:
            out_t = acc
        if HAS_BIAS:
            out_t += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[:, None]
        y_off = rows[None, :].to(tl.int64) * stride_ym + cols[:, None]
        tl.store(y_ptr + y_off, out_t.to(y_ptr.dtype.element_ty), mask=rmask[None, :] & cmask[:, None])


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the kernels take this (x [M, K], w [N, K]): the dispatcher's test. For
    silu_mul_linear pass the gate half of gate_up (an [M, I] view) as x."""
    return (
        x.is_cuda
        and w.is_cuda
        and x.dtype in _16BIT
        and w.dtype == x.dtype
        and x.dim() == 2
        and w.dim() == 2
        and 1 <= x.shape[0] <= MAX_ROWS
        and x.shape[1] == w.shape[1]
        and w.is_contiguous()
        and w.shape[1] % 8 == 0
    )


def _row_bucket(m: int) -> int:
    return 1 if m == 1 else 4 if m <= 4 else 8


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return NUM_SMS_DEFAULT


def default_config(m: int, n: int, k: int, num_sms: int = NUM_SMS_DEFAULT) -> GemvConfig:
    """The tuned entry for (N, K, rows), else the heuristic: BLOCK_N as large as keeps >= 2 programs
    per SM (no split-K, so the column blocks alone must fill the GPU); a weight tile of ~4k elements
    (32 per thread at 4 warps: several 16-byte loads in flight, twice that with the prefetch); one
    masked step when K fits in the tile (the small models' K = 896). One row: "defer"; more: "reduce"
    (both on the row path, which uses the weight tile in the layout it was loaded in)."""
    tuned = TUNED.get((n, k, _row_bucket(m)))
    if tuned is not None:
        return tuned
    block_n = 32  # wider tiles only shorten the rows each step reads (BLOCK_K)
    while block_n > 2 and triton.cdiv(n, block_n) < 2 * num_sms:
        block_n //= 2
    block_k = min(max(64, 4096 // block_n), triton.next_power_of_2(k))
    if k % block_k and block_k > 64 and k % (block_k // 2) == 0:
        block_k //= 2  # whole tiles at half the size; smaller ones would cost more than the mask
    mode = "defer" if m == 1 else "reduce"
    return GemvConfig(block_n=block_n, block_k=block_k, num_warps=4, num_stages=2, mode=mode, prefetch=True)


def _check(x: torch.Tensor, w: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError(f"{what}: x and w must be tensors")
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"{what}: x must be [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"{what}: not supported: {x.shape[0]} rows (1..{MAX_ROWS})")
    if x.dtype not in _OUT_DTYPES or w.dtype != x.dtype:
        raise ValueError(
            f"{what}: x and w must share a 16-bit (or float32) dtype, got {x.dtype} and {w.dtype}"
        )
    if x.device != w.device:
        raise ValueError(f"{what}: x on {x.device} but w on {w.device}")
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{what}: needs CUDA tensors (or TRITON_INTERPRET=1), got {x.device}")
    if not w.is_contiguous():
        raise ValueError(f"{what}: w must be contiguous (nn.Linear layout [N, K])")


def _check_vec(v: torch.Tensor | None, size: int, like: torch.Tensor, what: str, name: str) -> None:
    if v is None:
        return
    if v.shape != (size,) or v.device != like.device or v.dtype not in _OUT_DTYPES:
        raise ValueError(
            f"{what}: {name} must be a float [{size}] tensor on {like.device}, "
            f"got {tuple(v.shape)} {v.dtype} on {v.device}"
        )
    if v.stride(0) != 1:
        raise ValueError(f"{what}: {name} must be contiguous")


def _output(
    m: int, n: int, like: torch.Tensor, out: torch.Tensor | None, out_dtype: torch.dtype | None, what: str
) -> torch.Tensor:
    if out is None:
        dtype = like.dtype if out_dtype is None else out_dtype
        if dtype not in _OUT_DTYPES:
            raise ValueError(f"{what}: out_dtype must be float16, bfloat16 or float32, got {dtype}")
        return torch.empty((m, n), dtype=dtype, device=like.device)
    if out_dtype is not None and out.dtype != out_dtype:
        raise ValueError(f"{what}: out is {out.dtype} but out_dtype is {out_dtype}")
    if out.shape != (m, n) or out.device != like.device or out.dtype not in _OUT_DTYPES:
        raise ValueError(
            f"{what}: out must be a float [{m}, {n}] tensor on {like.device}, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if out.stride(1) != 1:
        raise ValueError(
            f"{what}: out's columns must be contiguous (any row stride), got strides {out.stride()}"
        )
    return out


def _launch(
    prologue: int,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    summed: torch.Tensor | None,
    eps: float,
    up_off: int,
    k: int,
    tuning: dict[str, Any],
) -> None:
    """`tuning`: the callers' keyword overrides of the GemvConfig fields (None: keep the default)."""
    unknown = sorted(set(tuning) - set(GemvConfig.__dataclass_fields__))
    if unknown:
        raise TypeError(
            f"unknown tuning keywords {unknown}; GemvConfig fields: {sorted(GemvConfig.__dataclass_fields__)}"
        )
    m, n = y.shape
    cfg = default_config(m, n, k, _num_sms(x.device))
    cfg = replace(cfg, **{key: v for key, v in tuning.items() if v is not None})
    if cfg.mode not in _MODES:
        raise ValueError(f"mode must be one of {sorted(_MODES)}, got {cfg.mode!r}")
    for name in ("block_n", "block_k"):
        value = getattr(cfg, name)
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value}")
    if cfg.mode == "dot":
        block_m = 16
        if cfg.block_n < 16 or cfg.block_k < 16:
            raise ValueError(f"mode 'dot' needs block_n and block_k >= 16, got {cfg.block_n}, {cfg.block_k}")
    else:
        block_m = triton.next_power_of_2(m)
    dummy = y
    _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x,
        w,
        bias if bias is not None else dummy,
        y,
        residual if residual is not None else dummy,
        norm_weight if norm_weight is not None else dummy,
        summed if summed is not None else dummy,
        m,
        n,
        k,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        summed.stride(0) if summed is not None else 0,
        w.stride(0),
        y.stride(0),
        up_off,
        eps,
        PROLOGUE=prologue,
        HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        # the variance pass reads whole rows where registers allow (it reads L2, not HBM)
        NORM_BLOCK=max(cfg.block_k, min(triton.next_power_of_2(k), 4096 // block_m)),
        EVEN_K=k % cfg.block_k == 0,
        EVEN_N=n % cfg.block_n == 0,
        MODE=_MODES[cfg.mode],
        PREFETCH=bool(cfg.prefetch),
        IEEE=x.dtype == torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **triton_pdl.launch_args(x),
    )


def _unit_cols(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    **tuning: Any,
) -> torch.Tensor:
    """x [M, K] @ w[N, K].T (+ bias) with float32 accumulation, in out_dtype (default x's) or `out`."""
    what = "triton_gemv.linear"
    _check(x, w, what)
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"{what}: x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K")
    _check_vec(bias, n, x, what, "bias")
    y = _output(m, n, x, out, out_dtype, what)
    _launch(_PLAIN, _unit_cols(x), w, bias, y, None, None, None, 0.0, 0, k, tuning)
    return y


def add_rms_norm_linear(
    h: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    **tuning: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h + residual) @ w.T (+ bias), h + residual); residual None: (rms_norm(h) @ w.T, h).
    The norm rounds as ops.add_rms_norm's Triton kernel does."""
    what = "triton_gemv.add_rms_norm_linear"
    _check(h, w, what)
    m, k = h.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"{what}: h {tuple(h.shape)} and w {tuple(w.shape)} disagree on K")
    if residual is not None and (
        residual.shape != h.shape or residual.dtype != h.dtype or residual.device != h.device
    ):
        raise ValueError(
            f"{what}: residual must match h ({tuple(h.shape)} {h.dtype}), "
            f"got {tuple(residual.shape)} {residual.dtype} on {residual.device}"
        )
    _check_vec(norm_weight, k, h, what, "norm_weight")
    _check_vec(bias, n, h, what, "bias")
    y = _output(m, n, h, None, out_dtype, what)
    h = _unit_cols(h)
    summed = None
    if residual is not None:
        residual = _unit_cols(residual)
        summed = torch.empty((m, k), dtype=h.dtype, device=h.device)
    _launch(_NORM, h, w, bias, y, residual, norm_weight, summed, float(eps), 0, k, tuning)
    return y, (h if summed is None else summed)


def silu_mul_linear(
    gate_up: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor | None = None,
    **tuning: Any,
) -> torch.Tensor:
    """(silu(gate) * up) @ w.T for gate_up [M, 2I] (gate the first I columns, up the last I; any row
    stride) and w [N, I]; the activation rounds as ops.silu_mul's Triton kernel does."""
    what = "triton_gemv.silu_mul_linear"
    _check(gate_up, w, what)
    m, two_i = gate_up.shape
    n, k = w.shape
    if two_i != 2 * k:
        raise ValueError(f"{what}: gate_up {tuple(gate_up.shape)} must have 2 x w's K ({k}) columns")
    y = _output(m, n, gate_up, out, None, what)
    _launch(_SILU, _unit_cols(gate_up), w, None, y, None, None, None, 0.0, k, k, tuning)
    return y
