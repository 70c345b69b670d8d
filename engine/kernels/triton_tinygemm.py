"""Triton kernels over tinygemm-packed int4 weights (int4_tinygemm.py), for the row counts where
tinygemm itself is slow: it runs one 16-row tile of the activations per thread block and re-reads
the whole weight for each (`Int4Weight.linear` picks by row count).

- `gemm`: y = x @ W.T with each weight chunk dequantized in registers and fed to tl.dot. A chunk is
  what one (8-row tile, k-outer tile) of the layout holds: 8 output features x 16T input features
  in 32 lanes x T/2 contiguous words. The kernel unpacks the words in storage order (lane, word,
  nibble) and loads the activations in the matching permuted order instead of reordering the
  weight: a dot product's terms may come in any order. Input feature of (lane % 4 = t, word i,
  nibble j): 32 i + 8 (j % 4) + 2 t + j // 4 (int4_tinygemm.unpack_codes's arithmetic).
- `dequantize`: the dense bfloat16 weight, one [BLOCK_N, BLOCK_K] tile a program (cuBLAS on it is
  faster for very large row counts).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dequant_kernel(
    packed_ptr,
    sz_ptr,
    out_ptr,
    N,
    K,
    K_OUTER,
    GROUP: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    nmask = n < N
    byte = k // 2
    odd = k % 2
    k_outer = byte // (TILES * 8)
    within = byte % (TILES * 8)
    i2 = within // 16
    r = within % 16
    lane = (n % 8)[:, None] * 4 + (r % 4)[None, :]
    half = TILES // 2
    word_off = ((n // 8)[:, None] * K_OUTER + k_outer[None, :]) * (32 * half) + lane * half + i2[None, :]
    words = tl.load(packed_ptr + word_off, mask=nmask[:, None], other=0)
    shift = (4 * (r // 4) + 16 * odd)[None, :]
    q = ((words >> shift) & 0xF).to(tl.float32)
    g = k // GROUP
    sz_off = (g[None, :] * N + n[:, None]) * 2
    scale = tl.load(sz_ptr + sz_off, mask=nmask[:, None], other=0.0).to(tl.float32)
    zero = tl.load(sz_ptr + sz_off + 1, mask=nmask[:, None], other=0.0).to(tl.float32)
    w = (q - 8.0) * scale + zero
    tl.store(out_ptr + n[:, None] * K + k[None, :], w.to(out_ptr.dtype.element_ty), mask=nmask[:, None])


@triton.jit
def _gemm_kernel(
    x_ptr,
    packed_ptr,
    sz_ptr,
    y_ptr,
    M,
    N,
    K,
    K_OUTER,
    stride_xm,
    stride_ym,
    GROUP: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    CHUNK: tl.constexpr = 16 * TILES  # input features of one k-outer tile
    HALF: tl.constexpr = TILES // 2  # words a lane holds per k-outer tile
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = m < M
    nmask = n < N
    # storage order of a chunk's elements for one output feature: e = (t * HALF + i) * 8 + j
    e = tl.arange(0, CHUNK)
    t = e // (HALF * 8)
    i = (e // 8) % HALF
    j = e % 8
    k_of_e = 32 * i + 8 * (j % 4) + 2 * t + j // 4
    shift = 4 * (j % 4) + 16 * (j // 4)
    word_of_e = t * HALF + i  # word index within the row's 4 x HALF words
    row_base = (n // 8) * K_OUTER * (32 * HALF) + (n % 8) * (4 * HALF)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for ko in range(0, K_OUTER):
        words = tl.load(
            packed_ptr + row_base[:, None] + ko * (32 * HALF) + word_of_e[None, :],
            mask=nmask[:, None],
            other=0,
        )
        q = ((words >> shift[None, :]) & 0xF).to(tl.float32)
        k = ko * CHUNK + k_of_e
        if GROUP % CHUNK == 0:  # one group per chunk: one scale and zero per output feature
            g = (ko * CHUNK) // GROUP
            sz_off = (g * N + n) * 2
            scale = tl.load(sz_ptr + sz_off, mask=nmask, other=0.0).to(tl.float32)[:, None]
            zero = tl.load(sz_ptr + sz_off + 1, mask=nmask, other=0.0).to(tl.float32)[:, None]
        else:
            sz_off = ((k // GROUP)[None, :] * N + n[:, None]) * 2
            scale = tl.load(sz_ptr + sz_off, mask=nmask[:, None], other=0.0).to(tl.float32)
            zero = tl.load(sz_ptr + sz_off + 1, mask=nmask[:, None], other=0.0).to(tl.float32)
        w = ((q - 8.0) * scale + zero).to(x_ptr.dtype.element_ty)
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=mmask[:, None], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], y, mask=mmask[:, None] & nmask[None, :])


def gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_zero: torch.Tensor,
    group_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (bfloat16, rows contiguous) @ W.T -> [M, N], W the tinygemm-packed int4 weight."""
    m, k = x.shape
    n = scale_zero.shape[1]
    tiles = packed.shape[-1] * 2
    assert packed.shape[1] * 16 * tiles == k and x.stride(-1) == 1, (packed.shape, x.shape)
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    block_n = 64 if block_m <= 64 else 128
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _gemm_kernel[grid](
        x,
        packed,
        scale_zero,
        y,
        m,
        n,
        k,
        packed.shape[1],
        x.stride(0),
        y.stride(0),
        GROUP=group_size,
        TILES=tiles,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=8 if block_m == 128 else 4,
        num_stages=3,
    )
    return y


def dequantize(
    packed: torch.Tensor, scale_zero: torch.Tensor, group_size: int, in_features: int
) -> torch.Tensor:
    """bfloat16 [N, K] from tinygemm's packed codes [N/8, K/(T*16), 32, T/2] and [K/G, N, 2] scales
    and zero points."""
    n = scale_zero.shape[1]
    out = torch.empty(n, in_features, dtype=torch.bfloat16, device=packed.device)
    block_n = 32
    block_k = next(b for b in (128, 64, 32) if in_features % b == 0)  # tinygemm's K is a multiple of 32
    grid = (triton.cdiv(n, block_n), in_features // block_k)
    _dequant_kernel[grid](
        packed,
        scale_zero,
        out,
        n,
        in_features,
        packed.shape[1],
        GROUP=group_size,
        TILES=packed.shape[-1] * 2,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
    )
    return out
