"""Skinny GEMM kernels for mid-size decode batches (Triton): y = x @ w.T for 9..64 rows, with the
elementwise op before the projection fused into the same launch.

Not dispatched: on the H200 (benchmarks/gpu_skinny.py, run 11, docs/gpu-notes.md v5) these kernels
ran slower than cuBLAS plus the separate norm / SiLU kernels on every shape but the 0.5B o_proj
(0.16-0.75x at 16-64 rows), so `ops` sends only single-row products to triton_gemv and keeps cuBLAS
for more rows; the module, its tests and the sweep stay for the next attempt (see the notes).

- `linear`: x @ w.T (+ bias), written in x's dtype, float32 (the LM head's logits) or into `out`
  (a [M, N] view with any row stride: the tensor-parallel all-reduce buffer).
- `add_rms_norm_linear`: the residual add and RMSNorm of `triton_ops.add_rms_norm` (same roundings),
  then the projection: [add + RMSNorm + QKV] and [add + RMSNorm + gate_up] in one launch each.
- `silu_mul_linear`: SiLU(gate) * up of `triton_ops.silu_mul` (same roundings) read from the merged
  gate_up output, then the down projection.

triton_gemv covers 1..8 rows with a loop over rows; here the rows are padded to a tensor-core tile
(BLOCK_M 16, 32 or 64) and one program owns BLOCK_N output columns for all of them, so the weights
are read once, with `tl.dot` over BLOCK_K chunks that Triton's pipeliner prefetches (num_stages).
No split-K: the column blocks alone fill the SMs where N allows (Qwen2.5-0.5B's 896 / 1152 columns
give only 56 / 72 programs), nothing is reduced across programs and there is no second launch. `swap_ab` computes the transposed tile (w @ x.T), which puts the weight's BLOCK_N
on the MMA's M side (Hopper's warpgroup MMA wants 64 there). The norm prologue recomputes each row's
variance in every program (the activations are a few hundred KB at most, read from L2) and only
program 0 writes the residual sum; at 32 rows those L2 reads can rival the weight's HBM bytes, so
`rstd_epilogue` (off by default: it rounds once where ops.rms_norm rounds twice) reads them once,
sums the squares alongside the dot and scales the float32 sums by 1/rms at the end.

Launch parameters come from `TUNED` (filled from benchmarks/gpu_skinny.py's sweep on the H200) or a
heuristic; every function takes `block_n`, `block_k`, `num_warps`, `num_stages`, `swap_ab` keywords
to override them (add_rms_norm_linear also `rstd_epilogue`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

MIN_ROWS = 9  # below this triton_gemv's kernels take the batch
MAX_ROWS = 64
NUM_SMS_DEFAULT = 132  # H200; the heuristic sizes BLOCK_N to fill the device's SMs
_16BIT = (torch.float16, torch.bfloat16)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PLAIN, _NORM, _SILU = 0, 1, 2
# elements of x and w tiles per pipeline stage (2 bytes each): 32 KB a stage
_STAGE_ELEMENTS = 16384
# Triton's pipeliner buffers every tile the loop loads (w, and x / h and residual / gate and up):
# num_stages - 1 copies for mma.sync dots, num_stages for Hopper's wgmma; an SM has 227 KB
SMEM_BUDGET_BYTES = 200 * 1024


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False
    # add_rms_norm_linear only: one pass over the activations, 1/rms applied to the accumulator
    rstd_epilogue: bool = False


# (N, K, BLOCK_M) -> config; BLOCK_M is 16 for M <= 16, 32 for M <= 32, 64 for M <= 64.
# Paste the "best config" lines that benchmarks/gpu_skinny.py prints here.
TUNED: dict[tuple[int, int, int], SkinnyConfig] = {}


@triton.jit
def _load_k(row_ptrs, kk, K, EVEN_K: tl.constexpr):
    """A [rows, BLOCK_K] tile at columns kk; masked only where K is not a multiple of BLOCK_K."""
    if EVEN_K:
        t = tl.load(row_ptrs + kk[None, :])
    else:
        t = tl.load(row_ptrs + kk[None, :], mask=(kk < K)[None, :], other=0.0)
    return t


# M is not specialised: row counts 16 / 32 / 64 and the others share one compilation a BLOCK_M
@triton.jit(do_not_specialize=["M"])
def _skinny_kernel(
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
    SWAP_AB: tl.constexpr,  # accumulate the [BLOCK_N, BLOCK_M] tile w @ x.T
    RSTD_EPILOGUE: tl.constexpr,  # PROLOGUE 1: sum the squares in the main loop, scale the sums at the end
    PRECISION: tl.constexpr,  # "ieee" for float32 inputs (no tf32), else the 16-bit dot
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    ks = tl.arange(0, BLOCK_K)
    # padding rows / columns read the last real one (in bounds, so the loads need no row or column
    # mask); their results are never stored
    x_rows = x_ptr + tl.minimum(rows, M - 1)[:, None].to(tl.int64) * stride_xm
    r_rows = r_ptr + tl.minimum(rows, M - 1)[:, None].to(tl.int64) * stride_rm
    w_rows = w_ptr + tl.minimum(cols, N - 1)[:, None].to(tl.int64) * stride_wn

    if PROLOGUE == 1 and not RSTD_EPILOGUE:
        # each row's variance over all of K, as triton_ops._add_rms_norm_kernel computes it
        sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, NORM_BLOCK):
            kk = k0 + tl.arange(0, NORM_BLOCK)
            km = (kk < K)[None, :]
            h = tl.load(x_rows + kk[None, :], mask=km, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(r_rows + kk[None, :], mask=km, other=0.0)
                h = (h.to(tl.float32) + r.to(tl.float32)).to(h.dtype)  # torch's add: one rounding
                if pid == 0:
                    s_off = rows[:, None].to(tl.int64) * stride_sm + kk[None, :]
                    tl.store(s_ptr + s_off, h, mask=rmask[:, None] & km)
            h32 = h.to(tl.float32)
            sq += tl.sum(h32 * h32, 1)
        rstd = tl.rsqrt(sq / K + eps)

    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if RSTD_EPILOGUE:
        sq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        w = _load_k(w_rows, kk, K, EVEN_K)
        if PROLOGUE == 1:
            h = _load_k(x_rows, kk, K, EVEN_K)
            if HAS_RESIDUAL:
                r = _load_k(r_rows, kk, K, EVEN_K)
                h = (h.to(tl.float32) + r.to(tl.float32)).to(h.dtype)
                if RSTD_EPILOGUE and pid == 0:
                    s_off = rows[:, None].to(tl.int64) * stride_sm + kk[None, :]
                    tl.store(s_ptr + s_off, h, mask=rmask[:, None] & (kk < K)[None, :])
            if EVEN_K:  # noqa: SIM108 (constexpr branches)
                nw = tl.load(nw_ptr + kk)
            else:
                nw = tl.load(nw_ptr + kk, mask=kk < K, other=0.0)
            if RSTD_EPILOGUE:
                # rms_norm(s) @ w.T = rstd * ((s * weight) @ w.T): one rounding of s * weight where
                # ops.rms_norm rounds twice (within bf16 rounding of it, not bit-equal)
                h32 = h.to(tl.float32)
                sq += tl.sum(h32 * h32, 1)
                x = (h32 * nw.to(tl.float32)[None, :]).to(h.dtype)
            else:
                # ops.rms_norm's roundings: normed in the model dtype, then times the weight
                normed = (h.to(tl.float32) * rstd[:, None]).to(h.dtype)
                x = (normed.to(tl.float32) * nw.to(tl.float32)[None, :]).to(h.dtype)
        elif PROLOGUE == 2:
            g = _load_k(x_rows, kk, K, EVEN_K)
            u = _load_k(x_rows + up_off, kk, K, EVEN_K)
            g32 = g.to(tl.float32)
            # triton_ops._silu_mul_kernel's roundings: silu in the model dtype, then the product
            act = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)
            x = (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype)
        else:
            x = _load_k(x_rows, kk, K, EVEN_K)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)

    if RSTD_EPILOGUE:
        rstd = tl.rsqrt(sq / K + eps)
        if SWAP_AB:  # noqa: SIM108 (constexpr branches)
            acc = acc * rstd[None, :]
        else:
            acc = acc * rstd[:, None]
    if SWAP_AB:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[:, None]
        y_off = rows[None, :].to(tl.int64) * stride_ym + cols[:, None]
        tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=cmask[:, None] & rmask[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        y_off = rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
        tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the kernels take this (x [M, K], w [N, K]): the dispatcher's test."""
    return (
        x.is_cuda
        and w.is_cuda
        and x.dtype in _16BIT
        and w.dtype == x.dtype
        and x.dim() == 2
        and w.dim() == 2
        and MIN_ROWS <= x.shape[0] <= MAX_ROWS
        and x.shape[1] == w.shape[1]
        and w.is_contiguous()
        and w.shape[1] % 8 == 0
    )


def block_m_for(m: int) -> int:
    """The rows' tile: 16, 32 or 64 (tensor-core dots need at least 16)."""
    return max(16, triton.next_power_of_2(m))


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return NUM_SMS_DEFAULT


def pipeline_bytes(block_m: int, cfg: SkinnyConfig, act_tiles: int = 1) -> int:
    """Upper bound of the software pipeline's shared memory (16-bit tiles): num_stages copies of the
    weight tile and of the act_tiles activation tiles (1: x; 2: h and residual, or gate and up)."""
    return cfg.num_stages * 2 * cfg.block_k * (cfg.block_n + act_tiles * block_m)


def default_config(
    m: int, n: int, k: int, num_sms: int = NUM_SMS_DEFAULT, act_tiles: int = 1
) -> SkinnyConfig:
    """The tuned entry for (N, K, BLOCK_M), else the heuristic: the widest BLOCK_N (128 down to 16)
    that still gives ~one program per SM (no split-K, so the column blocks alone must fill the GPU);
    BLOCK_K so that x and w tiles hold ~16k elements (32 KB), a power of two dividing K where one
    does (unmasked loop); as many stages (2..5) as keep pipeline_bytes within SMEM_BUDGET_BYTES
    (act_tiles: the activation tiles a stage loads besides the weight's)."""
    block_m = block_m_for(m)
    tuned = TUNED.get((n, k, block_m))
    if tuned is not None:
        return tuned
    block_n = 128
    while block_n > 16 and triton.cdiv(n, block_n) < 0.9 * num_sms:
        block_n //= 2
    block_k = min(256, _STAGE_ELEMENTS // (block_m + block_n))
    block_k = max(32, 1 << (block_k.bit_length() - 1))
    block_k = min(block_k, max(32, triton.next_power_of_2(k)))
    while block_k > 32 and k % block_k:
        block_k //= 2
    cfg = SkinnyConfig(block_n=block_n, block_k=block_k, num_warps=4, num_stages=1)
    num_stages = max(2, min(5, SMEM_BUDGET_BYTES // pipeline_bytes(block_m, cfg, act_tiles)))
    return replace(cfg, num_stages=num_stages)


def _check(x: torch.Tensor, w: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError(f"{what}: x and w must be tensors")
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"{what}: x must be [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"{what}: not supported: {x.shape[0]} rows (1..{MAX_ROWS}; {MIN_ROWS}.. by design)")
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
    if w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"{what}: w must not be empty, got {tuple(w.shape)}")


def _check_vec(v: torch.Tensor | None, size: int, like: torch.Tensor, what: str, name: str) -> None:
    if v is None:
        return
    if (
        not isinstance(v, torch.Tensor)
        or v.shape != (size,)
        or v.device != like.device
        or v.dtype not in _OUT_DTYPES
    ):
        got = f"{tuple(v.shape)} {v.dtype} on {v.device}" if isinstance(v, torch.Tensor) else type(v).__name__
        raise ValueError(f"{what}: {name} must be a float [{size}] tensor on {like.device}, got {got}")
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
    overrides: dict[str, int | bool | None],
) -> None:
    m, n = y.shape
    act_tiles = 2 if prologue == _SILU or residual is not None else 1
    cfg = default_config(m, n, k, _num_sms(x.device), act_tiles)
    cfg = replace(cfg, **{key: v for key, v in overrides.items() if v is not None})
    for name in ("block_n", "block_k"):
        value = getattr(cfg, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tensor-core dot), got {value}")
    if cfg.num_warps < 1 or cfg.num_warps & (cfg.num_warps - 1) or cfg.num_stages < 1:
        raise ValueError(f"num_warps must be a power of two and num_stages >= 1, got {cfg}")
    block_m = block_m_for(m)
    dummy = y  # pointers the kernel never reads for this prologue / without bias
    _skinny_kernel[(triton.cdiv(n, cfg.block_n),)](
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
        NORM_BLOCK=max(16, min(triton.next_power_of_2(k), 8192 // block_m)),
        EVEN_K=k % cfg.block_k == 0,
        SWAP_AB=bool(cfg.swap_ab),
        RSTD_EPILOGUE=prologue == _NORM and bool(cfg.rstd_epilogue),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def _unit_cols(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
) -> torch.Tensor:
    """x [M, K] @ w[N, K].T (+ bias) with float32 accumulation, in out_dtype (default x's) or `out`."""
    what = "triton_skinny.linear"
    _check(x, w, what)
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"{what}: x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K")
    _check_vec(bias, n, x, what, "bias")
    y = _output(m, n, x, out, out_dtype, what)
    overrides = dict(
        block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages, swap_ab=swap_ab
    )
    _launch(_PLAIN, _unit_cols(x), w, bias, y, None, None, None, 0.0, 0, k, overrides)
    return y


def add_rms_norm_linear(
    h: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
    rstd_epilogue: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h + residual) @ w.T (+ bias), h + residual); residual None: (rms_norm(h) @ w.T, h).
    The norm rounds as ops.add_rms_norm's Triton kernel does; `rstd_epilogue=True` instead reads the
    activations once and scales the float32 sums by 1/rms at the end (one rounding fewer: within bf16
    rounding of it, not bit-equal; float16 activations times the norm weight must stay finite)."""
    what = "triton_skinny.add_rms_norm_linear"
    _check(h, w, what)
    m, k = h.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"{what}: h {tuple(h.shape)} and w {tuple(w.shape)} disagree on K")
    if residual is not None and (
        not isinstance(residual, torch.Tensor)
        or residual.shape != h.shape
        or residual.dtype != h.dtype
        or residual.device != h.device
    ):
        got = (
            f"{tuple(residual.shape)} {residual.dtype} on {residual.device}"
            if isinstance(residual, torch.Tensor)
            else type(residual).__name__
        )
        raise ValueError(f"{what}: residual must match h ({tuple(h.shape)} {h.dtype}), got {got}")
    _check_vec(norm_weight, k, h, what, "norm_weight")
    _check_vec(bias, n, h, what, "bias")
    y = _output(m, n, h, None, out_dtype, what)
    h = _unit_cols(h)
    summed = None
    if residual is not None:
        residual = _unit_cols(residual)
        summed = torch.empty((m, k), dtype=h.dtype, device=h.device)
    overrides = dict(
        block_n=block_n,
        block_k=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
        swap_ab=swap_ab,
        rstd_epilogue=rstd_epilogue,
    )
    _launch(_NORM, h, w, bias, y, residual, norm_weight, summed, float(eps), 0, k, overrides)
    return y, (h if summed is None else summed)


def silu_mul_linear(
    gate_up: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
) -> torch.Tensor:
    """(silu(gate) * up) @ w.T for gate_up [M, 2I] (gate the first I columns, up the last I; any row
    stride) and w [N, I]; the activation rounds as ops.silu_mul's Triton kernel does."""
    what = "triton_skinny.silu_mul_linear"
    _check(gate_up, w, what)
    m, two_i = gate_up.shape
    n, k = w.shape
    if two_i != 2 * k:
        raise ValueError(f"{what}: gate_up {tuple(gate_up.shape)} must have 2 x w's K ({k}) columns")
    y = _output(m, n, gate_up, out, None, what)
    overrides = dict(
        block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages, swap_ab=swap_ab
    )
    _launch(_SILU, _unit_cols(gate_up), w, None, y, None, None, None, 0.0, k, k, overrides)
    return y
