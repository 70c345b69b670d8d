"""On a CUDA GPU (or Triton's CPU interpreter in float32): triton_quant's int4 / fp8 GEMV with its
fused prologues, the int4 dequantize-tile GEMM and the dequantize kernel against float64 references
dequantized from the codes, on random shapes; and the quantized layers through ops at the decode and
prefill row counts (on the GPU), against the layers' CPU reference path."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRET, TRITON_TEST_MARKS
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.kernels.int4_formats import dequantize_int4, pack_last, quantize_int4

pytestmark = TRITON_TEST_MARKS
DTYPE = torch.float32 if INTERPRET else torch.bfloat16
BOUND = 1e-5 if INTERPRET else 1e-2  # relative error (norm) against float64
# (N, K): small and ragged in the interpreter; Llama-3.1-8B's qkv, o_proj and down on the GPU
SHAPES = [(40, 256), (24, 384)] if INTERPRET else [(6144, 4096), (4096, 4096), (4096, 14336), (1000, 384)]


def _int4(n: int, k: int, group: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    codes, scales, zeros = quantize_int4(w, group, sym=False)
    dev = (pack_last(codes).to(DEVICE), scales.to(DEVICE, DTYPE), zeros.to(DEVICE))
    ref = dequantize_int4(codes, dev[1].float().cpu(), zeros, torch.arange(k) // group)
    return dev, ref


def _fp8(n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    scale = w.abs().amax(1) / 448.0
    q = (w / scale[:, None]).to(torch.float8_e4m3fn)
    ref = q.double() * scale.double()[:, None]
    return (q.view(torch.uint8).to(DEVICE), scale.to(DEVICE)), ref


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double().cpu() - ref).norm() / ref.norm())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_gemv_plain_norm_silu(shape: tuple[int, int], rows: int, fmt: str) -> None:
    from llmdeploy_engine.kernels import triton_quant

    n, k = shape
    gen = torch.Generator().manual_seed(n + k + rows)
    if fmt == "int4":
        (qw, s, z), ref_w = _int4(n, k, 128, n + k)
        args = (0, qw, s, z, 128, n, k)
    else:
        (qw, s), ref_w = _fp8(n, k, n + k)
        args = (1, qw, s, None, 0, n, k)
    x = torch.randn(rows, k, generator=gen).to(DEVICE, DTYPE)
    y = torch.full((rows, n), float("nan"), dtype=DTYPE, device=DEVICE)
    got, _ = triton_quant.gemv(x, *args, out=y)
    assert _err(got, x.double().cpu() @ ref_w.T) < BOUND
    # add + RMSNorm prologue, the residual sum written
    res = torch.randn(rows, k, generator=gen).to(DEVICE, DTYPE)
    nw = (1 + 0.1 * torch.randn(k, generator=gen)).to(DEVICE, DTYPE)
    got, summed = triton_quant.gemv(x, *args, prologue=1, residual=res, norm_weight=nw, eps=1e-6)
    normed, want_sum = ops.add_rms_norm(x.cpu().float(), res.cpu().float(), nw.cpu().float(), 1e-6)
    assert summed is not None and torch.allclose(summed.float().cpu(), want_sum, rtol=1e-2, atol=1e-2)
    assert _err(got, normed.double() @ ref_w.T) < 2 * BOUND
    # SiLU(gate) * up prologue over a merged gate_up input
    gu = torch.randn(rows, 2 * k, generator=gen).to(DEVICE, DTYPE)
    got, _ = triton_quant.gemv(gu, *args, prologue=2)
    act = torch.nn.functional.silu(gu[:, :k].double().cpu()) * gu[:, k:].double().cpu()
    assert _err(got, act @ ref_w.T) < 2 * BOUND


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [9, 64] if INTERPRET else [9, 64, 256, 2048])
def test_int4_gemm_and_dequantize(shape: tuple[int, int], rows: int) -> None:
    from llmdeploy_engine.kernels import triton_quant

    n, k = shape
    (qw, s, z), ref_w = _int4(n, k, 128, n * 3 + k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(DEVICE, DTYPE)
    got = triton_quant.int4_gemm(x, qw, s, z, 128)
    assert got.shape == (rows, n) and _err(got, x.double().cpu() @ ref_w.T) < BOUND
    deq = triton_quant.int4_dequantize(qw, s, z, 128, DTYPE)
    assert float((deq.double().cpu() - ref_w).abs().max()) <= 1e-2 * float(ref_w.abs().max())


@pytest.mark.skipif(INTERPRET, reason="the layers dispatch to the kernels on CUDA only")
@pytest.mark.parametrize("method", ["awq", "gptq-act-order", "fp8"])
def test_quantized_layers_on_cuda_match_their_cpu_reference(method: str) -> None:
    from llmdeploy_engine.loading.quant_checkpoint import quantization_config, quantize_tensors
    from llmdeploy_engine.model.parallel_layers import MergedColumnParallelLinear, RowParallelLinear
    from llmdeploy_engine.model.quant_config import quant_spec_from_dict

    name, opts = method.split("-")[0], ({"desc_act": True} if "act" in method else {})
    qcfg = quantization_config(name, **opts)
    spec = quant_spec_from_dict(qcfg)
    k, inter = 4096, 14336
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    for proj, (n, kk) in {"gate_proj": (inter, k), "up_proj": (inter, k), "down_proj": (k, inter)}.items():
        w = torch.randn(n, kk, generator=gen) * kk**-0.5
        tensors.update(quantize_tensors(f"{proj}.weight", w, name, qcfg, torch.Generator().manual_seed(1)))
    layers = {}
    for device in ("cpu", "cuda"):
        gate_up = MergedColumnParallelLinear(k, inter, ("gate_proj", "up_proj"), quant=spec).to(
            torch.bfloat16
        )
        down = RowParallelLinear(inter, k, "down_proj", quant=spec).to(torch.bfloat16)
        for layer in (gate_up, down):
            for hf in layer.hf_shapes():
                layer.load_hf(hf, tensors[hf])
        layers[device] = (gate_up.to(device), down.to(device))
    nw = (1 + 0.1 * torch.randn(k, generator=gen)).to(torch.bfloat16)
    for rows in (1, 4, 48, 300, 1100):
        h = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        res = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        outs = []
        for device in ("cpu", "cuda"):
            gate_up, down = layers[device]
            gu, _ = gate_up.forward_normed(h.to(device), res.to(device), nw.to(device), 1e-6)
            outs.append(down(gu, silu_mul=True).double().cpu())
        # fp8 batches of more than 8 rows also quantize the activations per token (W8A8, as vLLM's
        # fp8 path does): e4m3's 3 mantissa bits put them a few percent off the bf16 reference
        bound = 6e-2 if name == "fp8" and rows > 8 else 2e-2
        assert _err(outs[1], outs[0]) < bound, rows
