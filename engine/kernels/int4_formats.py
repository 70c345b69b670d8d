"""4-bit weight layouts: AutoAWQ's GEMM packing, GPTQ's packing, and the engine's own.

All three hold, for a linear layer of N output and K input features in groups of G input features,
4-bit codes q, one scale s and one zero point z per (output feature, group); the weight is
(q - z) * s. They differ in how the codes are packed into int32 words:

- AWQ GEMM: qweight [K, N/8] and qzeros [K/G, N/8] packed along the output features, the eight
  nibbles of a word (bits 4i..4i+3, i = 0..7) holding columns 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i];
  scales [K/G, N]; zero points stored as they are.
- GPTQ: qweight [K/8, N] packed along the input features (nibble i of row r: input 8r + i), qzeros
  [K/G, N/8] packed along the output features in natural order, scales [K/G, N], g_idx [K] (each
  input feature's group; act-order checkpoints permute it). Format `gptq` stores zero - 1.
- the engine's: qweight [N, K/8] packed along the input features in natural order, so a decode
  program streams whole rows of one output feature; scales and zeros [N, K/G].

The quantizers here are round-to-nearest min/max (AWQ's and GPTQ's storage, without their
calibration search); they build test and benchmark checkpoints in the real layouts.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 bit patterns held in int64 -> int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_last(codes: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """codes [..., 8m] (0..15) -> int32 [..., m]; nibble i of word c holds codes[..., 8c + order[i]]."""
    assert codes.shape[-1] % 8 == 0, codes.shape
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], -1, 8)[..., list(order)]
    return _to_int32((c << _SHIFTS.to(c.device)).sum(-1))


def unpack_last(words: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """Inverse of pack_last: int32 [..., m] -> uint8 codes [..., 8m]."""
    nibbles = (words.to(torch.int64)[..., None] >> _SHIFTS.to(words.device)) & 0xF
    inverse = [order.index(j) for j in range(8)]
    return nibbles[..., inverse].reshape(*words.shape[:-1], -1).to(torch.uint8)


def quantize_int4(
    w: torch.Tensor, group_size: int, sym: bool, g_idx: torch.Tensor | None = None, min_zero: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest 4-bit quantization of w [N, K] per (row, group): (codes uint8 [N, K], scales
    float32 [N, G], zeros uint8 [N, G]), on w's device. Groups are runs of group_size input features,
    or g_idx's groups (each of group_size features). sym: zero 8 and scale max|w| / 7 (GPTQ's
    symmetric grid); else min/max over 15 steps, the zero point at least min_zero (1 for the `gptq`
    format, which cannot store 0)."""
    n, k = w.shape
    if k % group_size:
        raise ValueError(
            f"{k} input features do not split into groups of {group_size}; pick a group size that divides it"
        )
    perm = None
    if g_idx is not None:
        perm = torch.argsort(g_idx.to(w.device), stable=True)
        w = w[:, perm]
    wg = w.float().reshape(n, k // group_size, group_size)
    if sym:
        s = (wg.abs().amax(-1) / 7).clamp(min=1e-8)
        z = torch.full_like(s, 8.0)
    else:
        lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
        s = ((hi - lo) / 15).clamp(min=1e-8)
        z = (-lo / s).round().clamp(min_zero, 15)
    codes = ((wg / s[..., None]).round() + z[..., None]).clamp(0, 15).to(torch.uint8).reshape(n, k)
    if perm is not None:
        codes = codes[:, torch.argsort(perm)]
    return codes, s, z.to(torch.uint8)


def dequantize_int4(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor
) -> torch.Tensor:
    """float64 [N, K] weight of (codes [N, K], scales [N, G], zeros [N, G]); g_idx [K] -> group."""
    g = g_idx.long()
    return (codes.double() - zeros.double()[:, g]) * scales.double()[:, g]


# ---- AutoAWQ GEMM ----------------------------------------------------------------------------------
def pack_awq(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype = torch.float16
) -> dict[str, torch.Tensor]:
    """Engine-side (codes [N, K], scales [N, G], zeros [N, G]) -> AWQ GEMM qweight, qzeros, scales."""
    return {
        "qweight": pack_last(codes.t(), AWQ_ORDER),
        "qzeros": pack_last(zeros.t(), AWQ_ORDER),
        "scales": scales.t().contiguous().to(dtype),
    }


def unpack_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AWQ GEMM tensors -> (codes [N, K], scales float32 [N, G], zeros uint8 [N, G])."""
    codes = unpack_last(qweight, AWQ_ORDER).t().contiguous()
    zeros = unpack_last(qzeros, AWQ_ORDER).t().contiguous()
    return codes, scales.float().t().contiguous(), zeros


# ---- GPTQ ------------------------------------------------------------------------------------------
def pack_gptq(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    zeros_offset: int = 1,
    dtype: torch.dtype = torch.float16,
) -> dict[str, torch.Tensor]:
    """Engine-side tensors -> GPTQ qweight [K/8, N], qzeros [G, N/8], scales [G, N], g_idx [K];
    zeros_offset 1: the `gptq` format's zero - 1 (so a zero point of 0 cannot be stored)."""
    stored = zeros.to(torch.int64) - zeros_offset
    if int(stored.min()) < 0 or int(stored.max()) > 15:
        raise ValueError(f"zero points must lie in {zeros_offset}..{15 + zeros_offset} for this format")
    return {
        "qweight": pack_last(codes).t().contiguous(),  # rows of eight input features, K/8 first
        "qzeros": pack_last(stored.t()),
        "scales": scales.t().contiguous().to(dtype),
        "g_idx": g_idx.to(torch.int32),
    }


def unpack_gptq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, zeros_offset: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ tensors -> (codes [N, K], scales float32 [N, G], zeros uint8 [N, G]); the zero point is
    the stored value + zeros_offset (16 where a `gptq` file stores 15, as the GPTQ kernels read it)."""
    codes = unpack_last(qweight.t().contiguous())
    zeros = (unpack_last(qzeros).to(torch.int64) + zeros_offset).to(torch.uint8)
    return codes, scales.float().t().contiguous(), zeros.t().contiguous()
