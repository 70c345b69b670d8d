"""Checkpoint tensors of one quantized projection -> this rank's rows / columns of a QuantWeight.

A Hugging Face projection (q_proj, down_proj, ...) of a quantized checkpoint is several tensors
(AWQ: qweight, qzeros, scales; GPTQ: the same plus g_idx; fp8: weight, weight_scale). They arrive
one at a time; `PartLoader` keeps them until a projection is complete, converts it to the engine's
layout (int4_formats.py) and writes this rank's slice: output rows for column-parallel layers,
input columns for row-parallel ones.
"""

from __future__ import annotations

import torch
from llmdeploy_engine.kernels.int4_formats import unpack_awq, unpack_gptq
from llmdeploy_engine.kernels.quant_linear import Fp8Weight, Int4Weight, QuantWeight
from llmdeploy_engine.model.quant_config import QuantSpec


def make_weight(spec: QuantSpec, out_features: int, in_features: int) -> QuantWeight:
    if spec.method == "fp8":
        return Fp8Weight(out_features, in_features)
    return Int4Weight(out_features, in_features, spec.group(in_features), act_order=spec.desc_act)


def quant_shapes(spec: QuantSpec, name: str, out_full: int, in_full: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor shapes of projection `name` ([out_full, in_full] as a dense weight)."""
    if spec.method == "fp8":
        scale = (out_full,) if spec.fp8_strategy == "channel" else (1,)
        return {f"{name}.weight": (out_full, in_full), f"{name}.weight_scale": scale}
    for what, size in (("output", out_full), ("input", in_full)):
        if size % 8:
            raise ValueError(f"{name}: int4 needs {what} features divisible by 8, got {size}")
    groups = in_full // spec.group(in_full)
    shapes = {f"{name}.qzeros": (groups, out_full // 8), f"{name}.scales": (groups, out_full)}
    if spec.method == "awq":
        shapes[f"{name}.qweight"] = (in_full, out_full // 8)
    else:
        shapes[f"{name}.qweight"] = (in_full // 8, out_full)
        shapes[f"{name}.g_idx"] = (in_full,)
    return shapes


class PartLoader:
    """Collects each projection's tensors and writes them into `weight` once complete."""

    def __init__(self, spec: QuantSpec, weight: QuantWeight) -> None:
        self.spec, self.weight = spec, weight
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def add(
        self,
        part: str,
        kind: str,
        full: torch.Tensor,
        expected: int,
        rows: tuple[int, int, int] | None = None,
        cols: tuple[int, int] | None = None,
    ) -> None:
        """Tensor `kind` (qweight, scales, ...) of projection `part`, of `expected` tensors in all.
        rows: (first full row, rows, first local row) to take; cols: (first input column, columns)."""
        got = self.pending.setdefault(part, {})
        got[kind] = full
        if len(got) < expected:
            return
        del self.pending[part]
        if self.spec.method == "fp8":
            w, scale = got["weight"], got["weight_scale"].float().flatten()
            first, n, dest = rows if rows is not None else (0, w.shape[0], 0)
            w = w.narrow(0, first, n)
            if scale.numel() > 1:
                scale = scale.narrow(0, first, n)
            if cols is not None:
                w = w.narrow(1, cols[0], cols[1])
            assert isinstance(self.weight, Fp8Weight)
            self.weight.write_rows(dest, w, scale)
            return
        if self.spec.method == "awq":
            codes, scales, zeros = unpack_awq(got["qweight"], got["qzeros"], got["scales"])
            g_idx = torch.arange(codes.shape[1]) // self.spec.group(codes.shape[1])
        else:
            codes, scales, zeros = unpack_gptq(
                got["qweight"], got["qzeros"], got["scales"], self.spec.zeros_offset
            )
            g_idx = got["g_idx"].long()
        first, n, dest = rows if rows is not None else (0, codes.shape[0], 0)
        codes, scales, zeros = (
            codes.narrow(0, first, n),
            scales.narrow(0, first, n),
            zeros.narrow(0, first, n),
        )
        if cols is not None and cols[1] != codes.shape[1]:  # a tensor-parallel rank's input slice
            start, width = cols
            assert isinstance(self.weight, Int4Weight)
            gs = self.weight.group_size
            plain = torch.arange(codes.shape[1]) // self.spec.group(codes.shape[1])
            if start % gs or width % gs or not torch.equal(g_idx, plain):
                raise ValueError(
                    f"{part}: this tensor_parallel_size splits its {codes.shape[1]} input features into "
                    f"{width}-wide slices that do not hold whole groups of {gs} in order (act-order or "
                    "group_size -1); use tensor_parallel_size 1 for this checkpoint"
                )
            codes = codes.narrow(1, start, width)
            scales = scales.narrow(1, start // gs, width // gs)
            zeros = zeros.narrow(1, start // gs, width // gs)
            g_idx = torch.arange(width) // gs
        assert isinstance(self.weight, Int4Weight)
        self.weight.write_rows(dest, codes, scales, zeros, g_idx)
