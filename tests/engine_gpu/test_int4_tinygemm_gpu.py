"""On a CUDA GPU (SM80+): torch's `_convert_weight_to_int4pack` against int4_tinygemm's plain-torch
layout, the Triton dequantization of that layout against the plain-torch one, and AWQ / GPTQ
(act-order too) layers repacked for tinygemm against their CPU reference at decode and prefill row
counts (tinygemm up to TINYGEMM_MAX_ROWS, dequantize + cuBLAS above)."""

from __future__ import annotations

import pytest
import torch
from llmdeploy_engine.kernels import int4_tinygemm as tg
from llmdeploy_engine.kernels.quant_linear import TINYGEMM_MAX_ROWS, Int4Weight

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
        reason="needs an SM80+ GPU",
    ),
]


@pytest.mark.parametrize(("n", "k"), [(64, 256), (6144, 4096), (4096, 14336), (1000, 384)])
def test_torch_packing_is_the_documented_layout(n: int, k: int) -> None:
    tiles = tg.inner_k_tiles(k)
    assert tiles is not None
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    got = torch.ops.aten._convert_weight_to_int4pack(tg.pack_bytes(codes).cuda(), tiles).cpu()
    if n * k <= 2**22:
        assert torch.equal(got, tg.reference_pack(codes, tiles))
    assert torch.equal(tg.unpack_codes(got.cuda(), n, k).cpu(), codes)


@pytest.mark.parametrize(
    ("n", "k", "group"), [(6144, 4096, 128), (4096, 14336, 128), (1000, 384, 32), (512, 512, 256)]
)
def test_triton_dequantize_matches_plain_torch(n: int, k: int, group: int) -> None:
    from llmdeploy_engine.kernels import triton_tinygemm

    gen = torch.Generator().manual_seed(k)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3).to(torch.bfloat16)
    zeros = torch.randint(0, 16, (n, k // group), dtype=torch.uint8, generator=gen)
    tiles = tg.inner_k_tiles(k) or 0
    packed = torch.ops.aten._convert_weight_to_int4pack(tg.pack_bytes(codes).cuda(), tiles)
    sz = tg.scale_and_zero(scales, zeros).cuda()
    got = triton_tinygemm.dequantize(packed, sz, group, k)
    want = tg.dequantize(packed, sz, group, k, torch.float32).to(torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=0)  # one bfloat16 rounding


@pytest.mark.parametrize("method", ["awq", "gptq", "gptq-act-order"])
def test_repacked_layers_match_their_cpu_reference(method: str) -> None:
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
    repacked = [
        w.repack_tinygemm() for layer in layers["cuda"] for w in layer.modules() if isinstance(w, Int4Weight)
    ]
    assert repacked == [True, True]
    nw = (1 + 0.1 * torch.randn(k, generator=gen)).to(torch.bfloat16)
    for rows in (1, 4, TINYGEMM_MAX_ROWS, TINYGEMM_MAX_ROWS + 1, 300, 1100):
        h = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        res = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        outs = []
        for device in ("cpu", "cuda"):
            gate_up, down = layers[device]
            gu, _ = gate_up.forward_normed(h.to(device), res.to(device), nw.to(device), 1e-6)
            outs.append(down(gu, silu_mul=True).double().cpu())
        err = float((outs[1] - outs[0]).norm() / outs[0].norm())
        assert err < 2e-2, (rows, err)
