"""Triton kernels for quantized weights (quant_linear.py): int4 in the engine's layout
(int4_formats.py: qweight [N, K/8], scales and zero points [N, K/G]) and fp8 e4m3 with one float32
scale per output feature.

- `gemv`: y = prologue(x) @ dequant(w).T for 1..8 rows (decode), the weights dequantized in
  registers; the prologues of triton_gemv (residual add + RMSNorm, SiLU(gate) * up) with the same
  roundings, so the single-row decode path keeps its fused epilogues. int4: a group's scale and zero
  point are applied per packed word as s * (sum(q * x) - z * sum(x)), and the nibbles become
  floats through the exponent trick (nibble | 0x4B000000 is the float 2^23 + nibble), which avoids
  the slow integer-to-float conversion.
- `int4_gemm`: the dequantize-tile GEMM for more rows (prefill, large decode batches): each
  [BLOCK_N, BLOCK_K] weight tile is unpacked and scaled in registers, then fed to tl.dot.
- `int4_dequantize`: the whole weight in the model dtype (for very large row counts, cuBLAS on the
  dequantized weight beats re-dequantizing every tile for every block of rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from llmdeploy_engine.kernels import triton_pdl
from llmdeploy_engine.kernels.triton_gemv import add_residual, norm_times_weight, rows_rstd, silu_times_up

MAX_GEMV_ROWS = 8
# (weight format 0 int4 | 1 fp8, rows bucket 1 | 8) -> (BLOCK_N, BLOCK_K, num_warps, deferred
# reduction), read at each launch (`git show c2170a2:benchmarks/gpu_quant.py` --sweep replaces entries to time candidates)
# single-row entries: the fastest over Llama-3.1-8B's gate_up and down shapes on an H200 (int4
# ~480-530 GB/s of weight bytes: bound by the nibble unpacking, not by HBM; fp8 ~2.0-2.7 TB/s)
GEMV_CONFIGS: dict[tuple[int, int], tuple[int, int, int, bool]] = {
    (0, 1): (8, 512, 4, False),
    (0, 8): (16, 128, 4, True),
    (1, 1): (8, 1024, 4, False),
    (1, 8): (8, 256, 4, True),
}
_PLAIN, _NORM, _SILU = 0, 1, 2
_INT4, _FP8 = 0, 1


@triton.jit
def _nibbles_f32(words):
    """int32 [.., W] -> float32 [.., W, 8] of the eight 4-bit codes, nibble i at bits 4i."""
    shifts = tl.arange(0, 8) * 4
    nib = (words[:, :, None] >> shifts[None, None, :]) & 0xF
    return (nib | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _prologue_row(
    x_ptr, r_ptr, nw_ptr, kk, kmask, up_off, rstd, PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr
):
    """One input row over the columns kk (any shape), after the fused prologue, in float32."""
    if PROLOGUE == 1:
        h = tl.load(x_ptr + kk, mask=kmask, other=0.0)
        if HAS_RES:
            h = add_residual(h, tl.load(r_ptr + kk, mask=kmask, other=0.0))
        x = norm_times_weight(h, rstd, tl.load(nw_ptr + kk, mask=kmask, other=0.0))
    elif PROLOGUE == 2:
        g = tl.load(x_ptr + kk, mask=kmask, other=0.0)
        x = silu_times_up(g, tl.load(x_ptr + up_off + kk, mask=kmask, other=0.0))
    else:
        x = tl.load(x_ptr + kk, mask=kmask, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _qgemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, sum_ptr,
    M, N, K, G,
    stride_xm, stride_rm, stride_summ, stride_ym, stride_sn,
    up_off, eps,
    WFMT: tl.constexpr,  # 0: int4 (engine layout), 1: fp8 e4m3 bytes + float32 scale per row
    PROLOGUE: tl.constexpr,
    HAS_RES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # input features a step (int4: BLOCK_K // 8 words)
    NORM_BLOCK: tl.constexpr,
    DEFER: tl.constexpr,  # keep per-element partial sums, reduce once (else reduce every step)
    USE_PDL: tl.constexpr,
):  # fmt: skip
    triton_pdl.trigger(USE_PDL)
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    cols64 = cols.to(tl.int64)
    triton_pdl.wait(USE_PDL)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 1:
        x_rows = x_ptr + rows[:, None] * stride_xm
        r_rows = r_ptr + rows[:, None] * stride_rm
        s_rows = sum_ptr + rows[:, None] * stride_summ
        rstd = rows_rstd(x_rows, r_rows, s_rows, rmask, pid, K, eps, BLOCK_M, NORM_BLOCK, HAS_RES)

    if WFMT == 0:
        BLOCK_W: tl.constexpr = BLOCK_K // 8
        if DEFER:
            acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_W], dtype=tl.float32)
        else:
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        wi = tl.arange(0, BLOCK_W)
        for k0 in range(0, K, BLOCK_K):
            words = k0 // 8 + wi
            wmask = words < K // 8
            q = tl.load(
                w_ptr + cols64[:, None] * (K // 8) + words[None, :],
                mask=cmask[:, None] & wmask[None, :],
                other=0,
            )
            grp = (words * 8) // G
            smask = cmask[:, None] & wmask[None, :]
            s = tl.load(s_ptr + cols64[:, None] * stride_sn + grp[None, :], mask=smask, other=0.0)
            z = tl.load(z_ptr + cols64[:, None] * stride_sn + grp[None, :], mask=smask, other=0)
            qf = _nibbles_f32(q)  # [BLOCK_N, BLOCK_W, 8]
            s = s.to(tl.float32)
            zf = z.to(tl.float32)
            kk = words[:, None] * 8 + tl.arange(0, 8)[None, :]  # [BLOCK_W, 8]
            kmask = kk < K
            for m in tl.static_range(BLOCK_M):
                rstd_m = tl.sum(tl.where(rows == m, rstd, 0.0), 0)
                x = _prologue_row(
                    x_ptr + m * stride_xm, r_ptr + m * stride_rm, nw_ptr, kk, kmask & (m < M),
                    up_off, rstd_m, PROLOGUE, HAS_RES,
                )  # fmt: skip
                dot = tl.sum(qf * x[None, :, :], 2)  # [BLOCK_N, BLOCK_W]
                xs = tl.sum(x, 1)  # [BLOCK_W]
                part = s * (dot - zf * xs[None, :])
                if DEFER:
                    acc += tl.where(rows[:, None, None] == m, part[None, :, :], 0.0)
                else:
                    acc2 += tl.where(rows[:, None] == m, tl.sum(part, 1)[None, :], 0.0)
        if DEFER:  # noqa: SIM108
            out = tl.sum(acc, 2)  # [BLOCK_M, BLOCK_N]
        else:
            out = acc2
    else:
        if DEFER:
            acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        else:
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        ks = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            kmask = kk < K
            wb = tl.load(
                w_ptr + cols64[:, None] * K + kk[None, :], mask=cmask[:, None] & kmask[None, :], other=0
            )
            wf = wb.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            for m in tl.static_range(BLOCK_M):
                rstd_m = tl.sum(tl.where(rows == m, rstd, 0.0), 0)
                x = _prologue_row(
                    x_ptr + m * stride_xm, r_ptr + m * stride_rm, nw_ptr, kk, kmask & (m < M),
                    up_off, rstd_m, PROLOGUE, HAS_RES,
                )  # fmt: skip
                if DEFER:
                    acc += tl.where(rows[:, None, None] == m, (wf * x[None, :])[None, :, :], 0.0)
                else:
                    acc2 += tl.where(rows[:, None] == m, tl.sum(wf * x[None, :], 1)[None, :], 0.0)
        scale = tl.load(s_ptr + cols, mask=cmask, other=0.0)
        if DEFER:  # noqa: SIM108
            out = tl.sum(acc, 2) * scale[None, :]
        else:
            out = acc2 * scale[None, :]
    if HAS_BIAS:
        out += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    y_off = rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
    tl.store(y_ptr + y_off, out.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def gemv(
    x: torch.Tensor,
    wfmt: int,
    w: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    n: int,
    k: int,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    prologue: int = _PLAIN,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y [M, n], the residual sum for prologue NORM with a residual, else None). x: [M, k] (prologue
    SILU: the merged gate_up [M, 2k]); rows 1..8; unit column stride."""
    m = x.shape[0]
    assert 1 <= m <= MAX_GEMV_ROWS and x.stride(-1) == 1
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    summed = None
    if prologue == _NORM and residual is not None:
        summed = torch.empty((m, k), dtype=x.dtype, device=x.device)
    block_m = triton.next_power_of_2(m)
    block_n, block_k, num_warps, defer = GEMV_CONFIGS[(wfmt, 1 if m == 1 else 8)]
    while block_n > 4 and triton.cdiv(n, block_n) < 264:
        block_n //= 2
    block_k = min(block_k, triton.next_power_of_2(k))
    dummy = y
    _qgemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, scales, zeros if zeros is not None else dummy, bias if bias is not None else dummy, y,
        residual if residual is not None else dummy, norm_weight if norm_weight is not None else dummy,
        summed if summed is not None else dummy,
        m, n, k, group_size,
        x.stride(0), residual.stride(0) if residual is not None else 0,
        summed.stride(0) if summed is not None else 0, y.stride(0), scales.stride(0) if scales.dim() == 2 else 1,
        k if prologue == _SILU else 0, float(eps),
        WFMT=wfmt, PROLOGUE=prologue, HAS_RES=residual is not None, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        NORM_BLOCK=max(block_k, min(triton.next_power_of_2(k), 4096 // block_m)), DEFER=defer,
        num_warps=num_warps, num_stages=2, **triton_pdl.launch_args(x),
    )  # fmt: skip
    return y, summed


@triton.jit
def _int4_gemm_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
    M, N, K, G,
    stride_xm, stride_ym, stride_sn,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # divides G: one group a step
    GROUP_M: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: programs that share weight tiles run close together (L2 reuse)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask, cmask = rows < M, cols < N
    cols64 = cols.to(tl.int64)
    BLOCK_W: tl.constexpr = BLOCK_K // 8
    wi = tl.arange(0, BLOCK_W)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + (k0 + ks)[None, :],
            mask=rmask[:, None] & ((k0 + ks)[None, :] < K),
            other=0.0,
        )
        q = tl.load(
            w_ptr + cols64[:, None] * (K // 8) + (k0 // 8 + wi)[None, :], mask=cmask[:, None], other=0
        )
        g = k0 // G
        s = tl.load(s_ptr + cols64 * stride_sn + g, mask=cmask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + cols64 * stride_sn + g, mask=cmask, other=0).to(tl.float32)
        qf = tl.reshape(_nibbles_f32(q), (BLOCK_N, BLOCK_K))
        w = ((qf - z[:, None]) * s[:, None]).to(x.dtype)
        if IEEE:  # noqa: SIM108
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    y_off = rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
    tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def int4_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ dequant(qweight).T (+ bias): [M, N] in x's dtype (or into `out`)."""
    m, k = x.shape
    n = qweight.shape[0]
    assert x.stride(-1) == 1
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    block_n = 128 if m > 64 else 64
    block_k = min(64, group_size)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _int4_gemm_kernel[grid](
        x, qweight, scales, zeros, bias if bias is not None else y, y,
        m, n, k, group_size,
        x.stride(0), y.stride(0), scales.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
        IEEE=x.dtype == torch.float32, num_warps=8 if block_m * block_n >= 128 * 128 else 4, num_stages=3,
    )  # fmt: skip
    return y


@triton.jit
def _int4_dequant_kernel(
    w_ptr, s_ptr, z_ptr, out_ptr, N, K, G, stride_sn, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr
):
    pid_n, pid_w = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    words = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = (cols[:, None] < N) & (words[None, :] < K // 8)
    cols64 = cols.to(tl.int64)
    q = tl.load(w_ptr + cols64[:, None] * (K // 8) + words[None, :], mask=mask, other=0)
    grp = (words * 8) // G
    s = tl.load(s_ptr + cols64[:, None] * stride_sn + grp[None, :], mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + cols64[:, None] * stride_sn + grp[None, :], mask=mask, other=0).to(tl.float32)
    w = (_nibbles_f32(q) - z[:, :, None]) * s[:, :, None]
    kk = words[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(
        out_ptr + cols64[:, None, None] * K + kk[None, :, :],
        w.to(out_ptr.dtype.element_ty),
        mask=mask[:, :, None],
    )


def int4_dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, dtype: torch.dtype
) -> torch.Tensor:
    n, k = qweight.shape[0], qweight.shape[1] * 8
    out = torch.empty((n, k), dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(n, 32), triton.cdiv(k // 8, 32))
    _int4_dequant_kernel[grid](
        qweight, scales, zeros, out, n, k, group_size, scales.stride(0), BLOCK_N=32, BLOCK_W=32
    )
    return out
