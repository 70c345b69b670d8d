"""The dense weight of a tinygemm-packed int4 weight (int4_tinygemm.py), in one Triton launch.

tinygemm runs one 16-row tile of the activations per thread block and re-reads the whole weight for
each, so from a few dozen rows on one dequantization into bfloat16 plus cuBLAS is faster
(`Int4Weight.linear` picks by row count). Each program writes a [BLOCK_N, BLOCK_K] tile of the
dense weight; the index arithmetic is int4_tinygemm.unpack_codes's.
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
