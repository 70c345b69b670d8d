"""On a CUDA GPU (or Triton's CPU interpreter in float32): the kernels that cut launches per decode
step against ops.py's torch twins and float64 references - SiLU(gate) * up read from the merged
gate_up output, RoPE fused with the KV-cache write (16-bit and fp8 caches), and the Triton decode
path taking per-step context lengths and skipping the gather of in-order decodes."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from llmdeploy_engine import ops

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
    pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="needs a CUDA GPU (or TRITON_INTERPRET=1)"),
]
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float16, torch.float32]


def ulp(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4864), (1, 14336), (7, 896), (3, 5, 100), (0, 64)])
def test_silu_mul_reads_the_merged_output(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    from llmdeploy_engine import triton_ops

    gen = torch.Generator().manual_seed(shape[-1])
    merged = (torch.randn(*shape[:-1], 2 * shape[-1], generator=gen) * 4).to(DEVICE, dtype)
    gate, up = merged.split(shape[-1], dim=-1)  # strided views, as MergedColumnParallelLinear returns
    got = triton_ops.silu_mul(gate, up)
    assert got.shape == gate.shape and got.dtype == dtype and got.is_contiguous()
    if got.numel() == 0:
        return
    want = F.silu(gate.cpu()) * up.cpu()  # ops.py's torch twin, same dtype
    g64, u64 = gate.cpu().double(), up.cpu().double()
    ref = g64 * torch.sigmoid(g64) * u64
    scale = float(ref.abs().max())
    tol = 4 * ulp(dtype) if dtype != torch.float32 else 1e-5
    assert float((got.cpu().double() - ref).abs().max()) / scale < tol
    assert float((got.cpu().double() - want.double()).abs().max()) / scale < tol


@pytest.mark.skipif(DEVICE != "cuda", reason="the dispatch runs on CUDA tensors only")
def test_ops_silu_mul_dispatch() -> None:
    gen = torch.Generator().manual_seed(1)
    merged = torch.randn(5, 2 * 640, generator=gen).to("cuda", torch.bfloat16)
    gate, up = merged.split(640, dim=-1)
    got = ops.silu_mul(gate, up)
    want = ops.silu_mul(gate.cpu().float(), up.cpu().float())  # pure torch in float32
    assert float((got.cpu().float() - want).abs().max() / want.abs().max()) < 1e-2
    # float32 CUDA tensors stay on the torch path (bit-identical to F.silu * up)
    g32, u32 = gate.float(), up.float()
    assert torch.equal(ops.silu_mul(g32, u32), F.silu(g32) * u32)
