"""Quantized linear layers (AWQ, GPTQ, fp8) on the CPU reference path: the checkpoint layouts' bit
order, and each layer's products (plain, after add + RMSNorm, after SiLU(gate) * up) against a
float64 reference dequantized from the codes before they were packed, on random shapes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.kernels.int4_formats import (
    AWQ_ORDER,
    dequantize_int4,
    pack_awq,
    pack_gptq,
    quantize_int4,
    unpack_awq,
    unpack_gptq,
)
from llmdeploy_engine.loading.hf_loader import normalize_quantized
from llmdeploy_engine.loading.quant_checkpoint import quantization_config, quantize_tensors
from llmdeploy_engine.model.parallel_layers import MergedColumnParallelLinear, RowParallelLinear
from llmdeploy_engine.model.quant_config import quant_spec_from_dict

# (method, options): every layout the loader reads
LAYOUTS: list[tuple[str, dict[str, Any]]] = [
    ("awq", {}),
    ("awq", {"group_size": 64}),
    ("gptq", {"sym": True}),
    ("gptq", {"sym": False}),
    ("gptq", {"sym": False, "checkpoint_format": "gptq_v2"}),
    ("gptq", {"sym": True, "desc_act": True}),
    ("gptq", {"sym": False, "desc_act": True}),
    ("gptq", {"sym": True, "group_size": -1}),
    ("fp8", {"fp8_strategy": "tensor"}),
    ("fp8", {"fp8_strategy": "channel"}),
]
SHAPES = [(64, 128), (40, 384), (136, 256)]  # (N, K): N not a power of two, K several groups
BF16_BOUND = 1e-2  # relative error of bf16 activations and products (METHOD: between 1e-3 and 1e-2)


def test_awq_word_holds_columns_in_the_interleaved_order() -> None:
    codes = torch.arange(8, dtype=torch.uint8).reshape(1, 8).repeat(8, 1) + 1  # column c holds c + 1
    codes = codes.t().contiguous()  # engine side [N=8, K=8]: row n holds n + 1
    packed = pack_awq(codes, torch.ones(8, 1), torch.zeros(8, 1, dtype=torch.uint8))
    word = int(packed["qweight"][0, 0]) & 0xFFFFFFFF
    nibbles = [(word >> (4 * i)) & 0xF for i in range(8)]
    assert nibbles == [AWQ_ORDER[i] + 1 for i in range(8)]  # nibble i: output column (0,2,4,6,1,3,5,7)[i]
    assert torch.equal(unpack_awq(packed["qweight"], packed["qzeros"], packed["scales"])[0], codes)


def test_gptq_packs_inputs_in_order_and_stores_zero_minus_one() -> None:
    codes = (torch.arange(16, dtype=torch.uint8) % 16).reshape(1, 16).repeat(8, 1)  # input k holds k
    zeros = torch.full((8, 1), 5, dtype=torch.uint8)
    packed = pack_gptq(codes, torch.ones(8, 1), zeros, torch.zeros(16, dtype=torch.int32), zeros_offset=1)
    assert packed["qweight"].shape == (2, 8)
    word = int(packed["qweight"][1, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == list(range(8, 16))
    assert int(packed["qzeros"][0, 0]) & 0xF == 4  # zero 5 stored as 4
    back = unpack_gptq(packed["qweight"], packed["qzeros"], packed["scales"], 1)
    assert torch.equal(back[0], codes) and torch.equal(back[2], zeros)


def _reference(method: str, tensors: dict[str, torch.Tensor], base: str, k: int) -> torch.Tensor:
    """float64 [N, K] weight straight from the checkpoint tensors (the formats' definitions)."""
    if method == "fp8":
        return tensors[f"{base}.weight"].double() * tensors[f"{base}.weight_scale"].double().reshape(-1, 1)
    qcfg = quant_spec_from_dict(tensors["__cfg__"])  # type: ignore[arg-type]
    if method == "awq":
        codes, scales, zeros = unpack_awq(
            tensors[f"{base}.qweight"], tensors[f"{base}.qzeros"], tensors[f"{base}.scales"]
        )
        g_idx = torch.arange(k) // qcfg.group(k)
    else:
        codes, scales, zeros = unpack_gptq(
            tensors[f"{base}.qweight"],
            tensors[f"{base}.qzeros"],
            tensors[f"{base}.scales"],
            qcfg.zeros_offset,
        )
        g_idx = tensors[f"{base}.g_idx"]
    return dequantize_int4(codes, scales, zeros, g_idx)


def _checkpoint(method: str, options: dict[str, Any], names: list[str], n: int, k: int, seed: int):
    """(spec, tensors) of projections `names`, [n, k] each; act-order ones share one input order
    (GPTQ gives projections of one input the same order: their Hessians are equal)."""
    qcfg = quantization_config(method, **options)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {"__cfg__": qcfg}
    for name in names:
        w = torch.randn(n, k, generator=gen) * k**-0.5
        tensors.update(
            quantize_tensors(f"{name}.weight", w, method, qcfg, torch.Generator().manual_seed(seed))
        )
    spec = quant_spec_from_dict(qcfg)
    return spec, {
        "__cfg__": qcfg,
        **normalize_quantized(spec, {k: v for k, v in tensors.items() if k != "__cfg__"}),
    }


def test_quantizer_error_is_small() -> None:
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(0))
    codes, scales, zeros = quantize_int4(w, 128, sym=False)
    deq = dequantize_int4(codes, scales, zeros, torch.arange(256) // 128)
    assert float((deq - w.double()).abs().max()) <= float(scales.max()) / 2 + 1e-6


@pytest.mark.parametrize(("method", "options"), LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_row_parallel_matches_float64(method: str, options: dict[str, Any], shape: tuple[int, int]) -> None:
    n, k = shape
    spec, tensors = _checkpoint(method, options, ["down_proj"], n, k, seed=n + k)
    layer = RowParallelLinear(k, n, "down_proj", quant=spec).to(torch.bfloat16)
    for name in layer.hf_shapes():
        assert tuple(tensors[name].shape) == layer.hf_shapes()[name], name
        layer.load_hf(name, tensors[name])
    ref_w = _reference(method, tensors, "down_proj", k)
    gen = torch.Generator().manual_seed(7)
    for rows in (1, 3, 17):
        x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        got = layer(x)
        ref = x.double() @ ref_w.T
        err = float((got.double() - ref).norm() / ref.norm())
        assert got.dtype == torch.bfloat16 and err < BF16_BOUND, (rows, err)
    # the fused down projection: SiLU(gate) * up first
    gate_up = torch.randn(2, 2 * k, generator=gen).to(torch.bfloat16)
    got = layer(gate_up, silu_mul=True)
    act = ops.silu_mul(gate_up[:, :k], gate_up[:, k:]).double()
    ref = act @ ref_w.T
    assert float((got.double() - ref).norm() / ref.norm()) < BF16_BOUND


@pytest.mark.parametrize(("method", "options"), LAYOUTS)
def test_merged_column_matches_float64(method: str, options: dict[str, Any]) -> None:
    k, inter = 256, 72 if method == "fp8" else 80
    spec, tensors = _checkpoint(method, options, ["gate_proj", "up_proj"], inter, k, seed=3)
    layer = MergedColumnParallelLinear(k, inter, ("gate_proj", "up_proj"), quant=spec).to(torch.bfloat16)
    for name in layer.hf_shapes():
        layer.load_hf(name, tensors[name])
    ref_w = torch.cat([_reference(method, tensors, p, k) for p in ("gate_proj", "up_proj")])
    gen = torch.Generator().manual_seed(11)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(torch.bfloat16)
    for rows in (1, 9):
        h = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        res = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        got, summed = layer.forward_normed(h, res, norm_w, 1e-6)
        normed, want_sum = ops.add_rms_norm(h, res, norm_w, 1e-6)
        assert torch.equal(summed, want_sum)
        ref = normed.double() @ ref_w.T
        assert float((got.double() - ref).norm() / ref.norm()) < BF16_BOUND


def test_merged_act_order_projections_must_share_g_idx() -> None:
    spec, tensors = _checkpoint("gptq", {"sym": True, "desc_act": True}, ["gate_proj", "up_proj"], 64, 256, 1)
    tensors.update(
        (name, t)
        for name, t in _checkpoint("gptq", {"sym": True, "desc_act": True}, ["up_proj"], 64, 256, 2)[
            1
        ].items()
        if name.startswith("up_proj")
    )
    layer = MergedColumnParallelLinear(256, 64, ("gate_proj", "up_proj"), quant=spec)
    with pytest.raises(ValueError, match="different g_idx"):
        for name in layer.hf_shapes():
            layer.load_hf(name, tensors[name])


def test_quantized_weights_are_stored_smaller() -> None:
    n, k = 256, 1024
    for method, options, bytes_per_weight in (("awq", {}, 0.5 + 3 / 128), ("fp8", {}, 1.0)):
        spec, _ = _checkpoint(method, options, ["o_proj"], n, k, 0)
        layer = RowParallelLinear(k, n, "o_proj", quant=spec).to(torch.bfloat16)
        stored = layer.weight.stored_bytes()  # type: ignore[union-attr]
        assert stored == pytest.approx(n * k * bytes_per_weight, rel=0.01), method


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"quant_method": "awq", "bits": 3, "group_size": 128}, "only 4-bit"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "only the GEMM layout"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format"),
        ({"quant_method": "bitsandbytes"}, "not supported by the built-in engine"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise"),
    ],
)
def test_unsupported_configs_are_refused_clearly(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quant_spec_from_dict(cfg)
