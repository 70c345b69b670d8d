"""On a CUDA GPU (or Triton's CPU interpreter in float32): the skinny GEMM kernels of triton_skinny
(9..64 rows) against float64 references and against the unfused ops they replace
(ops.add_rms_norm + F.linear, ops.silu_mul + F.linear), with and without bias and residual, into
strided output views, in float32 for the LM head, under several launch configurations, and their
errors on bad input."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

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
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float16]
ROWS = [9, 16, 32, 33, 64]
# (dtype, rows): every row count in the first dtype, the second (float16 on the GPU) at two
CASES = [(DTYPES[0], rows) for rows in ROWS] + [(dtype, rows) for dtype in DTYPES[1:] for rows in (16, 33)]
# (N, K): the interpreter's small shapes (N not a multiple of BLOCK_N, K not of BLOCK_K), or the
# projections of Qwen2.5-0.5B and Llama-3.1-8B: qkv and o_proj for the plain product, qkv and
# gate_up for the norm's; a bias where N % 3 == 0 (Qwen's qkv: 1152, and 6144)
LINEAR_SHAPES = [(40, 96), (24, 200)] if INTERPRET else [(1152, 896), (896, 896), (6144, 4096), (4096, 4096)]
NORM_SHAPES = [(40, 96), (24, 200)] if INTERPRET else [(1152, 896), (9728, 896), (6144, 4096), (28672, 4096)]
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


def rms_norm64(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x64 = x.double().cpu()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * weight.double().cpu()


@pytest.mark.parametrize(("dtype", "rows"), CASES)
@pytest.mark.parametrize("shape", LINEAR_SHAPES)
def test_linear(dtype: torch.dtype, rows: int, shape: tuple[int, int]) -> None:
    from llmdeploy_engine import triton_skinny

    n, k = shape
    gen = torch.Generator().manual_seed(n * 31 + k + rows)
    x = rand(rows, k, gen=gen, dtype=dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    bias = rand(n, gen=gen, dtype=dtype) if n % 3 == 0 else None
    got = triton_skinny.linear(x, w, bias)
    assert got.shape == (rows, n) and got.dtype == dtype
    ref = F.linear(x.double().cpu(), w.double().cpu(), None if bias is None else bias.double().cpu())
    assert rel_err(got, ref) < tol(dtype)
    assert rel_err(got, F.linear(x, w, bias)) < tol(dtype)  # cuBLAS in the same dtype


@pytest.mark.parametrize("rows", [9, 32, 64])
def test_linear_float32_logits(rows: int) -> None:
    """The LM head: 16-bit hidden states and weights, float32 logits."""
    from llmdeploy_engine import triton_skinny

    dtype = DTYPES[0]
    n, k = (48, 64) if INTERPRET else (32000, 4096)
    gen = torch.Generator().manual_seed(rows)
    x = rand(rows, k, gen=gen, dtype=dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    got = triton_skinny.linear(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    ref = F.linear(x.double().cpu(), w.double().cpu())
    # float32 output: only the accumulation order separates it from float64
    assert rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("rows", [9, 33])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_linear_into_a_strided_view(rows: int, out_dtype: torch.dtype | None, swap_ab: bool) -> None:
    """`out` a [rows, N] view of a wider buffer (the tensor-parallel all-reduce buffer's rows)."""
    from llmdeploy_engine import triton_skinny

    dtype = DTYPES[0]
    n, k = (40, 96) if INTERPRET else (4096, 4096)
    gen = torch.Generator().manual_seed(7 + rows)
    x = rand(rows, k, gen=gen, dtype=dtype)
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    bias = rand(n, gen=gen, dtype=dtype)
    buf = torch.full((rows, n + 24), 7.0, dtype=out_dtype or dtype, device=DEVICE)
    view = buf[:, 8 : 8 + n]
    got = triton_skinny.linear(x, w, bias, out=view, out_dtype=out_dtype, swap_ab=swap_ab)
    assert got.data_ptr() == view.data_ptr()
    ref = F.linear(x.double().cpu(), w.double().cpu(), bias.double().cpu())
    assert rel_err(view, ref) < (1e-5 if out_dtype == torch.float32 else tol(dtype))
    assert bool((buf[:, :8] == 7.0).all()) and bool((buf[:, 8 + n :] == 7.0).all())


@pytest.mark.parametrize(("dtype", "rows"), CASES)
@pytest.mark.parametrize("shape", NORM_SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_linear(
    dtype: torch.dtype, rows: int, shape: tuple[int, int], with_residual: bool
) -> None:
    from llmdeploy_engine import triton_skinny

    n, k = shape
    gen = torch.Generator().manual_seed(n + 3 * k + rows)
    h = rand(rows, k, gen=gen, dtype=dtype, scale=3.0)
    residual = rand(rows, k, gen=gen, dtype=dtype, scale=2.0) if with_residual else None
    norm_w = rand(k, gen=gen, dtype=dtype).abs() + 0.5
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    bias = rand(n, gen=gen, dtype=dtype) if n % 3 == 0 else None  # Qwen's qkv (1152) has one
    got, summed = triton_skinny.add_rms_norm_linear(h, residual, norm_w, EPS, w, bias)
    assert got.shape == (rows, n) and got.dtype == dtype
    if residual is None:
        assert summed is h
        s64 = h.double().cpu()
    else:
        assert torch.equal(summed, h + residual)  # torch's add rounds once, as the kernel does
        s64 = h.double().cpu() + residual.double().cpu()
    ref = F.linear(rms_norm64(s64, norm_w), w.double().cpu(), None if bias is None else bias.double().cpu())
    assert rel_err(got, ref) < tol(dtype)
    normed, summed_ops = ops.add_rms_norm(h, residual, norm_w, EPS)  # the unfused path
    assert torch.equal(summed, summed_ops)
    assert rel_err(got, F.linear(normed, w, bias)) < tol(dtype)


@pytest.mark.parametrize(("dtype", "rows"), [(dtype, rows) for dtype in DTYPES for rows in (9, 32, 64)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_add_rms_norm_linear_rstd_epilogue(
    dtype: torch.dtype, rows: int, with_residual: bool, swap_ab: bool
) -> None:
    """The one-pass variant: 1/rms applied to the float32 sums, one rounding of x * weight fewer."""
    from llmdeploy_engine import triton_skinny

    n, k = NORM_SHAPES[1] if INTERPRET else (6144, 4096)
    gen = torch.Generator().manual_seed(5 * n + k + rows)
    h = rand(rows, k, gen=gen, dtype=dtype, scale=3.0)
    residual = rand(rows, k, gen=gen, dtype=dtype, scale=2.0) if with_residual else None
    norm_w = rand(k, gen=gen, dtype=dtype).abs() + 0.5
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    bias = rand(n, gen=gen, dtype=dtype)
    got, summed = triton_skinny.add_rms_norm_linear(
        h,
        residual,
        norm_w,
        EPS,
        w,
        bias,
        rstd_epilogue=True,
        swap_ab=swap_ab,
        block_k=32 if INTERPRET else 128,
    )
    s64 = h.double().cpu() if residual is None else h.double().cpu() + residual.double().cpu()
    assert summed is h if residual is None else torch.equal(summed, h + residual)
    ref = F.linear(rms_norm64(s64, norm_w), w.double().cpu(), bias.double().cpu())
    assert rel_err(got, ref) < tol(dtype)
    normed, _ = ops.add_rms_norm(h, residual, norm_w, EPS)
    assert rel_err(got, F.linear(normed, w, bias)) < tol(dtype)


@pytest.mark.parametrize(("dtype", "rows"), CASES)
@pytest.mark.parametrize("shape", DOWN_SHAPES)
def test_silu_mul_linear(dtype: torch.dtype, rows: int, shape: tuple[int, int]) -> None:
    from llmdeploy_engine import triton_skinny

    n, inter = shape
    gen = torch.Generator().manual_seed(n + inter + rows)
    # the merged gate_up output as a strided view (a wider buffer's columns), as in the MLP
    buf = rand(rows, 2 * inter + 16, gen=gen, dtype=dtype, scale=2.0)
    gate_up = buf[:, 8 : 8 + 2 * inter]
    w = rand(n, inter, gen=gen, dtype=dtype, scale=inter**-0.5)
    got = triton_skinny.silu_mul_linear(gate_up, w)
    assert got.shape == (rows, n) and got.dtype == dtype
    g64, u64 = gate_up.double().cpu().split(inter, dim=-1)
    ref = F.linear(F.silu(g64) * u64, w.double().cpu())
    assert rel_err(got, ref) < tol(dtype)
    gate, up = gate_up.split(inter, dim=-1)
    assert rel_err(got, F.linear(ops.silu_mul(gate, up), w)) < tol(dtype)  # the unfused path
    # into the rows of a wider buffer (the row-parallel down_proj's all-reduce buffer)
    out_buf = torch.zeros((rows, n + 8), dtype=dtype, device=DEVICE)
    triton_skinny.silu_mul_linear(gate_up, w, out=out_buf[:, :n])
    assert torch.equal(out_buf[:, :n], got) and bool((out_buf[:, n:] == 0).all())


# (config, rows, K): both dot orientations, masked K tails, narrow and wide column blocks, stages
CONFIGS = [
    ({"block_n": 16, "block_k": 32, "swap_ab": False}, 9, 200),
    ({"block_n": 16, "block_k": 32, "swap_ab": True}, 33, 200),
    ({"block_n": 32, "block_k": 64, "swap_ab": True, "num_stages": 2}, 64, 96),
    ({"block_n": 64, "block_k": 128, "num_warps": 8, "num_stages": 4}, 16, 200),
    ({"block_n": 64, "block_k": 16, "swap_ab": True, "num_warps": 4}, 32, 96),
]


@pytest.mark.parametrize(("config", "rows", "k"), CONFIGS)
def test_config_overrides(config: dict[str, Any], rows: int, k: int) -> None:
    from llmdeploy_engine import triton_skinny

    dtype = DTYPES[0]
    n = 40 if INTERPRET else 4096
    k = k if INTERPRET else k * 16 + 8  # a tail that is not a multiple of any BLOCK_K
    gen = torch.Generator().manual_seed(rows + k)
    x = rand(rows, k, gen=gen, dtype=dtype, scale=3.0)
    res = rand(rows, k, gen=gen, dtype=dtype)
    norm_w = rand(k, gen=gen, dtype=dtype).abs() + 0.5
    w = rand(n, k, gen=gen, dtype=dtype, scale=k**-0.5)
    bias = rand(n, gen=gen, dtype=dtype)
    x64, w64, b64 = x.double().cpu(), w.double().cpu(), bias.double().cpu()
    got = triton_skinny.linear(x, w, bias, **config)
    assert rel_err(got, F.linear(x64, w64, b64)) < tol(dtype)
    got, summed = triton_skinny.add_rms_norm_linear(x, res, norm_w, EPS, w, bias, **config)
    assert torch.equal(summed, x + res)
    ref = F.linear(rms_norm64(x64 + res.double().cpu(), norm_w), w64, b64)
    assert rel_err(got, ref) < tol(dtype)
    inter = k // 2 - (k // 2) % 8
    gate_up = torch.cat([x[:, :inter], res[:, :inter]], dim=1)
    w2 = w[:, :inter].contiguous()
    got = triton_skinny.silu_mul_linear(gate_up, w2, **config)
    g64, u64 = gate_up.double().cpu().split(inter, dim=-1)
    assert rel_err(got, F.linear(F.silu(g64) * u64, w2.double().cpu())) < tol(dtype)
    out_buf = torch.zeros((rows, n + 8), dtype=dtype, device=DEVICE)
    triton_skinny.silu_mul_linear(gate_up, w2, out=out_buf[:, 8:], **config)
    assert torch.equal(out_buf[:, 8:], got) and bool((out_buf[:, :8] == 0).all())


def test_default_configs_fill_the_gpu() -> None:
    from llmdeploy_engine import triton_skinny

    shapes = [(1152, 896), (896, 896), (9728, 896), (896, 4864)]
    shapes += [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
    for n, k in shapes:
        for rows in (9, 16, 32, 33, 64):
            for act_tiles in (1, 2):
                cfg = triton_skinny.default_config(rows, n, k, num_sms=132, act_tiles=act_tiles)
                programs = -(-n // cfg.block_n)
                # no split-K: the column blocks alone must occupy the SMs, unless BLOCK_N is at its floor
                assert programs >= 0.9 * 132 or cfg.block_n == 16, (n, k, rows, cfg)
                assert k % cfg.block_k == 0, (n, k, rows, cfg)  # the unmasked loop
                block_m = triton_skinny.block_m_for(rows)
                assert block_m in (16, 32, 64) and block_m >= rows
                smem = triton_skinny.pipeline_bytes(block_m, cfg, act_tiles)
                assert cfg.num_stages >= 2 and smem <= triton_skinny.SMEM_BUDGET_BYTES, (n, k, rows, cfg)


def test_supported() -> None:
    from llmdeploy_engine import triton_skinny

    w = torch.zeros(64, 128, device=DEVICE, dtype=DTYPES[-1])
    x = torch.zeros(32, 128, device=DEVICE, dtype=DTYPES[-1])
    on_gpu = DEVICE == "cuda"
    assert triton_skinny.supported(x, w) is on_gpu  # CUDA 16-bit only
    assert not triton_skinny.supported(x.float(), w.float())
    assert not triton_skinny.supported(x.cpu(), w.cpu())
    if on_gpu:
        assert triton_skinny.supported(x[:9], w) and triton_skinny.supported(torch.cat([x, x]), w)
        assert not triton_skinny.supported(x[:8], w)  # triton_gemv's rows
        assert not triton_skinny.supported(torch.cat([x, x, x[:1]]), w)  # 65 rows
        assert not triton_skinny.supported(x[:, :120], w[:, :120])  # w not contiguous
        assert not triton_skinny.supported(x[:, :4].contiguous(), w[:, :4].contiguous())  # K % 8
        assert not triton_skinny.supported(x, w.half() if w.dtype == torch.bfloat16 else w.bfloat16())


def test_bad_input() -> None:
    from llmdeploy_engine import triton_skinny

    dtype = DTYPES[0]
    x = torch.zeros(16, 64, device=DEVICE, dtype=dtype)
    w = torch.zeros(32, 64, device=DEVICE, dtype=dtype)
    nw = torch.ones(64, device=DEVICE, dtype=dtype)
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: triton_skinny.linear(x.to(torch.int32), w), "dtype"),
        (lambda: triton_skinny.linear(x, w.double()), "dtype"),
        (lambda: triton_skinny.linear(x, torch.zeros(32, 48, device=DEVICE, dtype=dtype)), "disagree on K"),
        (lambda: triton_skinny.linear(torch.zeros(65, 64, device=DEVICE, dtype=dtype), w), "65 rows"),
        (lambda: triton_skinny.linear(x[:0], w), "0 rows"),
        (lambda: triton_skinny.linear(x[0], w), r"\[M, K\]"),
        (lambda: triton_skinny.linear(x, w.t().contiguous().t()), "contiguous"),
        (lambda: triton_skinny.linear(x, w, torch.zeros(31, device=DEVICE)), "bias"),
        (lambda: triton_skinny.linear(x, w, out=torch.empty(16, 31, device=DEVICE, dtype=dtype)), "out"),
        (
            lambda: triton_skinny.linear(x, w, out=torch.empty(32, 16, device=DEVICE, dtype=dtype).t()),
            "columns must be contiguous",
        ),
        (lambda: triton_skinny.linear(x, w, out_dtype=torch.int8), "out_dtype"),
        (lambda: triton_skinny.linear(x, w, block_n=24), "power of two"),
        (lambda: triton_skinny.linear(x, w, block_k=8), "power of two"),
        (
            lambda: triton_skinny.add_rms_norm_linear(
                x, torch.zeros(16, 32, device=DEVICE, dtype=dtype), nw, EPS, w
            ),
            "residual",
        ),
        (lambda: triton_skinny.add_rms_norm_linear(x, None, nw[:32], EPS, w), "norm_weight"),
        (lambda: triton_skinny.silu_mul_linear(x, w), "2 x w's K"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
