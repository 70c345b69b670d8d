"""Per-kernel GPU timings: the Triton kernels against the pure-torch paths they replace.

One layer of Llama-3.1-8B's shapes (32 query heads, 8 KV heads, head_dim 128, hidden 4096, bf16,
block_size 16). Rows:

- decode attention (KV write + attention) at 1/32/256 sequences and several contexts: the torch
  path (index_copy, gather of whole blocks padded to the longest context, SDPA) vs the Triton path
  (write kernel + paged decode, split-KV where chosen), and the Triton path with one split;
- fp8 (e4m3, e5m2) vs bf16 KV at 32 x 8k, 1 x 8k and 256 x 2k through the Triton path, and
  (--fp8-only) the decode kernel's fp8 configurations against the kernel before fp16 dots;
- prefill of 8k tokens: per-sequence SDPA (the torch path, gathered copies where there is a prefix)
  vs one varlen launch, without and with cached prefixes, and a 4-token verification batch;
- fused add+RMSNorm and RoPE vs the torch ops at 1 and 256 tokens.

Times are medians of triton.testing.do_bench (ms); "GB/s" counts the K/V bytes the attention must
read once. Each row is measured on its own and a failing row prints its error and the run goes on.

    PYTHONPATH=<dir holding llmdeploy_engine> python benchmarks/gpu_kernels.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import random
import traceback
from collections.abc import Callable
from typing import Any

import torch
import triton.testing
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels import ops, triton_ops
from llmdeploy_engine.kernels.triton_attention import paged_attention_triton
from llmdeploy_engine.kernels.triton_varlen import varlen_attention
from llmdeploy_engine.model.attention import _paged_attention, build_attention_metadata

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, BS = 32, 8, 128, 4096, 16
DEV = torch.device("cuda")
ROWS: list[tuple[str, str]] = []


def bench(fn: Callable[[], Any]) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def row(name: str, measure: Callable[[], str]) -> None:
    """Run one row's measurement; a failing row prints its error and the run goes on."""
    try:
        text = measure()
    except Exception as exc:
        traceback.print_exc()
        text = f"FAILED: {type(exc).__name__}: {exc}"
    finally:
        torch.cuda.empty_cache()
    ROWS.append((name, text))
    print(f"{name:58s} {text}", flush=True)


def make_batch(query_len: list[int], context_len: list[int]) -> tuple[ForwardBatch, int]:
    """A ForwardBatch with shuffled block tables; returns it and the number of blocks used."""
    per_seq = [-(-c // BS) for c in context_len]
    blocks = list(range(sum(per_seq) + 1))
    random.Random(0).shuffle(blocks)
    tables, slots, starts, positions, used = [], [], [], [], 0
    for q, c, nb in zip(query_len, context_len, per_seq, strict=True):
        table = blocks[used : used + nb]
        used += nb
        tables.append(table)
        starts.append(len(slots))
        for p in range(c - q, c):
            slots.append(table[p // BS] * BS + p % BS)
            positions.append(p)
    batch = ForwardBatch(
        [0] * len(slots),
        positions,
        slots,
        starts,
        query_len,
        context_len,
        tables,
        list(range(len(query_len))),
    )
    return batch, len(blocks)


def attention_case(query_len: list[int], context_len: list[int], kv_dtype: torch.dtype) -> dict[str, Any]:
    batch, num_blocks = make_batch(query_len, context_len)
    meta = build_attention_metadata(batch, BS, DEV)
    n = batch.num_tokens
    gen = torch.Generator(device=DEV).manual_seed(0)
    q = torch.randn(n, HEADS, HEAD_DIM, device=DEV, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(n, KV_HEADS, HEAD_DIM, device=DEV, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(n, KV_HEADS, HEAD_DIM, device=DEV, dtype=torch.bfloat16, generator=gen)
    shape = (num_blocks, BS, KV_HEADS, HEAD_DIM)
    cache = (
        torch.randn(shape, device=DEV, generator=gen).to(kv_dtype),
        torch.randn(shape, device=DEV, generator=gen).to(kv_dtype),
    )
    scales = (torch.ones(1, device=DEV), torch.ones(1, device=DEV))
    kv_bytes = sum(context_len) * KV_HEADS * HEAD_DIM * 2 * cache[0].element_size()
    return {"q": q, "k": k, "v": v, "cache": cache, "meta": meta, "scales": scales, "bytes": kv_bytes}


def torch_attention(c: dict[str, Any]) -> Callable[[], Any]:
    return lambda: _paged_attention(c["q"], c["k"], c["v"], c["cache"], c["meta"], HEAD_DIM**-0.5)


def triton_attention(c: dict[str, Any]) -> Callable[[], Any]:
    fp8 = c["cache"][0].element_size() == 1
    ks, vs = c["scales"] if fp8 else (None, None)
    return lambda: paged_attention_triton(
        c["q"], c["k"], c["v"], c["cache"], c["meta"], HEAD_DIM**-0.5, ks, vs
    )


def fmt(ms: float, nbytes: int | None = None) -> str:
    return f"{ms * 1000:8.1f} us" + (f" ({nbytes / ms / 1e6:6.0f} GB/s)" if nbytes else "")


def vs(a: float, b: float) -> str:
    return f"triton/torch speed-up {a / b:5.2f}x"


def decode_rows(sizes: list[tuple[int, int]]) -> None:
    import llmdeploy_engine.kernels.triton_attention as ta

    for n, ctx in sizes:

        def measure(n: int = n, ctx: int = ctx) -> str:
            c = attention_case([1] * n, [ctx] * n, torch.bfloat16)
            t_torch = bench(torch_attention(c))
            t_triton = bench(triton_attention(c))
            splits = ta.choose_num_splits(n, KV_HEADS, ctx, DEV)
            saved = ta.choose_num_splits
            ta.choose_num_splits = lambda *a: 1  # type: ignore[assignment]
            try:
                t_one = bench(triton_attention(c))
            finally:
                ta.choose_num_splits = saved
            return (
                f"torch {fmt(t_torch, c['bytes'])} | triton ({splits} splits) {fmt(t_triton, c['bytes'])} | "
                f"triton 1 split {fmt(t_one, c['bytes'])} | {vs(t_torch, t_triton)}"
            )

        row(f"decode attention n={n} ctx={ctx}", measure)


def decode_tuning_rows(sizes: list[tuple[int, int]]) -> None:
    """paged_decode alone (no write): split counts at the default tile, then other tiles / warps
    than the defaults (64 keys, 4 warps) at the chosen split count."""
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    for n, ctx in sizes:

        def measure(n: int = n, ctx: int = ctx) -> str:
            c = attention_case([1] * n, [ctx] * n, torch.bfloat16)
            meta = c["meta"]
            q, (kc, vc) = c["q"], c["cache"]
            tables = meta.decode_blocks.view(n, -1)
            lengths = meta.decode_mask.view(n, -1).sum(-1)
            cells = []
            for splits in (1, 2, 4, 8, 16, 32):
                t = bench(
                    lambda splits=splits: paged_decode(
                        q, kc, vc, tables, lengths, HEAD_DIM**-0.5, num_splits=splits
                    )
                )
                cells.append(f"{splits} splits: {t * 1000:.1f} us")
            for tile, warps in ((64, 8), (128, 4), (128, 8), (32, 4)):
                t = bench(
                    lambda tile=tile, warps=warps: paged_decode(
                        q, kc, vc, tables, lengths, HEAD_DIM**-0.5, tile=tile, num_warps=warps
                    )
                )
                cells.append(f"tile {tile} warps {warps}: {fmt(t, c['bytes'])}")
            return " | ".join(cells)

        row(f"decode kernel only n={n} ctx={ctx}", measure)


def fp8_rows(sizes: list[tuple[int, int]]) -> None:
    """bf16 vs fp8 (e4m3, e5m2) KV through the Triton path (write + decode, default configs)."""
    for n, ctx in sizes:
        base: list[float] = []
        for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):

            def measure(
                dtype: torch.dtype = dtype, n: int = n, ctx: int = ctx, base: list[float] = base
            ) -> str:
                c = attention_case([1] * n, [ctx] * n, dtype)
                t = bench(triton_attention(c))
                if not base:
                    base.append(t)
                return f"{fmt(t, c['bytes'])} | vs bf16 KV {base[0] / t:5.2f}x"

            row(f"decode n={n} ctx={ctx} triton, KV {str(dtype).removeprefix('torch.')}", measure)


# paged_decode keyword sets timed over an e4m3 cache; the first is the kernel before fp16 dots
# (bf16 dots, tile 64, 4 warps, 3 stages). benchmarks/gpu_fp8_sweep.py times many more.
FP8_CONFIGS: list[dict[str, Any]] = [
    {"fp16_dot": False, "fp8_cvt": "to", "tile": 64, "num_warps": 4, "num_stages": 3},
    {"fp16_dot": True, "fp8_cvt": "to", "tile": 128, "num_warps": 4, "num_stages": 3},
    {"fp16_dot": True, "fp8_cvt": "to", "tile": 128, "num_warps": 4, "num_stages": 5},
    {"fp16_dot": True, "fp8_cvt": "v", "tile": 128, "num_warps": 4, "num_stages": 5},
    {"fp16_dot": True, "fp8_cvt": "v", "tile": 128, "num_warps": 4, "num_stages": 4},
    {"fp16_dot": True, "fp8_cvt": "kv", "tile": 128, "num_warps": 4, "num_stages": 5},
    {"fp16_dot": True, "fp8_cvt": "v", "tile": 64, "num_warps": 4, "num_stages": 5},
]


def decode_only(n: int, ctx: int, dtype: torch.dtype) -> tuple[Callable[..., torch.Tensor], int]:
    """paged_decode over a fresh n x ctx case (keywords passed through) and the K/V bytes it reads."""
    from llmdeploy_engine.kernels.triton_attention import paged_decode

    c = attention_case([1] * n, [ctx] * n, dtype)
    meta, q, (kc, vc) = c["meta"], c["q"], c["cache"]
    tables = meta.decode_blocks.view(n, -1)
    lengths = meta.decode_mask.view(n, -1).sum(-1)
    ks, vs_ = c["scales"] if dtype != torch.bfloat16 else (None, None)

    def fn(**kw: Any) -> torch.Tensor:
        return paged_decode(q, kc, vc, tables, lengths, HEAD_DIM**-0.5, ks, vs_, **kw)

    return fn, int(c["bytes"])


def fp8_tuning_rows(sizes: list[tuple[int, int, int]]) -> None:
    """paged_decode alone over e4m3 vs bf16 caches: the kernel before fp16 dots, then
    the first `configs` FP8_CONFIGS, the default, and split counts 2x/4x the chosen one; each fp8
    cell shows its output's relative difference from the old kernel's as a check."""
    import llmdeploy_engine.kernels.triton_attention as ta

    for n, ctx, configs in sizes:

        def measure(n: int = n, ctx: int = ctx, configs: int = configs) -> str:
            fn16, nbytes16 = decode_only(n, ctx, torch.bfloat16)
            bf16_t = bench(fn16)
            cells = [f"bf16 default: {fmt(bf16_t, nbytes16)}"]
            fn8, nbytes8 = decode_only(n, ctx, torch.float8_e4m3fn)
            chosen = ta.choose_num_splits(
                n, KV_HEADS, ctx, DEV, ta.decode_config(True, n, KV_HEADS).programs_per_sm
            )
            runs: list[dict[str, Any]] = [dict(kw) for kw in FP8_CONFIGS[:configs]]
            runs += [{}] + [{"num_splits": min(chosen * f, ta.MAX_SPLITS)} for f in (2, 4)]
            ref = fn8(**runs[0]).float()
            for kw in runs:
                name = ",".join(f"{k}={v}" for k, v in kw.items()) or "default"
                try:
                    diff = float((fn8(**kw).float() - ref).norm() / ref.norm())
                    t = bench(functools.partial(fn8, **kw))
                except Exception as exc:  # one configuration failing leaves the others' cells
                    cells.append(f"e4m3 {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                cells.append(f"e4m3 {name}: {fmt(t, nbytes8)} x{bf16_t / t:4.2f} of bf16 (diff {diff:.1e})")
            return " | ".join(cells)

        row(
            f"fp8 decode kernel only n={n} ctx={ctx} (chosen splits "
            f"{ta.choose_num_splits(n, KV_HEADS, ctx, DEV, ta.decode_config(True, n, KV_HEADS).programs_per_sm)})",
            measure,
        )


def prefill_rows(cases: list[tuple[str, list[int], list[int]]]) -> None:
    for name, qlens, ctxs in cases:

        def measure(qlens: list[int] = qlens, ctxs: list[int] = ctxs) -> str:
            c = attention_case(qlens, ctxs, torch.bfloat16)
            t_torch = bench(torch_attention(c))
            t_triton = bench(triton_attention(c))
            varlen = c["meta"].varlen
            t_m128 = bench(lambda: varlen_attention(c["q"], *c["cache"], varlen, HEAD_DIM**-0.5, block_m=128))
            flops = sum(
                4 * HEADS * HEAD_DIM * q * (x - q + (q + 1) / 2) for q, x in zip(qlens, ctxs, strict=True)
            )
            return (
                f"torch {fmt(t_torch)} ({flops / t_torch / 1e9:5.1f} TFLOP/s) | "
                f"triton {fmt(t_triton)} ({flops / t_triton / 1e9:5.1f} TFLOP/s) | {vs(t_torch, t_triton)} | "
                f"attention only, BLOCK_M 128: {fmt(t_m128)} ({flops / t_m128 / 1e9:5.1f} TFLOP/s)"
            )

        row(name, measure)


def elementwise_rows() -> None:
    eps = 1e-5
    w = torch.randn(HIDDEN, device=DEV, dtype=torch.bfloat16)
    for n in (1, 256):
        x = torch.randn(n, HIDDEN, device=DEV, dtype=torch.bfloat16)
        r = torch.randn(n, HIDDEN, device=DEV, dtype=torch.bfloat16)

        def norm(x: torch.Tensor = x, r: torch.Tensor = r) -> str:
            def torch_norm() -> Any:
                s = x + r
                x32 = s.float()
                return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype), s

            t_torch = bench(torch_norm)
            t_triton = bench(lambda: triton_ops.add_rms_norm(x, r, w, eps))
            return f"torch {fmt(t_torch)} | triton {fmt(t_triton)} | {vs(t_torch, t_triton)}"

        row(f"add+rms_norm n={n} hidden={HIDDEN}", norm)

        def rope(n: int = n) -> str:
            q = torch.randn(n, HEADS, HEAD_DIM, device=DEV, dtype=torch.bfloat16)
            k = torch.randn(n, KV_HEADS, HEAD_DIM, device=DEV, dtype=torch.bfloat16)
            emb = torch.randn(n, 1, HEAD_DIM // 2, device=DEV).repeat(1, 1, 2)
            cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
            t_torch = bench(lambda: (q * cos + ops.rotate_half(q) * sin, k * cos + ops.rotate_half(k) * sin))
            t_triton = bench(lambda: triton_ops.apply_rope(q, k, cos, sin))
            return f"torch {fmt(t_torch)} | triton {fmt(t_triton)} | {vs(t_torch, t_triton)}"

        row(f"rope q+k n={n}", rope)


def graph_capture() -> str:
    """The varlen path inside a CUDA graph (uniform 4-token verification, 32 sequences): replay
    output equals the eager output."""
    c = attention_case([4] * 32, [1000] * 32, torch.bfloat16)
    fn = triton_attention(c)
    eager = fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    return f"replay == eager: {torch.equal(out, eager)} | replay {fmt(bench(g.replay))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--fp8-only", action="store_true", help="only the fp8 KV rows and configurations")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    if args.fp8_only:
        fp8_rows([(32, 8192), (1, 8192), (256, 2048)])
        fp8_tuning_rows([(32, 8192, len(FP8_CONFIGS)), (1, 8192, 5), (256, 2048, 5)])
        return
    sizes = [(1, 512), (1, 2048), (1, 8192), (32, 2048), (32, 8192), (256, 512), (256, 2048)]
    if args.quick:
        sizes = [(1, 2048), (32, 8192), (256, 1024)]
    decode_rows(sizes)
    fp8_rows([(32, 8192), (1, 8192), (256, 2048)])
    prefill_rows(
        [
            ("prefill 8 x 1024 new tokens, no prefix", [1024] * 8, [1024] * 8),
            ("prefill 32 x 256 new tokens, no prefix", [256] * 32, [256] * 32),
            ("prefill 8 x 1024 new after 1024 cached (prefix hit)", [1024] * 8, [2048] * 8),
            (
                "mixed: 2 x 2048 prefill + 128 decodes at ctx 1024",
                [2048] * 2 + [1] * 128,
                [2048] * 2 + [1024] * 128,
            ),
            ("verify 64 x 4 tokens at ctx 2048", [4] * 64, [2048] * 64),
        ]
    )
    elementwise_rows()
    row("varlen 32 x 4-token verify at ctx 1000 in a CUDA graph", graph_capture)
    decode_tuning_rows([(1, 8192), (32, 8192), (1, 2048)])
    print("\n| kernel | timings |\n|---|---|")
    for name, text in ROWS:
        print(f"| {name} | {text} |")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
