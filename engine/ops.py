"""Elementwise operations of the decoder, one function each, so a device can swap in fused kernels.

`model.py` calls only these for normalisation, the residual add and RoPE. The versions here are pure
torch and follow transformers' order of operations (float32 normalisation, then cast; RoPE with
rotate_half), so CPU float32 logits match transformers closely. GPU kernels (Triton) that replace
them must keep the same contract and stay within bf16 rounding of these.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalise(x), normalised in float32 and cast back to x's dtype before the scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); residual None means x is the first residual."""
    summed = x if residual is None else x + residual
    return rms_norm(summed, weight, eps), summed


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding; q [n, heads, d], k [n, kv_heads, d], cos/sin [n, 1, d]."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
