"""tinygemm's int4 layout (int4_tinygemm.py) in plain torch: the packing and its inverse, and the
(q - 8) * scale + zero dequantization of AWQ / GPTQ weights (zero = (8 - z) * scale) against the
float64 dequantized reference, with plain and act-order group orders."""

from __future__ import annotations

import pytest
import torch
from llmdeploy_engine.kernels import int4_tinygemm as tg
from llmdeploy_engine.kernels.int4_formats import dequantize_int4, quantize_int4


@pytest.mark.parametrize(("n", "k", "tiles"), [(16, 128, 8), (24, 64, 4), (8, 32, 2), (40, 256, 8)])
def test_pack_and_unpack_are_inverse(n: int, k: int, tiles: int) -> None:
    gen = torch.Generator().manual_seed(n * k)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    packed = tg.reference_pack(codes, tiles)
    assert packed.shape == (n // 8, k // (tiles * 16), 32, tiles // 2) and packed.dtype == torch.int32
    assert torch.equal(tg.unpack_codes(packed, n, k), codes)


def test_pack_bytes_puts_even_codes_high() -> None:
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert tg.pack_bytes(codes).tolist() == [[0x12, 0xF0]]


def test_layout_fact_one_word() -> None:
    """The word of lane 0, tiles 2: bytes 0, 4, 8, 12 of row 0; even codes in bits 0-15."""
    codes = torch.zeros(8, 32, dtype=torch.uint8)
    codes[0, 0], codes[0, 1] = 3, 5  # byte 0: high nibble 3 (bits 0-3), low nibble 5 (bits 16-19)
    codes[0, 8] = 7  # byte 4, high nibble: bits 4-7
    word = int(tg.reference_pack(codes, 2)[0, 0, 0, 0])
    assert word == 3 | (7 << 4) | (5 << 16)


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("sym", [False, True])
def test_dequantize_matches_float64_reference(group: int, act_order: bool, sym: bool) -> None:
    n, k = 32, 512
    gen = torch.Generator().manual_seed(group + 2 * act_order + sym)
    w = torch.randn(n, k, generator=gen)
    g_idx = torch.arange(k) // group
    if act_order:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    codes, scales, zeros = quantize_int4(w, group, sym=sym, g_idx=g_idx)
    scales = scales.to(torch.bfloat16)  # the checkpoint's dtype
    ref = dequantize_int4(codes, scales.double(), zeros, g_idx).double()
    # the engine stores the input features sorted by group (Int4Weight.write_rows) before packing
    perm = torch.argsort(g_idx, stable=True)
    packed = tg.reference_pack(codes[:, perm], tg.inner_k_tiles(k) or 0)
    got = tg.dequantize(packed, tg.scale_and_zero(scales, zeros), group, k, torch.float64)
    ref = ref[:, perm]
    # (8 - z) * s rounds to bfloat16: off by at most 2^-9 of |8 - z| * s <= 8 s, a 64th of a step
    step = scales.double().repeat_interleave(group, dim=1)
    assert float(((got - ref).abs() / step).max()) <= 8 * 2**-9 + 1e-6
    assert float((got - ref).norm() / ref.norm()) < 4e-3


def test_supported_shapes() -> None:
    assert tg.supported(4096, 14336, 128, torch.bfloat16)
    assert not tg.supported(4096, 4096, 128, torch.float16)  # tinygemm takes bfloat16 activations
    assert not tg.supported(4096, 4096, 100, torch.bfloat16)
    assert not tg.supported(4100, 4096, 128, torch.bfloat16)
    assert tg.inner_k_tiles(96) == 2 and tg.inner_k_tiles(80) is None
