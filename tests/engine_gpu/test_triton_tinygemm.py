"""On a CUDA GPU (or Triton's CPU interpreter): triton_tinygemm's dequantize-in-registers GEMM and its
dequantization over tinygemm's int4 layout, against int4_tinygemm's plain-torch dequantization in
float64, on random shapes, group sizes and k-tile counts (the layout built by int4_tinygemm's
reference packing, which the GPU test of test_int4_tinygemm_gpu.py holds equal to torch's)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRET, TRITON_TEST_MARKS
from llmdeploy_engine.kernels import int4_tinygemm as tg

pytestmark = TRITON_TEST_MARKS
# (N, K, group, k tiles): small in the interpreter
SHAPES = (
    [(16, 128, 128, 8), (24, 64, 32, 4), (8, 64, 32, 2), (40, 256, 64, 8)]
    if INTERPRET
    else [(6144, 4096, 128, 8), (4096, 14336, 128, 8), (1000, 384, 32, 2), (512, 512, 64, 4)]
)
DTYPE = torch.float32 if INTERPRET else torch.bfloat16


def _weight(n: int, k: int, group: int, tiles: int, seed: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3).to(torch.bfloat16)
    zeros = torch.randint(0, 16, (n, k // group), dtype=torch.uint8, generator=gen)
    packed = tg.reference_pack(codes, tiles)
    sz = tg.scale_and_zero(scales, zeros)
    return packed, sz, tg.dequantize(packed, sz, group, k, torch.float64)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [3, 17, 70] if INTERPRET else [33, 64, 130, 256, 1000])
def test_gemm_matches_float64(shape: tuple[int, int, int, int], rows: int) -> None:
    from llmdeploy_engine.kernels import triton_tinygemm

    n, k, group, tiles = shape
    packed, sz, ref_w = _weight(n, k, group, tiles, n + k + rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(DTYPE)
    y = torch.full((rows, n), float("nan"), dtype=DTYPE, device=DEVICE)
    got = triton_tinygemm.gemm(x.to(DEVICE), packed.to(DEVICE), sz.to(DEVICE), group, out=y)
    ref = x.double() @ ref_w.T
    err = float((got.double().cpu() - ref).norm() / ref.norm())
    assert err < (1e-5 if INTERPRET else 1e-2), err


@pytest.mark.parametrize("shape", SHAPES)
def test_dequantize_matches_plain_torch(shape: tuple[int, int, int, int]) -> None:
    from llmdeploy_engine.kernels import triton_tinygemm

    n, k, group, tiles = shape
    packed, sz, ref_w = _weight(n, k, group, tiles, n * k)
    got = triton_tinygemm.dequantize(packed.to(DEVICE), sz.to(DEVICE), group, k)
    # the same float32 arithmetic rounded to bfloat16, within one rounding step (fused or not)
    want = tg.dequantize(packed, sz, group, k, torch.float32).to(torch.bfloat16)
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2**-7, atol=0)
    assert float((got.double().cpu() - ref_w).norm() / ref_w.norm()) < 4e-3
