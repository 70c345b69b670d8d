"""Launch configurations of the varlen prefill kernel (engine/triton_varlen.py) on one layer of
Llama-3.1-8B's attention shapes (32 query heads, 8 KV heads, head_dim 128, bf16 queries, block_size
16, a bf16 or `--kv-cache-dtype fp8_e4m3` cache).

Cases (`--cases`): the first prefill chunk of gpu_bench.py's 256-request run (the seed-0 prompt
lengths, packed into 8,192 tokens as the scheduler chunks them) and N x LEN prompts (default 8 x
1,024 and 32 x 256), each without a cached prefix. For each of BLOCK_M
(query rows per program), BLOCK_N (keys per inner tile), num_warps and num_stages: the median time
(triton.testing.do_bench), causal TFLOP/s, and the largest difference from the engine's default
configuration's output. A configuration that fails to compile or run prints its error and the sweep
goes on. The table is printed last, fastest first per case.

    PYTHONPATH=<dir holding llmdeploy_engine> python benchmarks/gpu_varlen_sweep.py
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_kernels import HEAD_DIM, HEADS, attention_case, bench
from llmdeploy_engine.kernels.triton_varlen import varlen_attention


def first_chunk(budget: int = 8192) -> list[int]:
    """The query lengths of the 256-request run's first step: prompts in order until the budget."""
    lens = torch.randint(100, 1025, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    out: list[int] = []
    left = budget
    for n in lens:
        if left <= 0:
            break
        out.append(min(n, left))
        left -= out[-1]
    return out


def causal_flops(qlens: list[int], ctxs: list[int]) -> float:
    return float(
        sum(4 * HEADS * HEAD_DIM * q * (x - q + (q + 1) / 2) for q, x in zip(qlens, ctxs, strict=True))
    )


def sweep_case(name: str, qlens: list[int], grid: list[tuple[int, ...]], kv_dtype: torch.dtype) -> list[str]:
    """Every configuration of grid on one case; the table's lines (the default, then the 6 fastest)."""
    c = attention_case(qlens, qlens, kv_dtype)
    q, cache, meta, scale = c["q"], c["cache"], c["meta"].varlen, HEAD_DIM**-0.5
    scales = c["scales"] if kv_dtype != torch.bfloat16 else (None, None)
    flops = causal_flops(qlens, qlens)
    n = sum(qlens)
    ref = varlen_attention(q, *cache, meta, scale, *scales)[:n].float()
    t_default = bench(lambda: varlen_attention(q, *cache, meta, scale, *scales))
    results: list[tuple[float, str]] = []
    for bm, bn, warps, stages in grid:
        label = f"BLOCK_M {bm:3d} BLOCK_N {bn:3d} warps {warps} stages {stages}"

        def fn(bm: int = bm, bn: int = bn, warps: int = warps, stages: int = stages) -> torch.Tensor:
            return varlen_attention(
                q, *cache, meta, scale, *scales, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages
            )

        try:
            diff = (fn()[:n].float() - ref).abs().max().item()
            t = bench(fn)
        except Exception as exc:  # a configuration past the shared memory or registers
            print(f"{name} | {label} | failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        text = f"{t * 1e3:8.1f} us {flops / t / 1e9:6.1f} TFLOP/s x{t_default / t:4.2f} diff {diff:.1e}"
        print(f"{name} | {label} | {text}", flush=True)
        results.append((t, f"| {name} | {label} | {text} |"))
    head = f"| {name} | engine default | {t_default * 1e3:8.1f} us {flops / t_default / 1e9:6.1f} TFLOP/s |"
    return [head] + [text for _, text in sorted(results)[:6]]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--block-m", default="64,128,256")
    parser.add_argument("--block-n", default="32,64,128")
    parser.add_argument("--warps", default="4,8")
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--cases", default="chunk,8x1024,32x256", help="chunk and/or NxLEN prompts")
    parser.add_argument("--kv-cache-dtype", default="bf16", choices=["bf16", "fp8_e4m3"])
    args = parser.parse_args()
    kv_dtype = torch.bfloat16 if args.kv_cache_dtype == "bf16" else torch.float8_e4m3fn
    cases: list[tuple[str, list[int]]] = []
    for case in args.cases.split(","):
        if case == "chunk":
            chunk = first_chunk()
            cases.append(
                (f"256-request run's first chunk ({len(chunk)} prompts, {sum(chunk)} tokens)", chunk)
            )
        else:
            count, length = map(int, case.split("x"))
            cases.append((f"{count} x {length}", [length] * count))
    grid = list(
        itertools.product(
            *(map(int, getattr(args, k).split(",")) for k in ("block_m", "block_n", "warps", "stages"))
        )
    )
    lines: list[str] = []
    for name, qlens in cases:
        lines += sweep_case(f"{name} {args.kv_cache_dtype}", qlens, grid, kv_dtype)
    print("\n| case | configuration | time |\n|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
