"""int4 weights in the layout of torch's tinygemm kernel (`torch._weight_int4pack_mm`, CUDA, SM80+).

Decode rows read an int4 weight fastest through tinygemm, which dequantizes in registers and feeds
the tensor cores: no Triton nibble unpacking, no new dependency. AWQ / GPTQ weights are repacked into
its layout once at load (`Int4Weight.repack_tinygemm`); this module holds the layout's facts in
plain torch, so the CPU tests check them against the float64 dequantized reference.

- Codes: `torch._convert_weight_to_int4pack(u8, inner_k_tiles)` takes [N, K/2] uint8 whose byte j
  holds code 2j in its high nibble and code 2j+1 in its low one, and returns int32
  [N/8, K/(inner_k_tiles*16), 32, inner_k_tiles/2]: the m16n8k16 B-operand order of each lane.
  `pack_bytes` builds its input; `unpack_codes` inverts its output (the dequantization kernel of
  triton_tinygemm.py computes the same index arithmetic).
- Scales and zero points: tinygemm dequantizes a code q (0..15) as (q - 8) * scale + zero from a
  [K/G, N, 2] tensor in bfloat16. AWQ / GPTQ store (q - z) * s, which is (q - 8) * s + (8 - z) * s:
  zero = (8 - z) * s (`scale_and_zero`).
"""

from __future__ import annotations

import torch

GROUP_SIZES = (32, 64, 128, 256)  # the group sizes tinygemm is built for
K_TILE = 16


def inner_k_tiles(in_features: int) -> int | None:
    """The widest inner k-tile count (8, 4 or 2: 16-, 8- or 4-byte loads) that divides in_features,
    or None when none does."""
    for tiles in (8, 4, 2):
        if in_features % (tiles * K_TILE) == 0:
            return tiles
    return None


def supported(out_features: int, in_features: int, group_size: int, dtype: torch.dtype) -> bool:
    """Whether a weight of this shape can go to tinygemm (bfloat16 activations only)."""
    return (
        dtype == torch.bfloat16
        and group_size in GROUP_SIZES
        and out_features % 8 == 0
        and inner_k_tiles(in_features) is not None
    )


def pack_bytes(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] (0..15) -> uint8 [N, K/2], code 2j in the high nibble of byte j."""
    c = codes.to(torch.uint8)
    return ((c[:, 0::2] << 4) | c[:, 1::2]).contiguous()


def scale_and_zero(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """[N, G] scales and zero points (AWQ / GPTQ: w = (q - z) * s) -> [G, N, 2] bfloat16 (scale,
    (8 - z) * scale), tinygemm's (q - 8) * scale + zero."""
    s = scales.float()
    zero = (8.0 - zeros.float()) * s
    return torch.stack([s, zero], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()


def unpack_codes(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Inverse of `_convert_weight_to_int4pack`: int32 [N/8, K/(T*16), 32, T/2] -> uint8 codes [N, K].

    Word [n // 8][k_outer][lane][i2] holds, for output feature n = 8 * (n // 8) + lane // 4, the
    bytes b = k_outer * 8T + 16 * i2 + r with r = lane % 4 + 4v (v = 0..3); nibble v of the word's
    low half is the byte's high nibble (even input feature), nibble v of its high half the low one.
    """
    n, k = out_features, in_features
    tiles = packed.shape[-1] * 2
    n_idx = torch.arange(n, device=packed.device)[:, None]
    k_idx = torch.arange(k, device=packed.device)[None, :]
    byte, odd = k_idx // 2, k_idx % 2
    k_outer, within = byte // (tiles * 8), byte % (tiles * 8)
    i2, r = within // 16, within % 16
    lane = (n_idx % 8) * 4 + r % 4
    shift = 4 * (r // 4) + 16 * odd
    words = packed[n_idx // 8, k_outer, lane, i2].to(torch.int64) & 0xFFFFFFFF
    return ((words >> shift) & 0xF).to(torch.uint8)


def dequantize(
    packed: torch.Tensor, scale_zero: torch.Tensor, group_size: int, in_features: int, dtype: torch.dtype
) -> torch.Tensor:
    """The dense weight [N, K] as tinygemm computes it, in plain torch (the reference of
    triton_tinygemm.dequantize)."""
    n = scale_zero.shape[1]
    codes = unpack_codes(packed, n, in_features).float()
    g = torch.arange(in_features, device=packed.device) // group_size
    sz = scale_zero.float()
    scale, zero = sz[g, :, 0].t(), sz[g, :, 1].t()
    return ((codes - 8) * scale + zero).to(dtype)


def reference_pack(codes: torch.Tensor, tiles: int) -> torch.Tensor:
    """`_convert_weight_to_int4pack`'s CUDA output computed in plain torch (CPU tests; the GPU test
    holds the two equal)."""
    n, k = codes.shape
    out = torch.zeros(n // 8, k // (tiles * K_TILE), 32, tiles // 2, dtype=torch.int64)
    n_idx = torch.arange(n)[:, None]
    k_idx = torch.arange(k)[None, :]
    byte, odd = k_idx // 2, k_idx % 2
    k_outer, within = byte // (tiles * 8), byte % (tiles * 8)
    i2, r = within // 16, within % 16
    lane = (n_idx % 8) * 4 + r % 4
    shift = 4 * (r // 4) + 16 * odd
    flat = ((n_idx // 8) * out.shape[1] + k_outer) * 32 * (tiles // 2) + lane * (tiles // 2) + i2
    values = codes.to(torch.int64).cpu() << shift
    out.view(-1).index_add_(0, flat.expand(n, k).reshape(-1), values.reshape(-1))
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)
