"""On a CUDA GPU: the Triton varlen paged attention kernel against a float64 reference on random
batches (full prefills, prefix hits off block edges, chunked prefill, multi-token and single-token
decode, mixed in one launch; GQA 1/4/7/16; head_dim 64/128; block_size 16/32; shuffled block
tables; bf16/fp16; fp8 e4m3/e5m2 caches with scales), and the whole dispatch through
`attention.paged_attention` against the pure-torch path on a mixed batch."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, FP8, INTERPRET, TRITON_TEST_MARKS, make_batch, reference, rel_err
from llmdeploy_engine.kernels.attention import VarlenMetadata

pytestmark = TRITON_TEST_MARKS

# (query_len, context_len per sequence, num_heads, num_kv_heads, head_dim, block_size)
CASES = [
    ([300], [300], 8, 8, 64, 16),  # one full prefill, GQA 1
    ([37, 1, 120, 5], [37, 200, 161, 40], 28, 4, 128, 16),  # GQA 7: prefill, decode, prefix hit, verify
    ([64, 2, 8, 1, 1], [64 + 31, 500, 33, 17, 1000], 32, 8, 128, 32),  # GQA 4, block 32
    ([3, 250, 1], [3, 251, 2], 16, 1, 64, 16),  # GQA 16 (all heads share one KV head)
    ([4, 4, 4, 4], [19, 64, 100, 129], 32, 8, 64, 16),  # uniform 4-token verification
]
if INTERPRET:
    CASES = [([9, 1, 3], [9, 20, 150], 8, 2, 32, 16), ([5, 2, 70], [37, 133, 200], 7, 1, 16, 32)]


def meta_of(b, device):  # type: ignore[no-untyped-def]
    return VarlenMetadata(
        query_start=torch.tensor(b.query_start, dtype=torch.int32, device=device),
        query_len=torch.tensor(b.query_len, dtype=torch.int32, device=device),
        context_len=torch.tensor(b.context_len, dtype=torch.int32, device=device),
        block_tables=b.tables,
        max_query_len=max(b.query_len),
    )


DTYPES = [
    (torch.float32, torch.float32, 2e-3),
    (torch.bfloat16, torch.bfloat16, 2e-2),
    (torch.float16, torch.float16, 5e-3),
    (torch.float32, torch.float8_e4m3fn, 2e-3),
    (torch.float32, torch.float8_e5m2, 2e-3),
    (torch.bfloat16, torch.float8_e4m3fn, 2e-2),
    (torch.bfloat16, torch.float8_e5m2, 2e-2),
    (torch.float16, torch.float8_e4m3fn, 5e-3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}x{c[3]}-d{c[4]}-bs{c[5]}")
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_varlen_matches_float64(case, dtypes) -> None:  # type: ignore[no-untyped-def]
    from llmdeploy_engine.kernels.triton_varlen import varlen_attention

    dtype, cache_dtype, tol = dtypes
    if INTERPRET and dtype != torch.float32:
        pytest.skip("Triton's CPU interpreter computes 16-bit tl.dot wrongly: checked on the GPU only")
    if DEVICE == "cuda" and dtype == torch.float32:
        if case != CASES[1]:
            pytest.skip("float32 on the GPU: one case (tf32); all cases under the interpreter")
        tol = 2e-2  # float32 tl.dot runs in tf32 on the GPU
    qlens, ctxs, num_heads, num_kv_heads, head_dim, bs = case
    b = make_batch(
        qlens, ctxs, num_heads, num_kv_heads, head_dim, bs, dtype, cache_dtype, DEVICE, seed=len(ctxs)
    )
    scale = head_dim**-0.5
    out = varlen_attention(b.q, b.k_cache, b.v_cache, meta_of(b, DEVICE), scale, b.k_scale, b.v_scale)
    err = rel_err(out, reference(b, scale))
    assert err < tol, err


@pytest.mark.parametrize("block_m", [16, 64, 128])
def test_varlen_row_tiles_cover_long_queries(block_m: int) -> None:
    """The same batch with small and large row tiles (many tiles per sequence, partial last tiles)."""
    from llmdeploy_engine.kernels.triton_varlen import varlen_attention

    qlens, ctxs = ([7, 1, 13], [7, 130, 140]) if INTERPRET else ([129, 1, 77], [129, 1500, 300])
    dtype = torch.float32 if INTERPRET else torch.bfloat16
    b = make_batch(qlens, ctxs, 12, 4, 32 if INTERPRET else 128, 16, dtype, dtype, DEVICE, seed=3)
    scale = b.q.shape[-1] ** -0.5
    out = varlen_attention(b.q, b.k_cache, b.v_cache, meta_of(b, DEVICE), scale, block_m=block_m)
    err = rel_err(out, reference(b, scale))
    assert err < (2e-3 if INTERPRET else 2e-2), err


@pytest.mark.skipif(DEVICE != "cuda", reason="the dispatch runs on CUDA tensors only")
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_paged_attention_dispatch_mixed_batch(cache_dtype: torch.dtype) -> None:
    """attention.paged_attention on a CUDA bf16 batch mixing a fresh prefill, a prefix hit, decodes and a
    3-token verification: writes the cache like the contract says and matches the float64 reference
    over the written cache; for a bf16 cache it also matches the pure-torch path."""
    from kernel_cases import quantize
    from llmdeploy_engine.core.forward_batch import ForwardBatch
    from llmdeploy_engine.kernels.attention import _paged_attention, build_attention_metadata, paged_attention

    gen = torch.Generator().manual_seed(11)
    bs, num_heads, num_kv_heads, head_dim = 16, 32, 8, 128
    qlens, ctxs = [40, 1, 17, 3, 1], [40, 90, 57, 200, 33]
    num_blocks = sum(-(-c // bs) for c in ctxs) + 4
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots, positions, starts, used = [], [], [], [], 0
    for q, c in zip(qlens, ctxs, strict=True):
        nb = -(-c // bs)
        tables.append(perm[used : used + nb])
        used += nb
        starts.append(len(slots))
        for p in range(c - q, c):
            slots.append(tables[-1][p // bs] * bs + p % bs)
            positions.append(p)
    batch = ForwardBatch(
        input_ids=[0] * len(slots),
        positions=positions,
        slot_mapping=slots,
        query_start=starts,
        query_len=qlens,
        context_len=ctxs,
        block_tables=tables,
        sample_indices=list(range(len(qlens))),
    )
    meta = build_attention_metadata(batch, bs, torch.device("cuda"))
    assert meta.varlen is not None and meta.varlen.max_query_len == 40
    assert meta.varlen.query_len.tolist() == [40, 17, 3]  # the decodes go to paged_decode
    n = len(slots)
    q = torch.randn(n, num_heads, head_dim, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(n, num_kv_heads, head_dim, generator=gen).to("cuda", torch.bfloat16)
    cache = [torch.randn(num_blocks, bs, num_kv_heads, head_dim, generator=gen) for _ in range(2)]
    scales = (None, None)
    if cache_dtype in FP8:
        scales = (torch.tensor([0.01], device="cuda"), torch.tensor([0.02], device="cuda"))
        kv = (
            quantize(cache[0], cache_dtype, scales[0].cpu()),
            quantize(cache[1], cache_dtype, scales[1].cpu()),
        )
    else:
        kv = (cache[0].to(cache_dtype), cache[1].to(cache_dtype))
    kv_cache = (kv[0].to("cuda"), kv[1].to("cuda"))
    before = (kv_cache[0].clone(), kv_cache[1].clone())
    scale = head_dim**-0.5
    out = paged_attention(q, k, v, kv_cache, meta, scale, k_scale=scales[0], v_scale=scales[1])

    # the write: new slots hold the contract's stored values, every other slot is untouched
    slot_t = torch.tensor(slots, device="cuda")
    for cache_t, old, new, s in (
        (kv_cache[0], before[0], k, scales[0]),
        (kv_cache[1], before[1], v, scales[1]),
    ):
        flat, flat_old = cache_t.view(-1, num_kv_heads, head_dim), old.view(-1, num_kv_heads, head_dim)
        want = new.to(cache_dtype) if s is None else quantize(new, cache_dtype, s)
        assert torch.equal(flat[slot_t].float(), want.float())
        keep = torch.ones(flat.shape[0], dtype=torch.bool, device="cuda")
        keep[slot_t] = False
        assert torch.equal(flat[keep].float(), flat_old[keep].float())

    from kernel_cases import PagedBatch

    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device="cuda")
    b = PagedBatch(q, kv_cache[0], kv_cache[1], scales[0], scales[1], padded, starts, qlens, ctxs)
    err = rel_err(out, reference(b, scale))
    assert err < 2e-2, err
    if cache_dtype not in FP8:
        ref_cache = (before[0].clone(), before[1].clone())
        torch_out = _paged_attention(q, k, v, ref_cache, meta, scale)
        assert rel_err(out, torch_out.double().cpu()) < 2e-2


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("q_mul", [1.0, 1e5])
def test_varlen_fp8_fp16_dots(cache_dtype: torch.dtype, q_mul: float) -> None:
    """bf16 query over an fp8 cache: fp16 dots (the default) and bf16 dots against the float64
    reference, including |q| far past fp16's 65504 (the kernel rescales q by a power of two)."""
    from llmdeploy_engine.kernels.triton_varlen import varlen_attention

    qlens, ctxs = ([9, 1, 3], [9, 20, 150]) if INTERPRET else ([37, 1, 120, 4], [37, 200, 161, 40])
    shape = (8, 2, 32, 16) if INTERPRET else (32, 8, 128, 16)
    b = make_batch(qlens, ctxs, *shape, torch.bfloat16, cache_dtype, DEVICE, seed=4)
    b.q = (b.q.float() * q_mul).to(torch.bfloat16)
    assert q_mul == 1.0 or float(b.q.abs().max()) > 65504
    scale = shape[2] ** -0.5 / q_mul
    ref = reference(b, scale)
    runs = [(None, None, None), (True, None, None)] + ([] if INTERPRET else [(False, None, None)])
    # 16 and 32 rows take V through the cvt helper on the GPU ("v"); "to" there for comparison
    runs += [] if INTERPRET else [(None, 16, "v"), (None, 32, "v"), (None, 16, "to"), (None, 64, None)]
    for fp16_dot, block_m, cvt in runs:
        out = varlen_attention(
            b.q, b.k_cache, b.v_cache, meta_of(b, DEVICE), scale, b.k_scale, b.v_scale, block_m=block_m,
            fp16_dot=fp16_dot, fp8_cvt=cvt,
        )  # fmt: skip
        err = rel_err(out, ref)
        assert err < 2e-2, (fp16_dot, block_m, cvt, err)
