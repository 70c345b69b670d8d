"""On a CUDA GPU (or Triton's CPU interpreter in float32): the small-batch GEMV kernels of
triton_gemv against float64 references and against the unfused ops they replace
(ops.add_rms_norm + F.linear, F.silu(gate) * up + F.linear), at 1..8 rows, with and without bias and
residual, into strided output views, in float32 for the LM head, and their errors on bad input.

In the interpreter the K loops take their bounds from 1-element numpy arrays, which numpy >= 2.4
refuses to convert: run it with an older numpy first on the path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import DEVICE, INTERPRET, TRITON_TEST_MARKS
from llmdeploy_engine.kernels import ops

pytestmark = TRITON_TEST_MARKS
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float16]
ROWS = [1, 2, 5, 8]
# (dtype, rows): every row count in the interpreter's float32 or in bf16, float16 at two (on the GPU
# each distinct dtype / row padding is one more compilation)
CASES = [(DTYPES[0], rows) for rows in ROWS] + [(dtype, rows) for dtype in DTYPES[1:] for rows in (1, 5)]
# (N, K): the interpreter's small shapes (K not a multiple of the tile, N not of BLOCK_N), or the
# decode GEMMs of Qwen2.5-0.5B (qkv, o_proj, gate_up) and Llama-3.1-8B (qkv, o_proj); a bias where
# N % 3 == 0 (Qwen's qkv: 1152)
LINEAR_SHAPES = (
    [(40, 96), (24, 200)] if INTERPRET else [(1152, 896), (896, 896), (9728, 896), (6144, 4096), (4096, 4096)]
)
# (N, I) of down_proj
DOWN_SHAPES = [(24, 72), (40, 128)] if INTERPRET else [(896, 4864), (4096, 14336)]
EPS = 1e-6


def tol(dtype: torch.dtype) -> float:
    """Relative to the largest output: a few roundings of the 16-bit dtype (float32: accumulation)."""
    return 1e-5 if dtype == torch.float32 else 4 * float(torch.finfo(dtype).eps)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double().cpu()
    return float((got.double().cpu() - ref).abs().max() / ref.abs().max())


def rand(*shape: int, gen: torch.Generator, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)


@pytest.mark.parametrize(("dtype", "rows"), CASES)
@pytest.mark.parametrize("shape", LINEAR_SHAPES)
def test_linear(dtype: torch.dtype, rows: int, shape: tuple[int, int]) -> None:
    from llmdeploy_engine.kernels import triton_gemv

    n, k = shape
    gen = torch.Generator().manual_seed(n * 31 + k + rows)
    x = rand(rows, k, gen=gen, dtype=dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    bias = rand(n, gen=gen, dtype=dtype) if n % 3 == 0 else None
    got = triton_gemv.linear(x, w, bias)
    assert got.shape == (rows, n) and got.dtype == dtype
    ref = x.double() @ w.double().T + (bias.double() if bias is not None else 0.0)
    assert rel_err(got, ref) < tol(dtype)
    assert rel_err(got, F.linear(x, w, bias)) < tol(dtype)


@pytest.mark.parametrize("rows", [1, 5])
def test_linear_float32_logits(rows: int) -> None:
    """The LM head: 16-bit weights, float32 logits accumulated and written without a 16-bit round."""
    from llmdeploy_engine.kernels import triton_gemv

    dtype = DTYPES[0]
    n, k = (100, 64) if INTERPRET else (151936, 896)
    gen = torch.Generator().manual_seed(rows)
    x = rand(rows, k, gen=gen, dtype=dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    got = triton_gemv.linear(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert rel_err(got, x.double() @ w.double().T) < 1e-5

    # the final norm fused in: the normed rows as ops.add_rms_norm rounds them, float32 logits
    residual = rand(rows, k, gen=gen, dtype=dtype)
    norm_w = (1.0 + 0.2 * torch.randn(k, generator=gen)).to(DEVICE, dtype)
    got, summed = triton_gemv.add_rms_norm_linear(x, residual, norm_w, EPS, w, out_dtype=torch.float32)
    normed, want_summed = ops.add_rms_norm(x, residual, norm_w, EPS)
    assert got.dtype == torch.float32 and torch.equal(summed, want_summed)
    # a variance summed in another order may round a normed element the other way: 16-bit tolerance
    assert rel_err(got, normed.double() @ w.double().T) < tol(dtype)


@pytest.mark.parametrize("rows", [1, 8])
def test_linear_into_a_strided_view(rows: int) -> None:
    from llmdeploy_engine.kernels import triton_gemv

    dtype = DTYPES[0]
    n, k = (48, 64) if INTERPRET else (4096, 4096)
    gen = torch.Generator().manual_seed(7)
    x = rand(rows, k, gen=gen, dtype=dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    buf = torch.full((rows, n + 24), 5.0, dtype=dtype, device=DEVICE)
    view = buf[:, 8 : 8 + n]  # row stride n + 24: a slice of a larger all-reduce buffer
    got = triton_gemv.linear(x, w, out=view)
    assert got.data_ptr() == view.data_ptr()
    assert rel_err(view, x.double() @ w.double().T) < tol(dtype)
    assert bool((buf[:, :8] == 5.0).all()) and bool((buf[:, 8 + n :] == 5.0).all())


@pytest.mark.parametrize(("dtype", "rows"), CASES)
@pytest.mark.parametrize("shape", LINEAR_SHAPES)
def test_add_rms_norm_linear(dtype: torch.dtype, rows: int, shape: tuple[int, int]) -> None:
    from llmdeploy_engine.kernels import triton_gemv

    with_residual = rows != 2  # the first layer's norm has no residual yet

    n, k = shape
    gen = torch.Generator().manual_seed(n + 17 * k + rows)
    h = rand(rows, k, gen=gen, dtype=dtype, scale=3.0)
    residual = rand(rows, k, gen=gen, dtype=dtype, scale=3.0) if with_residual else None
    norm_w = (1.0 + 0.2 * torch.randn(k, generator=gen)).to(DEVICE, dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    bias = rand(n, gen=gen, dtype=dtype) if n % 3 == 0 else None  # Qwen's qkv (1152) has a bias
    got, summed = triton_gemv.add_rms_norm_linear(h, residual, norm_w, EPS, w, bias)
    assert got.shape == (rows, n) and got.dtype == dtype

    normed, want_summed = ops.add_rms_norm(h, residual, norm_w, EPS)
    if residual is None:
        assert summed is h
    else:
        assert torch.equal(summed, want_summed)  # the same float32 add and one rounding
    assert rel_err(got, F.linear(normed, w, bias)) < tol(dtype)

    s64 = (h.double() + residual.double()).to(dtype).double() if residual is not None else h.double()
    n64 = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + EPS) * norm_w.double()
    ref = n64 @ w.double().T + (bias.double() if bias is not None else 0.0)
    assert rel_err(got, ref) < tol(dtype)


@pytest.mark.parametrize(("dtype", "rows"), CASES)
@pytest.mark.parametrize("shape", DOWN_SHAPES)
def test_silu_mul_linear(dtype: torch.dtype, rows: int, shape: tuple[int, int]) -> None:
    from llmdeploy_engine.kernels import triton_gemv

    n, inter = shape
    gen = torch.Generator().manual_seed(n + inter + rows)
    merged = rand(rows, 2 * inter + 16, gen=gen, dtype=dtype, scale=2.0)
    gate_up = merged[:, : 2 * inter]  # a view with row stride 2I + 16
    w = rand(n, inter, gen=gen, dtype=dtype, scale=inter**-0.5)
    got = triton_gemv.silu_mul_linear(gate_up, w)
    assert got.shape == (rows, n) and got.dtype == dtype

    gate, up = gate_up.split(inter, dim=-1)
    assert rel_err(got, F.linear(F.silu(gate) * up, w)) < tol(dtype)
    g64, u64 = gate.double(), up.double()
    assert rel_err(got, (g64 * torch.sigmoid(g64) * u64) @ w.double().T) < tol(dtype)

    # the row-parallel down_proj writes into the all-reduce buffer
    buf = torch.zeros(rows, n + 8, dtype=dtype, device=DEVICE)
    triton_gemv.silu_mul_linear(gate_up, w, out=buf[:, 8:])
    assert torch.equal(buf[:, 8:], got) and bool((buf[:, :8] == 0).all())


@pytest.mark.parametrize(
    "config",
    [
        {"mode": "reduce", "block_n": 8, "block_k": 64},
        {"mode": "defer", "block_n": 4, "block_k": 32, "num_warps": 2},
        {"mode": "dot", "block_n": 16, "block_k": 64, "num_stages": 3},
        {"mode": "defer", "block_n": 32, "block_k": 128, "num_warps": 8},
        {"mode": "defer", "block_n": 8, "block_k": 64, "prefetch": False},
        {"mode": "reduce", "block_n": 16, "block_k": 256, "prefetch": False},
        {"mode": "dot", "block_n": 32, "block_k": 32, "prefetch": False},
    ],
)
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("k", [200, 256] if INTERPRET else [256])
def test_config_overrides(config: dict[str, int | str | bool], rows: int, k: int) -> None:
    """Every mode and tile the sweep may pick computes the same products, with a partial last tile
    (K = 200) or whole tiles (K = 256: the prefetch past the end is masked off)."""
    from llmdeploy_engine.kernels import triton_gemv

    dtype = DTYPES[0]
    n = 40
    gen = torch.Generator().manual_seed(rows + k)
    x = rand(rows, k, gen=gen, dtype=dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    ref = x.double() @ w.double().T
    assert rel_err(triton_gemv.linear(x, w, **config), ref) < tol(dtype)
    norm_w = torch.ones(k, dtype=dtype, device=DEVICE)
    got, _ = triton_gemv.add_rms_norm_linear(x, x, norm_w, EPS, w, **config)
    normed, _ = ops.add_rms_norm(x, x, norm_w, EPS)
    assert rel_err(got, F.linear(normed, w)) < tol(dtype)
    gate_up = rand(rows, 2 * k, gen=gen, dtype=dtype)
    got = triton_gemv.silu_mul_linear(gate_up, w, **config)
    gate, up = gate_up.split(k, dim=-1)
    assert rel_err(got, F.linear(F.silu(gate) * up, w)) < tol(dtype)


def test_default_configs_fill_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heuristic for shapes the measured table does not hold."""
    from llmdeploy_engine.kernels import triton_gemv

    monkeypatch.setattr(triton_gemv, "TUNED", {})
    for n, k in [
        (1152, 896),
        (896, 896),
        (9728, 896),
        (896, 4864),
        (151936, 896),
        (6144, 4096),
        (4096, 14336),
    ]:
        for rows in (1, 4, 8):
            cfg = triton_gemv.default_config(rows, n, k, num_sms=132)
            assert cfg.mode in ("reduce", "defer", "dot")
            assert -(-n // cfg.block_n) >= 132 or cfg.block_n == 2, (n, k, rows, cfg)
            assert cfg.block_n * cfg.block_k <= 8192
            assert cfg.mode == ("defer" if rows == 1 else "reduce")  # the row path


def test_measured_configs_are_used_at_one_row() -> None:
    from llmdeploy_engine.kernels import triton_gemv

    for (n, k, bucket), cfg in triton_gemv.TUNED.items():
        assert triton_gemv.default_config(bucket, n, k, num_sms=132) == cfg


def test_supported() -> None:
    from llmdeploy_engine.kernels import triton_gemv

    w = torch.zeros(64, 128, dtype=torch.bfloat16, device=DEVICE)
    x = torch.zeros(4, 128, dtype=torch.bfloat16, device=DEVICE)
    assert triton_gemv.supported(x, w) == (DEVICE == "cuda")
    assert not triton_gemv.supported(torch.zeros(9, 128, dtype=torch.bfloat16, device=DEVICE), w)
    assert not triton_gemv.supported(x.float(), w.float())
    assert not triton_gemv.supported(x, w.t().contiguous().t())  # not the nn.Linear layout
    assert not triton_gemv.supported(x[:, :124], w[:, :124].contiguous())  # K % 8 != 0
    assert not triton_gemv.supported(x.cpu(), w.cpu())


def test_bad_input() -> None:
    from llmdeploy_engine.kernels import triton_gemv

    dtype = DTYPES[0]
    x = torch.zeros(2, 64, dtype=dtype, device=DEVICE)
    w = torch.zeros(32, 64, dtype=dtype, device=DEVICE)
    cases = [
        (lambda: triton_gemv.linear(torch.zeros(9, 64, dtype=dtype, device=DEVICE), w), "rows"),
        (lambda: triton_gemv.linear(x, w.to(torch.float64)), "dtype"),
        (lambda: triton_gemv.linear(x.to(torch.int32), w.to(torch.int32)), "dtype"),
        (lambda: triton_gemv.linear(x, torch.zeros(32, 48, dtype=dtype, device=DEVICE)), "disagree on K"),
        (lambda: triton_gemv.linear(x[0], w), r"\[M, K\]"),
        (lambda: triton_gemv.linear(x, w.t().contiguous().t()), "contiguous"),
        (lambda: triton_gemv.linear(x, w, bias=torch.zeros(31, dtype=dtype, device=DEVICE)), "bias"),
        (lambda: triton_gemv.linear(x, w, out=torch.zeros(2, 31, dtype=dtype, device=DEVICE)), "out"),
        (lambda: triton_gemv.linear(x, w, out=torch.zeros(32, 2, dtype=dtype, device=DEVICE).t()), "columns"),
        (lambda: triton_gemv.linear(x, w, out_dtype=torch.int8), "out_dtype"),
        (lambda: triton_gemv.linear(x, w, mode="split-k"), "mode"),
        (lambda: triton_gemv.linear(x, w, block_n=12), "power of two"),
        (lambda: triton_gemv.linear(x, w, mode="dot", block_n=8), "dot"),
        (
            lambda: triton_gemv.add_rms_norm_linear(
                x, x[:1], torch.ones(64, dtype=dtype, device=DEVICE), EPS, w
            ),
            "residual",
        ),
        (
            lambda: triton_gemv.add_rms_norm_linear(
                x, None, torch.ones(63, dtype=dtype, device=DEVICE), EPS, w
            ),
            "norm_weight",
        ),
        (lambda: triton_gemv.silu_mul_linear(torch.zeros(2, 100, dtype=dtype, device=DEVICE), w), "2 x"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
