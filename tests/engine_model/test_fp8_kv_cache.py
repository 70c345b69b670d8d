"""fp8 KV cache storage (engine/kernels/kv_cache.py) and the pure-torch attention path over it, on random data.

References are float64: the round trip is bounded by the format's mantissa width, and attention over
an fp8 cache must equal float64 attention over the dequantized cache contents.
"""

from __future__ import annotations

import random

import pytest
import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels import kv_cache
from llmdeploy_engine.kernels.attention import build_attention_metadata, paged_attention

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# (mantissa bits, smallest subnormal) of each format
FORMAT = {torch.float8_e4m3fn: (3, 2.0**-9), torch.float8_e5m2: (2, 2.0**-16)}


def test_dtype_names_follow_vllm() -> None:
    assert kv_cache.kv_cache_dtype("fp8", torch.bfloat16) == torch.float8_e4m3fn  # vLLM: fp8 means e4m3
    assert kv_cache.kv_cache_dtype("fp8_e4m3", torch.bfloat16) == torch.float8_e4m3fn
    assert kv_cache.kv_cache_dtype("fp8_e5m2", torch.bfloat16) == torch.float8_e5m2
    assert kv_cache.kv_cache_dtype("auto", torch.float32) == torch.float32
    assert kv_cache.kv_cache_dtype("bf16", torch.float32) == torch.bfloat16
    with pytest.raises(ValueError, match=r"kv_cache_dtype 'int8'.*fp8_e5m2"):
        kv_cache.kv_cache_dtype("int8", torch.float32)
    assert (kv_cache.fp8_max(torch.float8_e4m3fn), kv_cache.fp8_max(torch.float8_e5m2)) == (448.0, 57344.0)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("scale_value", [1.0, 0.0123, 7.5])
def test_round_trip_error_is_within_half_an_ulp(dtype: torch.dtype, scale_value: float) -> None:
    torch.manual_seed(0)
    mantissa, smallest = FORMAT[dtype]
    scale = torch.tensor([scale_value])
    # magnitudes spread over the format's range (in stored units), both signs
    stored_units = torch.exp(torch.empty(20_000).uniform_(-12, 5.5)) * torch.sign(torch.randn(20_000))
    x = (stored_units * scale_value).float()
    back = kv_cache.dequantize(kv_cache.quantize(x, scale, dtype), scale, torch.float32)
    err = (back.double() - x.double()).abs()
    # round to nearest: relative error <= 2^-(mantissa+1) for normal values, half a subnormal step below
    bound = torch.maximum(x.double().abs() * 2.0 ** -(mantissa + 1), torch.tensor(smallest / 2 * scale_value))
    assert bool((err <= bound * (1 + 1e-6)).all()), float((err / bound).max())
    # and the bound is tight: a quantizer that kept more precision (or a wrong scale) would not reach it
    assert float((err / bound).max()) > 0.9


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequantize_is_float32_multiply_then_one_rounding(dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    every = torch.arange(256, dtype=torch.uint8).view(dtype)
    every = every[~torch.isnan(every.float())]  # all 254 (e4m3) / 248 (e5m2) finite codes, and e5m2's infs
    for s in (1.0, 0.0123, 3.7, 2.0**-10 * 1.37):
        scale = torch.tensor([s])
        want = (every.double() * torch.tensor(s, dtype=torch.float32).double()).float().to(out_dtype)
        assert torch.equal(kv_cache.dequantize(every, scale, out_dtype), want)


@pytest.mark.parametrize("dtype", FP8)
def test_values_beyond_the_range_saturate(dtype: torch.dtype) -> None:
    scale = torch.tensor([0.5])
    limit = kv_cache.fp8_max(dtype)
    x = torch.tensor([1e9, -1e9, limit * 0.5 * 1.01, float("inf"), 0.0])
    stored = kv_cache.quantize(x, scale, dtype).float()
    assert stored.tolist() == [limit, -limit, limit, limit, 0.0]
    back = kv_cache.dequantize(kv_cache.quantize(x, scale, dtype), scale, torch.bfloat16)
    assert back.dtype == torch.bfloat16 and bool(torch.isfinite(back).all())


@pytest.mark.parametrize("dtype", FP8)
def test_calibrated_scale_maps_amax_with_margin_to_the_format_max(dtype: torch.dtype) -> None:
    amax = torch.tensor([12.0])
    scale = kv_cache.calibrated_scale(amax, dtype, margin=2.0)
    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert float(scale) * kv_cache.fp8_max(dtype) == pytest.approx(24.0)
    # amax itself is then stored unsaturated, at half the format's max
    stored = kv_cache.quantize(amax, scale, dtype).float()
    assert float(stored) == pytest.approx(kv_cache.fp8_max(dtype) / 2, rel=2.0**-3)
    assert float(kv_cache.calibrated_scale(torch.tensor([0.0]), dtype)) == 1.0
    assert float(kv_cache.calibrated_scale(torch.tensor([float("nan")]), dtype)) == 1.0
    with pytest.raises(ValueError, match="margin"):
        kv_cache.calibrated_scale(amax, dtype, margin=0.5)


def test_amax_observer_keeps_the_running_maximum() -> None:
    obs = kv_cache.KVAmaxObserver(torch.device("cpu"))
    obs.update(torch.tensor([[1.0, -3.0]]), torch.tensor([[0.5]]))
    obs.update(torch.tensor([[2.0]]), torch.tensor([[-4.0, 0.1]]))
    obs.update(torch.zeros(0, 2), torch.zeros(0, 2))
    assert (float(obs.k_amax), float(obs.v_amax)) == (3.0, 4.0)


@pytest.mark.parametrize("dtype", [*FP8, torch.bfloat16])
def test_write_then_read_blocks(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    num_blocks, block_size, heads, dim = 6, 4, 2, 8
    cache = torch.zeros(num_blocks, block_size, heads, dim, dtype=dtype)
    scale = torch.tensor([0.03])
    x = torch.randn(5, heads, dim)
    slots = torch.tensor([21, 4, 5, 22, 0])
    kv_cache.write_kv(cache, slots, x, scale)
    blocks = torch.tensor([5, 1, 0, 1])  # two sequences of two blocks
    got = kv_cache.read_blocks(cache, blocks, 2, scale, torch.float32)
    assert got.shape == (2, heads, 2 * block_size, dim)
    flat = got.transpose(1, 2).reshape(-1, heads, dim)  # slots 20..23, 4..7, 0..3, 4..7
    if kv_cache.is_fp8(dtype):
        want = kv_cache.dequantize(kv_cache.quantize(x, scale, dtype), scale, torch.float32)
    else:
        want = x.to(dtype).float()
    for i, slot in enumerate(slots.tolist()):
        block, offset = divmod(slot, block_size)
        for pos, b in enumerate(blocks.tolist()):
            if b == block:
                assert torch.equal(flat[pos * block_size + offset], want[i])
    assert torch.equal(flat[6], torch.zeros(heads, dim))  # slot 6 was never written
    if kv_cache.is_fp8(dtype):
        with pytest.raises(ValueError, match="scale"):
            kv_cache.write_kv(cache, slots, x, None)
        with pytest.raises(ValueError, match="scale"):
            kv_cache.read_blocks(cache, blocks, 2, None, torch.float32)


def _mixed_batch(block_size: int, num_blocks: int) -> tuple[ForwardBatch, list[list[int]], list[int]]:
    rng = random.Random(0)
    seqs = [(5, 1), (0, 7), (9, 3), (12, 1), (30, 1)]  # (cached, new): decodes, a prefill, a chunk
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables: list[list[int]] = []
    positions: list[int] = []
    slots: list[int] = []
    starts: list[int] = []
    for cached, new in seqs:
        n_blocks = -(-(cached + new) // block_size)
        table, free = free[:n_blocks], free[n_blocks:]
        tables.append(table)
        starts.append(len(positions))
        positions += list(range(cached, cached + new))
        slots += [table[p // block_size] * block_size + p % block_size for p in range(cached, cached + new)]
    batch = ForwardBatch(
        [0] * len(positions),
        positions,
        slots,
        starts,
        [s[1] for s in seqs],
        [sum(s) for s in seqs],
        tables,
        list(range(len(seqs))),
    )
    return batch, tables, starts


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_attention_over_an_fp8_cache_matches_float64_over_its_contents(
    dtype: torch.dtype, q_dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, block_size, num_blocks = 6, 2, 16, 4, 48
    k_scale, v_scale = torch.tensor([0.02]), torch.tensor([0.005])
    # a cache already holding (quantized) context, then this step's K/V written by paged_attention
    k_cache = kv_cache.quantize(torch.randn(num_blocks, block_size, kv_heads, dim) * 3, k_scale, dtype)
    v_cache = kv_cache.quantize(torch.randn(num_blocks, block_size, kv_heads, dim), v_scale, dtype)
    batch, tables, starts = _mixed_batch(block_size, num_blocks)
    n = len(batch.positions)
    q = torch.randn(n, heads, dim).to(q_dtype)
    k = (torch.randn(n, kv_heads, dim) * 3).to(q_dtype)
    v = torch.randn(n, kv_heads, dim).to(q_dtype)
    meta = build_attention_metadata(batch, block_size, q.device)
    out = paged_attention(q, k, v, (k_cache, v_cache), meta, dim**-0.5, k_scale=k_scale, v_scale=v_scale)
    assert out.dtype == q_dtype

    keys_all = k_cache.double().view(-1, kv_heads, dim) * k_scale.double()
    values_all = v_cache.double().view(-1, kv_heads, dim) * v_scale.double()
    group = heads // kv_heads
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[q_dtype]
    for i, (table, start) in enumerate(zip(tables, starts, strict=True)):
        ctx, new = batch.context_len[i], batch.query_len[i]
        cached = ctx - new
        ctx_slots = [table[p // block_size] * block_size + p % block_size for p in range(ctx)]
        keys, values = keys_all[ctx_slots], values_all[ctx_slots]
        # this step's K/V went in quantized with the layer's scales
        stored_k = k_cache.view(-1, kv_heads, dim)[ctx_slots[cached:]].float()
        assert torch.equal(stored_k, kv_cache.quantize(k[start : start + new], k_scale, dtype).float())
        if cached == 0:  # a fresh prefill attends over its own unquantized K/V
            keys = k[start : start + new].double()
            values = v[start : start + new].double()
        for j in range(new):
            p = cached + j
            for h in range(heads):
                scores = keys[: p + 1, h // group] @ q[start + j, h].double() * dim**-0.5
                ref = torch.softmax(scores, 0) @ values[: p + 1, h // group]
                torch.testing.assert_close(out[start + j, h].double(), ref, atol=tol, rtol=tol)
