"""On a CUDA GPU: the Triton paged decode kernel against a float64 reference on random inputs of many
shapes (GQA groups, head dims, block tables in shuffled order, context lengths off block edges), and
the drop-in `paged_attention_triton` against the pure-torch `paged_attention` on one decode batch."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRET, TRITON_TEST_MARKS
from llmdeploy_engine.kernels.attention import AttentionMetadata

pytestmark = TRITON_TEST_MARKS


def reference(q, k_cache, v_cache, tables, lengths, scale):  # type: ignore[no-untyped-def]
    n, num_heads, head_dim = q.shape
    bs, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty(n, num_heads, head_dim, dtype=torch.float64)
    for i in range(n):
        ctx = int(lengths[i])
        blocks = tables[i, : -(-ctx // bs)].cpu()
        k = k_cache.cpu()[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx].double()
        v = v_cache.cpu()[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx].double()
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, ctx, d]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        s = torch.einsum("hd,hcd->hc", q[i].cpu().double(), k) * scale
        out[i] = torch.einsum("hc,hcd->hd", torch.softmax(s, -1), v)
    return out


CASES = [
    # (num_seqs, num_heads, num_kv_heads, head_dim, max_ctx)
    (1, 14, 2, 64, 300),
    (5, 32, 8, 128, 1000),
    (7, 8, 8, 64, 77),
    (3, 16, 1, 128, 130),
]
if INTERPRET:
    CASES = [(2, 14, 2, 64, 40), (2, 8, 2, 32, 17)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 2e-2)])
def test_paged_decode_matches_float64(
    case: tuple[int, int, int, int, int], dtype: torch.dtype, tol: float
) -> None:
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    if INTERPRET and dtype == torch.bfloat16:
        pytest.skip("Triton's CPU interpreter computes bf16 tl.dot wrongly (checked on a 16x16 product)")
    n, num_heads, num_kv_heads, head_dim, max_ctx = case
    bs = 16
    gen = torch.Generator().manual_seed(sum(case))
    lengths = torch.randint(1, max_ctx + 1, (n,), generator=gen)
    lengths[0] = max_ctx
    per_seq = -(-max_ctx // bs)
    num_blocks = n * per_seq + 3
    perm = torch.randperm(num_blocks, generator=gen)
    tables = perm[: n * per_seq].view(n, per_seq).to(DEVICE)
    k_cache = torch.randn(num_blocks, bs, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(num_blocks, bs, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    q = torch.randn(n, num_heads, head_dim, generator=gen).to(DEVICE, dtype)
    scale = head_dim**-0.5
    out = paged_decode(q, k_cache, v_cache, tables, lengths.to(DEVICE), scale)
    ref = reference(q, k_cache, v_cache, tables, lengths, scale)
    got = out.cpu().double()
    assert torch.isfinite(got).all()
    err = float((got - ref).norm() / ref.norm())
    assert err < tol, err


def test_drop_in_matches_pure_torch_decode() -> None:
    from llmdeploy_engine.kernels.attention import paged_attention
    from llmdeploy_engine.kernels.triton_attention import paged_attention_triton

    gen = torch.Generator().manual_seed(7)
    n, num_heads, num_kv_heads, head_dim, bs, max_blocks = 4, 14, 2, 64, 16, 5
    num_blocks = n * max_blocks + 1
    caches = [torch.randn(num_blocks, bs, num_kv_heads, head_dim, generator=gen).to(DEVICE) for _ in range(2)]
    caches2 = [c.clone() for c in caches]
    lengths = torch.tensor([80, 3, 17, 64])
    tables = torch.randperm(num_blocks, generator=gen)[: n * max_blocks].view(n, max_blocks)
    slots = torch.stack([tables[i, (lengths[i] - 1) // bs] * bs + (lengths[i] - 1) % bs for i in range(n)])
    mask = torch.arange(max_blocks * bs)[None, :] < lengths[:, None]
    meta = AttentionMetadata(
        slot_mapping=slots.to(DEVICE),
        decode_token_index=torch.arange(n, device=DEVICE),
        decode_blocks=tables.reshape(-1).to(DEVICE),
        decode_mask=mask[:, None, None, :].to(DEVICE),
        prefills=(),
    )
    q = torch.randn(n, num_heads, head_dim, generator=gen).to(DEVICE)
    k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    v = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    ours = paged_attention_triton(q, k, v, (caches[0], caches[1]), meta, head_dim**-0.5)
    ref = paged_attention(q, k, v, (caches2[0], caches2[1]), meta, head_dim**-0.5)
    assert torch.equal(caches[0], caches2[0]) and torch.equal(caches[1], caches2[1])
    assert float((ours - ref).norm() / ref.norm()) < 2e-3


SPLIT_CASES = [
    # (num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_ctx, num_splits)
    (1, 32, 8, 128, 16, 2000, 8),
    (3, 28, 4, 128, 32, 700, 4),
    (2, 16, 16, 64, 16, 1000, 32),  # splits past some sequences' ends stay empty
]
if INTERPRET:
    SPLIT_CASES = [(2, 8, 2, 32, 16, 150, 4)]


@pytest.mark.parametrize("case", SPLIT_CASES)
@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float32, torch.float32, 2e-3),
        (torch.bfloat16, torch.bfloat16, 2e-2),
        (torch.float16, torch.float16, 5e-3),
        (torch.float32, torch.float8_e4m3fn, 2e-3),
        (torch.bfloat16, torch.float8_e4m3fn, 2e-2),
        (torch.bfloat16, torch.float8_e5m2, 2e-2),
    ],
    ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""),
)
def test_paged_decode_split_kv_and_fp8(case, dtypes) -> None:  # type: ignore[no-untyped-def]
    """Split-KV decode (flash-decoding) and fp8 caches with scales against the float64 reference."""
    from kernel_cases import make_batch, reference, rel_err
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    dtype, cache_dtype, tol = dtypes
    if INTERPRET and dtype != torch.float32:
        pytest.skip("Triton's CPU interpreter computes 16-bit tl.dot wrongly: checked on the GPU only")
    if DEVICE == "cuda" and dtype == torch.float32:
        pytest.skip("float32 is checked under the interpreter; on the GPU it runs in tf32")
    n, num_heads, num_kv_heads, head_dim, bs, max_ctx, splits = case
    gen = torch.Generator().manual_seed(n + max_ctx)
    ctxs = torch.randint(1, max_ctx + 1, (n,), generator=gen).tolist()
    ctxs[0] = max_ctx
    b = make_batch([1] * n, ctxs, num_heads, num_kv_heads, head_dim, bs, dtype, cache_dtype, DEVICE, seed=n)
    lengths = torch.tensor(ctxs, device=DEVICE)
    scale = head_dim**-0.5
    ref = reference(b, scale)
    for num_splits in (1, splits):
        out = paged_decode(
            b.q, b.k_cache, b.v_cache, b.tables, lengths, scale, b.k_scale, b.v_scale, num_splits
        )
        err = rel_err(out, ref)
        assert err < tol, (num_splits, err)


@pytest.mark.parametrize("case", SPLIT_CASES)
def test_grid_orders_give_the_same_bits(case, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """KV heads fastest in the grid (the default) or sequences fastest: each program does the same
    work, so the outputs are identical, with one split and with several, and with
    more sequences than the grid's second dimension may hold (the fallback order)."""
    from kernel_cases import make_batch
    from llmdeploy_engine.kernels import triton_attention as ta

    dtype = torch.float32 if INTERPRET else torch.bfloat16
    n, num_heads, num_kv_heads, head_dim, bs, max_ctx, splits = case
    ctxs = torch.randint(1, max_ctx + 1, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    b = make_batch([1] * n, ctxs, num_heads, num_kv_heads, head_dim, bs, dtype, dtype, DEVICE, seed=n + 3)
    lengths = torch.tensor(ctxs, device=DEVICE)
    for num_splits in (1, splits):
        args = (b.q, b.k_cache, b.v_cache, b.tables, lengths, head_dim**-0.5, None, None, num_splits)
        heads_first = ta.paged_decode(*args)
        seqs_first = ta.paged_decode(*args, heads_fastest=False)
        assert torch.equal(heads_first, seqs_first), num_splits
    # more sequences than a grid's second dimension holds: sequences go first instead
    monkeypatch.setattr(ta, "MAX_GRID_Y", n - 1)
    assert torch.equal(ta.paged_decode(*args), seqs_first)


def test_choose_num_splits_from_shapes() -> None:
    from llmdeploy_engine.kernels.triton_attention import MAX_SPLITS, choose_num_splits

    cpu = torch.device("cpu")  # 132 SMs assumed off CUDA
    assert choose_num_splits(1, 8, 8192, cpu) == 32  # single stream, long context: all SMs
    assert choose_num_splits(1, 8, 128, cpu) == 1  # too short to split
    # short single-sequence contexts: 64-token splits (measured fastest on the H200)
    assert choose_num_splits(1, 2, 256, cpu) == 4
    assert choose_num_splits(1, 8, 512, cpu) == 8
    assert choose_num_splits(1, 2, 1024, cpu) == 16
    assert choose_num_splits(256, 8, 8192, cpu) == 1  # enough programs already
    assert choose_num_splits(32, 8, 8192, cpu) == 2
    # fp8's configuration: 2 resident programs an SM; 256 programs fill 97 % of the 264 slots
    assert choose_num_splits(32, 8, 8192, cpu, 2) == 1
    assert choose_num_splits(16, 8, 8192, cpu, 2) == 2
    assert choose_num_splits(1, 8, 8192, cpu, 2) == 32
    for n in (1, 3, 32, 100):
        s = choose_num_splits(n, 8, 4096, cpu)
        assert 1 <= s <= MAX_SPLITS and s & (s - 1) == 0


def test_decode_config_by_batch_shape() -> None:
    """fp8 caches: 128-key tiles below FP8_LARGE_BATCH_PROGRAMS programs (sequences x KV heads), the
    large-batch configuration from there on; 16-bit caches: one configuration."""
    from llmdeploy_engine.kernels import triton_attention as ta

    assert ta.decode_config(True, 32, 8) is ta.FP8_LARGE_BATCH_CONFIG
    assert ta.decode_config(True, 256, 8) is ta.FP8_LARGE_BATCH_CONFIG
    assert ta.decode_config(True, 31, 8) is ta.DECODE_CONFIG[True]
    assert ta.decode_config(True, 1, 8) is ta.DECODE_CONFIG[True]
    assert ta.decode_config(False, 256, 8) is ta.DECODE_CONFIG[False]
    for config in (*ta.DECODE_CONFIG.values(), ta.FP8_LARGE_BATCH_CONFIG):
        assert config.fp8_cvt in ta.FP8_CONVERSIONS and config.programs_per_sm >= 1


@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [
        (torch.float32, torch.float32),
        (torch.float32, torch.float8_e4m3fn),
        (torch.float32, torch.float8_e5m2),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float8_e4m3fn),
        (torch.float16, torch.float8_e5m2),
    ],
    ids=str,
)
def test_write_kv_matches_the_contract(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """write_kv stores k/v at their slots (fp8: (x / scale) saturated, cast) and touches nothing else."""
    from kernel_cases import FP8, quantize
    from llmdeploy_engine.kernels.triton_attention import write_kv

    if INTERPRET and (dtype != torch.float32 or cache_dtype in FP8):
        # the interpreter's float32 -> fp8 cast rounds wrongly where rounding carries into the
        # exponent (7.986 / e4m3 -> 4.0): fp8 writes are checked on the GPU only
        pytest.skip("16-bit inputs and fp8 casts: checked on the GPU only")
    gen = torch.Generator().manual_seed(5)
    num_blocks, bs, num_kv_heads, head_dim, n = 6, 16, 3, 64, 21
    # large values: some saturate under the fp8 scales below
    k = (torch.randn(n, num_kv_heads, head_dim, generator=gen) * 4).to(DEVICE, dtype)
    v = (torch.randn(n, num_kv_heads, head_dim, generator=gen) * 4).to(DEVICE, dtype)
    slots = torch.randperm(num_blocks * bs, generator=gen)[:n].to(DEVICE)
    caches = [
        torch.randn(num_blocks, bs, num_kv_heads, head_dim, generator=gen).to(DEVICE, cache_dtype)
        for _ in range(2)
    ]
    before = [c.clone() for c in caches]
    scales = (torch.tensor([0.01], device=DEVICE), torch.tensor([0.5], device=DEVICE))
    fp8 = cache_dtype in FP8
    write_kv(k, v, (caches[0], caches[1]), slots, *(scales if fp8 else (None, None)))
    for cache, old, x, s in ((caches[0], before[0], k, scales[0]), (caches[1], before[1], v, scales[1])):
        want = old.view(-1, num_kv_heads, head_dim).clone()
        want[slots] = quantize(x, cache_dtype, s) if fp8 else x.to(cache_dtype)
        assert torch.equal(cache.view(-1, num_kv_heads, head_dim).float(), want.float())
    if fp8:
        with pytest.raises(ValueError, match="k_scale"):
            write_kv(k, v, (caches[0], caches[1]), slots)


FP8_CVTS = ["to"] if INTERPRET else ["to", "v", "kv"]  # the cvt helper is inline PTX: GPU only


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("q_mul", [1.0, 1e5])
def test_paged_decode_fp8_fp16_dots(cache_dtype: torch.dtype, q_mul: float) -> None:
    """bf16 query over an fp8 cache: the fp16-dot path (the default) with each fp8 conversion and the
    bf16-dot path, against the float64 reference, including |q| far past fp16's 65504 (the kernel
    rescales q by a power of two)."""
    from kernel_cases import make_batch, reference, rel_err
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    n, num_heads, num_kv_heads, head_dim, bs = (2, 8, 2, 32, 16) if INTERPRET else (3, 32, 8, 128, 16)
    ctxs = [150, 40] if INTERPRET else [1000, 333, 17]
    b = make_batch(
        [1] * n, ctxs, num_heads, num_kv_heads, head_dim, bs, torch.bfloat16, cache_dtype, DEVICE, 3
    )
    b.q = (b.q.float() * q_mul).to(torch.bfloat16)
    assert q_mul == 1.0 or float(b.q.abs().max()) > 65504
    scale = head_dim**-0.5 / q_mul
    ref = reference(b, scale)
    lengths = torch.tensor(ctxs, device=DEVICE)
    # the interpreter computes bf16 tl.dot wrongly, fp16 correctly
    runs = [(None, None)] + [(True, c) for c in FP8_CVTS] + ([] if INTERPRET else [(False, "to")])
    for fp16_dot, cvt in runs:
        for splits in (1, 4):
            out = paged_decode(
                b.q, b.k_cache, b.v_cache, b.tables, lengths, scale, b.k_scale, b.v_scale, splits,
                fp16_dot=fp16_dot, fp8_cvt=cvt,
            )  # fmt: skip
            err = rel_err(out, ref)
            assert err < 2e-2, (fp16_dot, cvt, splits, err)


@pytest.mark.parametrize(
    "tile,num_warps,num_stages,cvt,sum_at_end",
    [(64, 4, 3, "to", False), (128, 4, 5, "kv", False), (128, 4, 3, "kv", False), (128, 8, 5, "kv", False),
     (64, 4, 5, "kv", False), (64, 8, 5, "v", False), (128, 4, 5, "v", False), (128, 4, 5, "v", True),
     (128, 4, 4, "v", True), (256, 8, 5, "v", False), (32, 4, 4, "kv", False), (128, 4, 5, "to", False),
     (32, 4, 3, "to", True), (32, 1, 4, "v", True), (32, 1, 3, "v", False), (64, 2, 4, "v", True),
     (64, 2, 5, "v", True), (32, 2, 4, "v", True), (64, 4, 5, "v", True), (128, 4, 4, "v", False),
     (128, 4, 3, "v", True), (256, 8, 5, "v", True), (128, 4, 5, "to", True)],
)  # fmt: skip
def test_paged_decode_fp8_tuning_configs(
    tile: int, num_warps: int, num_stages: int, cvt: str, sum_at_end: bool
) -> None:
    """The fp8 decode configurations the sweep times (candidates for DECODE_CONFIG) against the
    float64 reference, bf16 query over e4m3 and e5m2, with and without split-KV."""
    from kernel_cases import make_batch, reference, rel_err
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    if INTERPRET and (tile > 32 or cvt != "to"):
        pytest.skip("large tiles and the cvt helper: checked on the GPU only")
    shape = (8, 2, 32, 16) if INTERPRET else (32, 8, 128, 16)
    ctxs = [150, 40] if INTERPRET else [1000, 333, 17, 256]
    for cache_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        b = make_batch([1] * len(ctxs), ctxs, *shape, torch.bfloat16, cache_dtype, DEVICE, 6)
        scale = shape[2] ** -0.5
        ref = reference(b, scale)
        lengths = torch.tensor(ctxs, device=DEVICE)
        for splits in (1, 4):
            out = paged_decode(
                b.q, b.k_cache, b.v_cache, b.tables, lengths, scale, b.k_scale, b.v_scale, splits,
                tile=tile, num_warps=num_warps, num_stages=num_stages, fp8_cvt=cvt, row_sum_at_end=sum_at_end,
            )  # fmt: skip
            assert rel_err(out, ref) < 2e-2, (cache_dtype, splits)


TILE_EDGE_CASES = [
    # (block_size, tile, context lengths): whole tiles only, one key past a tile, a tail only, one
    # token; tiles smaller than a block and block sizes that do not divide the tile
    (16, 32, [32, 64, 33, 31, 1]),
    (32, 16, [48, 16, 17, 5]),
    (24, 32, [96, 50, 23, 1]),
]


@pytest.mark.parametrize("case", TILE_EDGE_CASES)
@pytest.mark.parametrize("fp8", [False, True], ids=["same-dtype-cache", "e4m3-cache"])
def test_paged_decode_tile_edges(case: tuple[int, int, list[int]], fp8: bool) -> None:
    """Unmasked whole tiles plus one masked tail per split: context lengths at, just past and just
    before tile and block edges, with 1, 2 and 8 splits (some empty), against float64."""
    from kernel_cases import make_batch, reference, rel_err
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    bs, tile, ctxs = case
    # float32 under the interpreter; on the GPU float32 dots run in tf32, so bf16 there
    dtype = torch.float32 if INTERPRET else torch.bfloat16
    cache_dtype = torch.float8_e4m3fn if fp8 else dtype
    b = make_batch([1] * len(ctxs), ctxs, 8, 2, 32, bs, dtype, cache_dtype, DEVICE, 11)
    scale = 32**-0.5
    ref = reference(b, scale)
    lengths = torch.tensor(ctxs, device=DEVICE)
    tol = 2e-3 if dtype == torch.float32 else 2e-2
    for splits in (1, 2, 8):
        for sum_at_end in (False, True):
            out = paged_decode(
                b.q, b.k_cache, b.v_cache, b.tables, lengths, scale, b.k_scale, b.v_scale, splits, tile=tile,
                row_sum_at_end=sum_at_end,
            )  # fmt: skip
            assert rel_err(out, ref) < tol, (splits, sum_at_end, rel_err(out, ref))


def test_paged_decode_rejects_bad_options() -> None:
    from kernel_cases import make_batch
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    b = make_batch([1], [20], 8, 2, 32, 16, torch.float32, torch.float8_e4m3fn, DEVICE, 2)
    lengths = torch.tensor([20], device=DEVICE)
    args = (b.q, b.k_cache, b.v_cache, b.tables, lengths, 1.0, b.k_scale, b.v_scale)
    with pytest.raises(ValueError, match="fp8_cvt must be one of"):
        paged_decode(*args, fp8_cvt="bits")
    with pytest.raises(ValueError, match="not supported: fp8_cvt"):
        paged_decode(*args, fp8_cvt="kv")  # a float32 query: the dots are not fp16
    with pytest.raises(ValueError, match="tile must be"):
        paged_decode(*args, tile=48)
