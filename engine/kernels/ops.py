"""Elementwise operations of the decoder, one function each, so a device can swap in fused kernels.

`model.py` calls only these for normalisation, the residual add, RoPE (with the KV-cache write when
the step has a cache) and the MLP's SiLU gate. The versions here are pure
torch and follow transformers' order of operations (float32 normalisation, then cast; RoPE with
rotate_half), so CPU float32 logits match transformers closely. GPU kernels (Triton) that replace
them must keep the same contract and stay within bf16 rounding of these.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from llmdeploy_engine.kernels.kv_cache import FP8_DTYPES, write_kv
from llmdeploy_engine.kernels.quant_linear import QuantWeight

_FUSED_DTYPES = (torch.bfloat16, torch.float16)
_triton_ops: Any = None  # engine.triton_ops once imported; False when triton is missing
_gemv_kernels: list[Any] | None = None  # [triton_gemv] once imported ([] without triton)


def _fused(x: torch.Tensor, weight: torch.Tensor | None = None) -> Any:
    """triton_ops for 16-bit CUDA tensors when Triton is installed, else None (pure torch)."""
    if not x.is_cuda or x.dtype not in _FUSED_DTYPES or (weight is not None and weight.dtype != x.dtype):
        return None
    return _load_triton_ops()


def _load_triton_ops() -> Any:
    """engine.triton_ops, or None when triton is missing."""
    global _triton_ops
    if _triton_ops is None:
        try:
            from llmdeploy_engine.kernels import triton_ops
        except ImportError:
            _triton_ops = False
        else:
            _triton_ops = triton_ops
    return _triton_ops or None


def _gemv(x: torch.Tensor, weight: torch.Tensor) -> Any:
    """triton_gemv when its fused kernel takes x @ weight.T, else None (cuBLAS and separate kernels).

    One row only: on the H200 the fused kernel beat cuBLAS plus the separate
    norm / SiLU kernels on every projection of both models at one row (1.0-1.9x), lost at four rows
    on the 8B's large shapes (0.3-0.5x), and a 9-64-row tensor-core version lost on almost every shape
    (0.2-0.75x), so batches of more than one row keep cuBLAS."""
    global _gemv_kernels
    if x.shape[0] != 1 or not x.is_cuda or x.dtype not in _FUSED_DTYPES or weight.dtype != x.dtype:
        return None
    if _gemv_kernels is None:
        # without triton the torch composition runs; with it, a module that fails to import is a bug
        found = importlib.util.find_spec("triton") is not None
        _gemv_kernels = [importlib.import_module("llmdeploy_engine.kernels.triton_gemv")] if found else []
    for module in _gemv_kernels:
        if module.supported(x, weight):
            return module
    return None


def linear(
    x: torch.Tensor,
    weight: torch.Tensor | QuantWeight,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T (+ bias), into `out` when given ([rows, out_features], rows may be strided);
    a quantized weight (quant_linear.py) runs its own kernels."""
    if isinstance(weight, QuantWeight):
        return weight.linear(x, bias, out=out)
    fused = _gemv(x, weight)
    if fused is not None:
        result: torch.Tensor = fused.linear(x, weight, bias, out=out)
        return result
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def add_rms_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor | QuantWeight,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(x + residual)), x + residual): add_rms_norm then the projection, one kernel
    for single-row 16-bit CUDA batches (the decoder layer's norm + QKV and norm + gate_up)."""
    if isinstance(weight, QuantWeight):
        return weight.add_rms_norm_linear(x, residual, norm_weight, eps, bias)
    fused = _gemv(x, weight)
    if fused is not None and (residual is None or residual.dtype == x.dtype) and norm_weight.dtype == x.dtype:
        pair: tuple[torch.Tensor, torch.Tensor] = fused.add_rms_norm_linear(
            x, residual, norm_weight, eps, weight, bias
        )
        return pair
    normed, summed = add_rms_norm(x, residual, norm_weight, eps)
    return F.linear(normed, weight, bias), summed


def silu_mul_linear(
    gate_up: torch.Tensor, weight: torch.Tensor | QuantWeight, out: torch.Tensor | None = None
) -> torch.Tensor:
    """linear(silu_mul(gate, up), weight) for the merged gate_up output [rows, 2 * inter] (the MLP's
    down projection), one kernel for single-row 16-bit CUDA batches; into `out` as `linear`."""
    if isinstance(weight, QuantWeight):
        return weight.silu_mul_linear(gate_up, out=out)
    inter = gate_up.shape[-1] // 2
    fused = _gemv(gate_up[..., :inter], weight)
    if fused is not None:
        result: torch.Tensor = fused.silu_mul_linear(gate_up, weight, out=out)
        return result
    gate, up = gate_up.split(inter, dim=-1)
    return linear(silu_mul(gate, up), weight, out=out)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalise(x), normalised in float32 and cast back to x's dtype before the scale."""
    fused = _fused(x, weight)
    if fused is not None:
        result: torch.Tensor = fused.rms_norm(x, weight, eps)
        return result
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # the same float32 operations in torch's C++ composite, the same bits: six ops with no
        # Python between them (a CPU decode step runs 61 of these)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); residual None means x is the first residual."""
    fused = _fused(x, weight)
    if fused is not None and (residual is None or residual.dtype == x.dtype):
        pair: tuple[torch.Tensor, torch.Tensor] = fused.add_rms_norm(x, residual, weight, eps)
        return pair
    summed = x if residual is None else x + residual
    return rms_norm(summed, weight, eps), summed


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox RoPE tables for `apply_rope` / `rope_and_cache`: cos and sin [n, 1, 2 * len(inv_freq)]
    of positions * inv_freq in float32 (transformers' order), both halves equal, cast to dtype."""
    half = inv_freq.shape[0]
    if (
        positions.is_cuda
        and dtype in _FUSED_DTYPES
        and inv_freq.dtype == torch.float32
        and half & (half - 1) == 0
        and _load_triton_ops() is not None
    ):
        pair: tuple[torch.Tensor, torch.Tensor] = _triton_ops.rope_tables(positions, inv_freq, dtype)
        return pair
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding; q [n, heads, d], k [n, kv_heads, d], cos/sin [n, 1, d]."""
    fused = _fused(q)
    if (
        fused is not None
        and k.dtype == q.dtype
        and cos.dtype == q.dtype
        and (q.shape[-1] // 2) & (q.shape[-1] // 2 - 1) == 0
    ):
        pair: tuple[torch.Tensor, torch.Tensor] = fused.apply_rope(q, k, cos, sin)
        return pair
    qk = _adjacent_heads(q, k)
    if qk is not None:
        # q and k are neighbouring column ranges of the QKV output: one pass over both heads (the
        # same elementwise products, half the ops: a decode step's fixed cost on CPU)
        rotated = qk * cos + rotate_half(qk) * sin
        return rotated[:, : q.shape[1]], rotated[:, q.shape[1] :]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _adjacent_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """q [n, heads, d] and k [n, kv_heads, d] as one [n, heads + kv_heads, d] view when k's heads
    follow q's in memory row by row (both split from one merged projection), else None."""
    if q.dim() != 3 or k.dim() != 3 or q.dtype != k.dtype or q.device != k.device:
        return None
    n, heads, d = q.shape
    if k.shape[0] != n or k.shape[2] != d or q.stride()[1:] != (d, 1) or k.stride()[1:] != (d, 1):
        return None
    if k.data_ptr() != q.data_ptr() + heads * d * q.element_size():
        return None
    if k.untyped_storage().data_ptr() != q.untyped_storage().data_ptr():  # neighbours by chance
        return None
    # one row: its stride is whatever a view chose (views of size-1 dims need not agree)
    row_stride = (heads + k.shape[1]) * d if n == 1 else q.stride(0)
    if n > 1 and (k.stride(0) != row_stride or row_stride < (heads + k.shape[1]) * d):
        return None
    return q.as_strided((n, heads + k.shape[1], d), (row_stride, d, 1))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up (the gated MLP's activation); gate and up may be views of one merged GEMM output."""
    fused = _fused(gate)
    if fused is not None and up.dtype == gate.dtype and up.shape == gate.shape:
        result: torch.Tensor = fused.silu_mul(gate, up)
        return result
    return F.silu(gate) * up


def rope_and_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rope(q, k), then the rotated k and v stored into their cache slots (fp8 caches quantized
    with k_scale / v_scale, the contract of attention.py): returns the rotated (q, k). Attention is
    then told the write is done (paged_attention's kv_written). One Triton launch for 16-bit CUDA
    tensors with a cache of their dtype or fp8; RoPE then kv_cache.write_kv elsewhere."""
    k_cache = kv_cache[0]
    fused = _fused(q)
    if (
        fused is not None
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and cos.dtype == q.dtype
        and (q.shape[-1] // 2) & (q.shape[-1] // 2 - 1) == 0
        and (k_cache.dtype == q.dtype or k_cache.dtype in FP8_DTYPES)
        and k_cache.stride() == kv_cache[1].stride()
        and k_cache.stride(-1) == 1
    ):
        pair: tuple[torch.Tensor, torch.Tensor] = fused.rope_and_cache(
            q, k, v, cos, sin, kv_cache, slot_mapping, k_scale, v_scale
        )
        return pair
    q, k = apply_rope(q, k, cos, sin)
    write_kv(k_cache, slot_mapping, k, k_scale)
    write_kv(kv_cache[1], slot_mapping, v, v_scale)
    return q, k
