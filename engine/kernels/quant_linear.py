"""Quantized weights of the decoder's linear layers, kept quantized in device memory.

`Int4Weight` (AWQ / GPTQ, the engine's layout of int4_formats.py) and `Fp8Weight` (e4m3 with one
float32 scale per output feature; a per-tensor checkpoint scale is repeated per row, so merged q/k/v
parts keep their own) stand where a layer's `weight` tensor stands: ops.linear and its fused
variants dispatch to them. Each holds the rows of several Hugging Face projections (q/k/v, gate/up)
at their offsets and is filled part by part (`write_rows`).

Kernels: on CUDA, triton_quant's dequantize-in-register GEMV for 1..8 rows (the single-row decode
path keeps its fused residual/RMSNorm and SiLU prologues), its dequantize-tile GEMM for more rows
(int4; cuBLAS on the dequantized weight for prefill batches of many rows), and `torch._scaled_mm`
with per-token dynamic activation scales for fp8 batches. Elsewhere (CPU, CI): the reference path,
the weight dequantized to the activation dtype and multiplied by torch.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FP8_MAX = 448.0  # e4m3
# from this many rows on, one dequantization into the model dtype plus cuBLAS beats re-dequantizing
# each weight tile for every block of rows
DEQUANT_GEMM_ROWS = 1024
# tinygemm-packed int4 weights (int4_tinygemm.py): tinygemm for up to this many rows (it re-reads the
# weight for every 16 rows), triton_tinygemm's dequantize-in-registers GEMM up to DEQUANT_GEMM_ROWS,
# one dequantization into bfloat16 plus cuBLAS from there on
TINYGEMM_MAX_ROWS = 32
_triton_quant: Any = None


def _kernels(x: torch.Tensor) -> Any:
    """triton_quant for 16-bit CUDA activations when Triton is installed, else None."""
    global _triton_quant
    if not x.is_cuda or x.dtype not in (torch.float16, torch.bfloat16):
        return None
    if _triton_quant is None:
        found = importlib.util.find_spec("triton") is not None
        _triton_quant = importlib.import_module("llmdeploy_engine.kernels.triton_quant") if found else False
    return _triton_quant or None


class QuantWeight(nn.Module):
    """A [out_features, in_features] weight stored quantized; `shape` and `dtype` read as the dense
    weight's would (dtype: the activations')."""

    out_features: int
    in_features: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The dense weight [out, in] (in the stored input order: see Int4Weight.perm)."""
        raise NotImplementedError

    def stored_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    # x is [rows, in_features] in the checkpoint's input order
    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def _output(y: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
        """A kernel's result plus the bias, written into `out` when the caller gave one."""
        if bias is not None:
            y = y + bias
        if out is None:
            return y
        out.copy_(y)
        return out

    def _gemv(self, kernels: Any, x: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def _batched(
        self, kernels: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def _fusable(self) -> bool:
        return True

    def linear(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x @ weight.T (+ bias), into `out` when given."""
        x = self._input(x)
        kernels = _kernels(x)
        if kernels is not None:
            if x.stride(-1) != 1:
                x = x.contiguous()
            if x.shape[0] <= kernels.MAX_GEMV_ROWS:
                return self._gemv(kernels, x, bias=bias, out=out)[0]
            return self._batched(kernels, x, bias, out)
        y = F.linear(x, self.dequantize(x.dtype), bias)
        if out is None:
            return y
        out.copy_(y)
        return out

    def add_rms_norm_linear(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from llmdeploy_engine.kernels import ops

        kernels = _kernels(h)
        if (
            kernels is not None
            and h.shape[0] == 1
            and self._fusable()
            and (residual is None or residual.dtype == h.dtype)
            and norm_weight.dtype == h.dtype
            and h.stride(-1) == 1
            and (residual is None or residual.stride(-1) == 1)
        ):
            y, summed = self._gemv(
                kernels, h, bias=bias, prologue=1, residual=residual, norm_weight=norm_weight, eps=eps
            )
            return y, (h if summed is None else summed)
        normed, summed = ops.add_rms_norm(h, residual, norm_weight, eps)
        return self.linear(normed, bias), summed

    def silu_mul_linear(self, gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        from llmdeploy_engine.kernels import ops

        kernels = _kernels(gate_up)
        if kernels is not None and gate_up.shape[0] == 1 and self._fusable() and gate_up.stride(-1) == 1:
            return self._gemv(kernels, gate_up, out=out, prologue=2)[0]
        inter = gate_up.shape[-1] // 2
        gate, up = gate_up.split(inter, dim=-1)
        return self.linear(ops.silu_mul(gate, up), out=out)


class Int4Weight(QuantWeight):
    """4-bit codes packed along the input features (qweight [N, K/8] int32), scales [N, K/G] in the
    model dtype and zero points [N, K/G] uint8. With act-order (`act_order`) the input features are
    stored sorted by group, `perm` [K] holds the order, and inputs are gathered by it first."""

    def __init__(self, out_features: int, in_features: int, group_size: int, act_order: bool = False) -> None:
        super().__init__()
        if in_features % group_size or group_size % 8:
            raise ValueError(
                f"int4 weights need in_features ({in_features}) divisible by the group size ({group_size}), "
                "itself a multiple of 8"
            )
        self.out_features, self.in_features, self.group_size = out_features, in_features, group_size
        groups = in_features // group_size
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.zeros(out_features, groups))
        self.register_buffer("zeros", torch.zeros(out_features, groups, dtype=torch.uint8))
        self.act_order = act_order
        if act_order:
            self.register_buffer("perm", torch.zeros(in_features, dtype=torch.int64))
        self._perm_set = False
        self.tinygemm = False  # repack_tinygemm: the codes are in tinygemm's layout (tg_* buffers)

    def repack_tinygemm(self) -> bool:
        """On CUDA with bfloat16 activations, move the codes, scales and zero points into tinygemm's
        layout (int4_tinygemm.py) once the rows are written; the engine's buffers are freed. False
        (nothing changed) where tinygemm does not apply."""
        from llmdeploy_engine.kernels import int4_tinygemm as tg

        if self.tinygemm or not self.qweight.is_cuda:
            return False
        if torch.cuda.get_device_capability(self.qweight.device) < (8, 0):
            return False  # tinygemm's tensor-core path is built for SM80 and later
        if not tg.supported(self.out_features, self.in_features, self.group_size, self.scales.dtype):
            return False
        tiles = tg.inner_k_tiles(self.in_features)
        assert tiles is not None
        with torch.no_grad():
            u8 = tg.pack_bytes(self.codes())
            packed = torch.ops.aten._convert_weight_to_int4pack(u8, tiles)
            scale_zero = tg.scale_and_zero(self.scales, self.zeros)
        del u8
        self.register_buffer("tg_weight", packed)
        self.register_buffer("tg_scale_zero", scale_zero)
        empty = self.qweight.new_empty(0)
        self.qweight = empty
        self.zeros = self.zeros.new_empty(0)
        self.scales = self.scales.new_empty(0)  # keeps the dtype (`dtype`)
        self.tinygemm = True
        return True

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    def write_rows(
        self, first: int, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor
    ) -> None:
        """Rows first.. from engine-side (codes [n, K], scales [n, G], zeros [n, G]) and g_idx [K]."""
        from llmdeploy_engine.kernels.int4_formats import pack_last

        k, gs = self.in_features, self.group_size
        plain = torch.arange(k) // gs
        g_idx = g_idx.long().cpu()
        if not torch.equal(g_idx, plain):
            if not self.act_order:
                raise ValueError(
                    "the checkpoint's g_idx is not the plain group order but desc_act is false; "
                    "set desc_act: true in its quantization config"
                )
            perm = torch.argsort(g_idx, stable=True)
            if not torch.equal(g_idx[perm], plain):
                raise ValueError(f"g_idx does not put exactly {gs} input features in each group")
            if self._perm_set and not torch.equal(self.perm.cpu(), perm):
                raise ValueError(
                    "act-order projections merged into one matmul (q/k/v, gate/up) have different g_idx; "
                    "the engine needs them equal (GPTQ gives projections of one input the same order)"
                )
            codes = codes[:, perm]
            with torch.no_grad():
                self.perm.copy_(perm)
            self._perm_set = True
        elif self.act_order:
            if self._perm_set and not torch.equal(self.perm.cpu(), torch.arange(k)):
                raise ValueError("act-order projections merged into one matmul have different g_idx")
            with torch.no_grad():
                self.perm.copy_(torch.arange(k))
            self._perm_set = True
        n = codes.shape[0]
        with torch.no_grad():
            self.qweight[first : first + n].copy_(pack_last(codes))
            self.scales[first : first + n].copy_(scales)
            self.zeros[first : first + n].copy_(zeros)

    def codes(self) -> torch.Tensor:
        from llmdeploy_engine.kernels.int4_formats import unpack_last

        return unpack_last(self.qweight)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        if self.tinygemm:
            from llmdeploy_engine.kernels import triton_tinygemm

            w = triton_tinygemm.dequantize(
                self.tg_weight, self.tg_scale_zero, self.group_size, self.in_features
            )
            return w.to(dtype)
        kernels = _kernels(self.scales)
        if kernels is not None:
            return kernels.int4_dequantize(self.qweight, self.scales, self.zeros, self.group_size, dtype)
        g = torch.arange(self.in_features, device=self.qweight.device) // self.group_size
        codes = self.codes().float()
        w = (codes - self.zeros.float()[:, g]) * self.scales.float()[:, g]
        return w.to(dtype)

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(-1, self.perm) if self.act_order else x

    def _fusable(self) -> bool:
        # the prologues read inputs in order (gathered inputs go unfused) and the engine's layout
        return not self.act_order and not self.tinygemm

    def linear(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not self.tinygemm:
            return super().linear(x, bias, out)
        x = self._input(x)
        if x.stride(-1) != 1 or not x.is_contiguous():
            x = x.contiguous()
        if x.shape[0] <= TINYGEMM_MAX_ROWS:
            y = torch.ops.aten._weight_int4pack_mm(x, self.tg_weight, self.group_size, self.tg_scale_zero)
            return self._output(y, bias, out)
        if x.shape[0] < DEQUANT_GEMM_ROWS:
            from llmdeploy_engine.kernels import triton_tinygemm

            y = triton_tinygemm.gemm(x, self.tg_weight, self.tg_scale_zero, self.group_size)
            return self._output(y, bias, out)
        w = self.dequantize(x.dtype)
        if out is None:
            return F.linear(x, w, bias)
        return torch.addmm(bias, x, w.t(), out=out) if bias is not None else torch.mm(x, w.t(), out=out)

    def _gemv(self, kernels: Any, x: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        pair: tuple[torch.Tensor, torch.Tensor | None] = kernels.gemv(
            x, 0, self.qweight, self.scales, self.zeros, self.group_size, self.out_features,
            self.in_features, **kw,
        )  # fmt: skip
        return pair

    def _batched(
        self, kernels: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        if x.shape[0] >= DEQUANT_GEMM_ROWS:
            w = self.dequantize(x.dtype)
            if out is None:
                return F.linear(x, w, bias)
            return torch.addmm(bias, x, w.t(), out=out) if bias is not None else torch.mm(x, w.t(), out=out)
        result: torch.Tensor = kernels.int4_gemm(
            x, self.qweight, self.scales, self.zeros, self.group_size, bias=bias, out=out
        )
        return result


class Fp8Weight(QuantWeight):
    """e4m3 weight bytes [N, K] (uint8, so the model's dtype cast leaves them) and float32 scales [N]
    (stored as their int32 bit patterns, for the same reason)."""

    def __init__(self, out_features: int, in_features: int) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.register_buffer("weight_bytes", torch.zeros(out_features, in_features, dtype=torch.uint8))
        self.register_buffer("scale_bits", torch.zeros(out_features, dtype=torch.int32))
        # the activations' dtype (the model's): a float buffer the model's dtype cast converts
        self.register_buffer("like", torch.zeros(0))

    @property
    def dtype(self) -> torch.dtype:
        return self.like.dtype

    @property
    def weight_scale(self) -> torch.Tensor:
        return self.scale_bits.view(torch.float32)

    def write_rows(self, first: int, weight: torch.Tensor, scale: torch.Tensor) -> None:
        """Rows first.. from an e4m3 weight [n, K] and its scale: one value (per tensor) or [n]."""
        n = weight.shape[0]
        scale = scale.float().flatten()
        if scale.numel() == 1:
            scale = scale.expand(n)
        if scale.numel() != n:
            raise ValueError(f"fp8 weight_scale has {scale.numel()} values for {n} rows; want 1 or {n}")
        with torch.no_grad():
            self.weight_bytes[first : first + n].copy_(weight.to(torch.float8_e4m3fn).view(torch.uint8))
            self.scale_bits[first : first + n].copy_(scale.contiguous().view(torch.int32))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        w = self.weight_bytes.view(torch.float8_e4m3fn).float() * self.weight_scale[:, None]
        return w.to(dtype)

    def _gemv(self, kernels: Any, x: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        pair: tuple[torch.Tensor, torch.Tensor | None] = kernels.gemv(
            x, 1, self.weight_bytes, self.weight_scale, None, 0, self.out_features, self.in_features, **kw
        )
        return pair

    def _batched(
        self, kernels: Any, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        # per-token dynamic activation scales (the checkpoint's static input_scale is not used)
        # in the activations' dtype: float32 copies of x would cost 8 bytes an element of activation
        # memory at prefill (0.9 GiB for the 8B's down projection at 8,192 tokens); the scale passed
        # on is the reciprocal of the multiplier actually used, so the rounding of 1 / scale cancels
        amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
        inverse = (FP8_MAX / amax).to(x.dtype)
        x_scale = 1.0 / inverse.float()
        xq = (x * inverse).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        w = self.weight_bytes.view(torch.float8_e4m3fn)
        y = torch._scaled_mm(
            xq, w.t(), scale_a=x_scale, scale_b=self.weight_scale[None, :], out_dtype=x.dtype
        )
        return self._output(y, bias, out)
