"""On a CUDA GPU: the fused Triton RMSNorm (+ residual add) and RoPE kernels against ops.py's torch
versions (within bf16/fp16 rounding) and a float64 reference, over several shapes; and ops.py's
dispatch (16-bit CUDA tensors go to the kernels, others stay pure torch)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRET, TRITON_TEST_MARKS
from llmdeploy_engine.kernels import ops

pytestmark = TRITON_TEST_MARKS
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float16, torch.float32]


def ulp(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (37, 896), (5, 8, 128), (3, 100)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm(dtype: torch.dtype, shape: tuple[int, ...], with_residual: bool) -> None:
    from llmdeploy_engine.kernels import triton_ops

    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=gen) * 3).to(DEVICE, dtype)
    res = torch.randn(shape, generator=gen).to(DEVICE, dtype) if with_residual else None
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype)
    eps = 1e-6
    out, summed = triton_ops.add_rms_norm(x, res, w, eps)
    # ops.py's pure-torch version, on CPU copies (on CUDA ops.py would dispatch to the kernel)
    xc, wc = x.cpu(), w.cpu()
    want_sum = xc if res is None else xc + res.cpu()
    want_out = ops.rms_norm(want_sum, wc, eps)
    # float64 reference of the contract: normalise the (dtype-rounded) sum
    s64 = want_sum.double()
    ref = w.cpu().double() * s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + eps)
    assert summed.dtype == dtype and out.dtype == dtype and out.shape == x.shape
    assert torch.equal(summed.cpu(), want_sum)  # the add rounds once either way
    tol = 4 * ulp(dtype) if dtype != torch.float32 else 1e-5
    assert float((out.cpu().double() - ref).abs().max() / ref.abs().max()) < tol
    assert float((out.cpu().double() - want_out.double()).abs().max() / ref.abs().max()) < tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(14, 2, 64), (32, 8, 128), (16, 16, 32)])
def test_apply_rope(dtype: torch.dtype, heads: tuple[int, int, int]) -> None:
    from llmdeploy_engine.kernels import triton_ops

    num_heads, num_kv_heads, head_dim = heads
    n = 19
    gen = torch.Generator().manual_seed(num_heads)
    q = torch.randn(n, num_heads, head_dim, generator=gen)
    k = torch.randn(n, num_kv_heads, head_dim, generator=gen)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    pos = torch.randint(0, 5000, (n,), generator=gen).double()
    emb = torch.cat([pos[:, None] * inv_freq[None, :]] * 2, dim=-1)
    cos64, sin64 = emb.cos()[:, None, :], emb.sin()[:, None, :]
    cos, sin = cos64.to(DEVICE, dtype), sin64.to(DEVICE, dtype)
    # a non-contiguous q (a view of a fused projection) must work as well
    qkv = torch.cat([q.reshape(n, -1), k.reshape(n, -1)], dim=-1).to(DEVICE, dtype)
    qd = qkv[:, : num_heads * head_dim].view(n, num_heads, head_dim)
    kd = qkv[:, num_heads * head_dim :].view(n, num_kv_heads, head_dim)
    got_q, got_k = triton_ops.apply_rope(qd, kd, cos, sin)
    want_q, want_k = ops.apply_rope(qd.cpu(), kd.cpu(), cos.cpu(), sin.cpu())  # torch, same dtype

    def rot(x: torch.Tensor) -> torch.Tensor:
        x = x.cpu().double()
        c, s = cos.cpu().double(), sin.cpu().double()
        return x * c + ops.rotate_half(x) * s

    tol = 4 * ulp(dtype) if dtype != torch.float32 else 1e-5
    for got, want, x in ((got_q, want_q, qd), (got_k, want_k, kd)):
        ref = rot(x)
        assert got.dtype == dtype and got.shape == x.shape
        assert float((got.cpu().double() - ref).abs().max() / ref.abs().max()) < tol
        assert float((got.cpu().double() - want.double()).abs().max() / ref.abs().max()) < tol


@pytest.mark.skipif(DEVICE != "cuda", reason="the dispatch runs on CUDA tensors only")
def test_ops_dispatch_matches_torch_in_a_decoder_layer_pattern() -> None:
    """ops.* on bf16 CUDA tensors (Triton) against the same calls on float32 CPU copies (pure torch)."""
    gen = torch.Generator().manual_seed(0)
    n, hidden = 7, 1024
    h = torch.randn(n, hidden, generator=gen)
    res = torch.randn(n, hidden, generator=gen)
    w = 1 + 0.1 * torch.randn(hidden, generator=gen)
    cuda = [t.to("cuda", torch.bfloat16) for t in (h, res, w)]
    out, summed = ops.add_rms_norm(cuda[0], cuda[1], cuda[2], 1e-5)
    out_cpu, sum_cpu = ops.add_rms_norm(*(t.cpu().float() for t in cuda), 1e-5)
    assert float((out.cpu().float() - out_cpu).abs().max()) < 0.05
    assert float((summed.cpu().float() - sum_cpu).abs().max()) < 0.05
    assert torch.equal(
        ops.rms_norm(cuda[0], cuda[2], 1e-5), ops.add_rms_norm(cuda[0], None, cuda[2], 1e-5)[0]
    )


@pytest.mark.parametrize("rows", [1, 3, 100, 256])
@pytest.mark.parametrize("vocab", [1, 7, 1024, 5000, 151936])
def test_argmax_rows_matches_torch(rows: int, vocab: int) -> None:
    """The two-stage argmax (the greedy pick) against torch.argmax on CPU copies: random rows, rows
    whose maximum repeats (the first one wins, also across chunks), all -inf rows, a NaN (ranks
    highest), float32 and bf16; into an `out` row view as the window sampler passes it."""
    from llmdeploy_engine.kernels import triton_ops

    if INTERPRET and rows * vocab > 300_000:
        pytest.skip("large shapes only on the GPU (interpreter time)")
    gen = torch.Generator().manual_seed(rows * 7 + vocab)
    x = torch.randn(rows, vocab, generator=gen)
    if rows > 1:
        x[1] = 0.0
        x[1, vocab // 2 :] = 3.0  # equal maxima from the middle on: the first is at vocab // 2
    if rows > 2:
        x[2] = float("-inf")
    if rows > 3 and vocab > 1:
        x[3, vocab - 1] = float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        got = triton_ops.argmax_rows(xd.to(DEVICE))
        assert got.dtype == torch.long and got.shape == (rows,)
        assert torch.equal(got.cpu(), torch.argmax(xd, dim=-1)), dtype
    out = torch.full((2, rows), -1, dtype=torch.long, device=DEVICE)
    triton_ops.argmax_rows(x.to(DEVICE), out=out[1])
    assert torch.equal(out[1].cpu(), torch.argmax(x, dim=-1)) and bool((out[0] == -1).all())


def _compiled_variants(fn: object) -> int:
    caches = getattr(fn, "device_caches", {})
    return sum(len(c[0]) for c in caches.values() if isinstance(c, tuple) and isinstance(c[0], dict))


@pytest.mark.skipif(INTERPRET, reason="compiled variants exist on the GPU only")
def test_argmax_rows_one_variant_for_every_row_count() -> None:
    """Every row count (128 down to 16 chunks a row) and an `out` row at any offset of a window's
    [steps, rows] tensor (8-byte aligned for odd row counts) reuse the first call's compiled kernels:
    no batch size compiles a variant in the middle of a run."""
    from llmdeploy_engine.kernels import triton_ops

    vocab = 151936
    triton_ops.argmax_rows(torch.randn(1, vocab, device=DEVICE))
    kernels = (triton_ops._argmax_part_kernel, triton_ops._argmax_merge_kernel)
    before = [_compiled_variants(k) for k in kernels]
    assert all(count >= 1 for count in before)
    gen = torch.Generator().manual_seed(5)
    seen_parts = set()
    for rows in (1, 2, 3, 33, 64, 100, 129, 255, 256):
        seen_parts.add(triton_ops.argmax_parts(rows, vocab))
        x = torch.randn(rows, vocab, generator=gen)
        out = torch.full((3, rows), -1, dtype=torch.long, device=DEVICE)
        triton_ops.argmax_rows(x.to(DEVICE), out=out[1])
        assert torch.equal(out[1].cpu(), torch.argmax(x, dim=-1)), rows
    assert seen_parts == {128, 64, 32, 16}
    assert [_compiled_variants(k) for k in kernels] == before
