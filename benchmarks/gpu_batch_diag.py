"""Where the 8B's 256-request decode steps spend their time, kernel by kernel (issue 6, v10).

Two parts, one GPU, no engine:

- `gemm`: the Llama-3.1-8B projections (qkv, o_proj, gate_up, down, lm_head) at the row counts the
  throughput run's decode graphs replay (and an 8,192-token prefill chunk): cuBLAS as the engine calls
  it (F.linear), cuBLASLt (torch's preferred BLAS library switched), and a Triton GEMM with a small
  sweep of tiles (weights read as [N, K] rows, tl.dot on the tensor cores; programs of one weight
  tile adjacent so the other row tiles read it from L2; split-K through float32 atomics where few
  tiles would leave SMs idle), and the transposed product W @ x^T through cuBLAS (its row count as
  cuBLAS's N: another kernel choice), alone and with the transpose copied back (v16). Each cell is a CUDA graph of back-to-back calls cycling through copies
  of the weight (>= 256 MB in all, so L2 never holds the previous call's weight); median of 7
  replays. Every Triton config is checked against cuBLAS before it is timed.
- `attention`: one layer's paged decode (32 query / 8 KV heads, head_dim 128, block 16) over the
  sequences still running at decode steps 150, 300, 500 and 700 of the throughput workload (inputs
  and outputs uniform in [100, 1024], seeds 0 and 1, as gpu_bench.py draws them), padded to the
  graph's batch size and context bucket as CudaGraphRunner pads them. Rows in admission order or
  longest context first, the grid with sequences or KV heads fastest, blocks in a row or shuffled,
  RoPE and the new token's store fused in the kernel or run before it, and the fused kernel right
  after a gate_up GEMM in the same graph (the GEMM's own time subtracted). "TB/s" counts the K/V
  bytes each real sequence must read; each line ends with the SM clock and board power read then
  (gpu_bench.gpu_clock).

    PYTHONPATH=<dir holding llmdeploy_engine> python3 benchmarks/gpu_batch_diag.py [--parts gemm,attention]
    TRITON_INTERPRET=1 PYTHONPATH=... python benchmarks/gpu_batch_diag.py --device cpu --quick  # dry run
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine

import_engine()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gpu_bench import gpu_clock  # noqa: E402
from llmdeploy_engine.facts import cuda_graph_batch_sizes, cuda_graph_context_buckets  # noqa: E402
from llmdeploy_engine.kernels import ops  # noqa: E402
from llmdeploy_engine.kernels import triton_attention as ta  # noqa: E402

START = time.perf_counter()
EVICT_BYTES = 256 << 20
# Llama-3.1-8B: name -> (N, K) of the weight
SHAPES = {
    "qkv": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}
ROWS = (16, 64, 128, 208, 256, 8192)
# (BM, BN, BK, warps, stages, split_k)
TRITON_CONFIGS = [
    (64, 64, 128, 4, 4, 1),
    (64, 128, 64, 4, 4, 1),
    (64, 128, 128, 4, 3, 1),
    (64, 256, 64, 4, 3, 1),
    (128, 64, 64, 4, 4, 1),
    (128, 128, 64, 8, 4, 1),
    (128, 128, 128, 8, 3, 1),
    (128, 256, 64, 8, 3, 1),
    (64, 64, 128, 4, 4, 2),
    (64, 128, 64, 4, 4, 2),
    (128, 128, 64, 8, 4, 2),
    (64, 64, 128, 4, 4, 4),
]
RESULTS: dict[str, Any] = {"gemm": [], "attention": []}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


@triton.jit
def _gemm_kernel(
    a_ptr, w_ptr, c_ptr, M, N, K, stride_am, stride_wn, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    """c[M, N] = a[M, K] @ w[N, K].T; N % BN == 0 and K % (BK * SPLIT_K) == 0. Row tiles fastest, so
    the programs that read one weight tile run together. SPLIT_K > 1: c is float32, zeroed, summed
    with atomics."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    split = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k_len = K // SPLIT_K
    a = a_ptr + rm[:, None].to(tl.int64) * stride_am + (split * k_len + rk)[None, :]
    w = w_ptr + rn[:, None].to(tl.int64) * stride_wn + (split * k_len + rk)[None, :]
    acc = tl.zeros((BM, BN), tl.float32)
    for _ in tl.range(0, k_len // BK, num_stages=STAGES):
        x = tl.load(a, mask=rm[:, None] < M, other=0.0)
        y = tl.load(w)
        acc = tl.dot(x, tl.trans(y), acc)
        a += BK
        w += BK
    c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    if SPLIT_K == 1:
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=rm[:, None] < M)
    else:
        tl.atomic_add(c, acc, mask=rm[:, None] < M, sem="relaxed")


def triton_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: tuple[int, ...],
                  acc32: torch.Tensor | None) -> None:  # fmt: skip
    bm, bn, bk, warps, stages, split = cfg
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(m, bm) * (n // bn), split)
    if split == 1:
        _gemm_kernel[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), BM=bm, BN=bn, BK=bk,
                           STAGES=stages, SPLIT_K=1, num_warps=warps, num_stages=stages)  # fmt: skip
        return
    assert acc32 is not None
    acc32.zero_()
    _gemm_kernel[grid](x, w, acc32, m, n, k, x.stride(0), w.stride(0), acc32.stride(0), BM=bm, BN=bn, BK=bk,
                       STAGES=stages, SPLIT_K=split, num_warps=warps, num_stages=stages)  # fmt: skip
    out.copy_(acc32)


def cublas_call(x: torch.Tensor, ws: list[torch.Tensor], out: torch.Tensor, i: int) -> None:
    torch.matmul(x, ws[i % len(ws)].t(), out=out)


def cublas_t_call(x: torch.Tensor, ws: list[torch.Tensor], out_t: torch.Tensor, out: torch.Tensor | None,
                  i: int) -> None:  # fmt: skip
    """The transposed product W @ x^T ([N, M]; cuBLAS sees the row count as its N), and with `out`
    its transpose copied back to [M, N] as the engine's next op would need it."""
    torch.matmul(ws[i % len(ws)], x.t(), out=out_t)
    if out is not None:
        out.copy_(out_t.t())


def triton_call(x: torch.Tensor, ws: list[torch.Tensor], out: torch.Tensor, cfg: tuple[int, ...],
                acc32: torch.Tensor | None, i: int) -> None:  # fmt: skip
    triton_linear(x, ws[i % len(ws)], out, cfg, acc32)


def time_graph(fn: Callable[[int], None], calls: int, dev: torch.device) -> float:
    """Microseconds per call of fn(i) for i in range(calls), captured in one CUDA graph; median of 7."""
    if dev.type != "cuda":
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        return (time.perf_counter() - t0) / calls * 1e6
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):  # warm-up (compiles, cuBLAS handles) outside the capture
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    del g
    return sorted(times)[3]


def gemm_part(args: argparse.Namespace, dev: torch.device) -> None:
    shapes = {k: v for k, v in SHAPES.items() if k in args.shapes.split(",")}
    rows = (16, 64) if args.quick else tuple(map(int, args.rows.split(","))) if args.rows else ROWS
    configs = [] if args.no_triton else TRITON_CONFIGS[:2] if args.quick else TRITON_CONFIGS
    for name, (n, k) in shapes.items():
        if args.quick:
            n, k = n // 64, k // 32
        copies = max(2, math.ceil(EVICT_BYTES / (n * k * 2))) if dev.type == "cuda" else 1
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        calls = max(copies, 8)
        for m in rows:
            if m > 256 and name == "lm_head":
                continue
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            flops, wbytes = 2 * m * n * k, n * k * 2
            cell: dict[str, Any] = {"shape": name, "m": m, "n": n, "k": k}
            ref = F.linear(x, ws[0]).float()
            for lib in ("cublas", "cublaslt"):
                if dev.type == "cuda":
                    torch.backends.cuda.preferred_blas_library(lib)
                try:
                    us = time_graph(functools.partial(cublas_call, x, ws, out), calls, dev)
                    cell[lib] = us
                except Exception as e:
                    cell[lib] = None
                    log(f"  {name} m={m} {lib}: {type(e).__name__}: {e}")
            if dev.type == "cuda":
                torch.backends.cuda.preferred_blas_library("cublas")
            out_t = torch.empty(n, m, device=dev, dtype=torch.bfloat16)
            cublas_t_call(x, ws, out_t, out, 0)
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, f"W @ x^T differs from F.linear: {err:.2e}"
            cell["cublas_t"] = time_graph(functools.partial(cublas_t_call, x, ws, out_t, None), calls, dev)
            cell["cublas_t_copy"] = time_graph(
                functools.partial(cublas_t_call, x, ws, out_t, out), calls, dev
            )
            best: tuple[float, tuple[int, ...]] | None = None
            for cfg in configs:
                bm, bn, bk, _, _, split = cfg
                if n % bn or k % (bk * split) or (split > 1 and m > 256) or (bm == 128 and m <= 64):
                    continue
                acc32 = torch.empty(m, n, device=dev, dtype=torch.float32) if split > 1 else None
                try:
                    triton_linear(x, ws[0], out, cfg, acc32)
                    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    if err > 2e-2:
                        log(f"  {name} m={m} triton {cfg}: wrong (max rel err {err:.2e}), skipped")
                        continue
                    us = time_graph(functools.partial(triton_call, x, ws, out, cfg, acc32), calls, dev)
                except Exception as e:
                    log(f"  {name} m={m} triton {cfg}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                if best is None or us < best[0]:
                    best = (us, cfg)
            cell["triton"] = best[0] if best else None
            cell["triton_cfg"] = list(best[1]) if best else None
            figs = []
            for key in ("cublas", "cublaslt", "cublas_t", "cublas_t_copy", "triton"):
                us = cell[key]
                figs.append(
                    f"{key} {us:8.1f} us {flops / us / 1e6:6.0f} TF/s {wbytes / us / 1e6:5.2f} TB/s"
                    if us
                    else f"{key} -"
                )
            log(f"  {name:8s} m={m:5d}: " + " | ".join(figs) + f" | best triton {cell['triton_cfg']}")
            RESULTS["gemm"].append(cell)
        del ws


def decode_call(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, bt: torch.Tensor, cl: torch.Tensor,
                heads_fastest: bool, rope: Any, _: int) -> None:  # fmt: skip
    """One paged_decode (RoPE and the store fused when `rope` is a RopeStore)."""
    ta.paged_decode(q, kc, vc, bt, cl, q.shape[-1] ** -0.5, rope=rope, heads_fastest=heads_fastest)


def separate_call(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, bt: torch.Tensor, cl: torch.Tensor,
                  rope: Any, _: int) -> None:  # fmt: skip
    """RoPE and the new token's store in their own kernel, then paged_decode."""
    qr, _k = ops.rope_and_cache(q, rope.k, rope.v, rope.cos, rope.sin, (kc, vc), rope.slots)
    ta.paged_decode(qr, kc, vc, bt, cl, q.shape[-1] ** -0.5)


def gemm_call(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, _: int) -> None:
    torch.matmul(x, w.t(), out=y)


def hot_call(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, q: torch.Tensor, kc: torch.Tensor,
             vc: torch.Tensor, bt: torch.Tensor, cl: torch.Tensor, rope: Any, _: int) -> None:  # fmt: skip
    """A gate_up GEMM, then the fused decode, as in the engine's graph."""
    gemm_call(x, w, y, 0)
    decode_call(q, kc, vc, bt, cl, True, rope, 0)


def attention_part(args: argparse.Namespace, dev: torch.device) -> None:
    heads, kv_heads, head_dim, bs = 32, 8, 128, 16
    if args.quick:
        heads, kv_heads, head_dim = 4, 2, 16
    in_lens = torch.randint(100, 1025, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    out_lens = torch.randint(100, 1025, (256,), generator=torch.Generator().manual_seed(1)).tolist()
    sizes = cuda_graph_batch_sizes(256)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=dev).float() / head_dim))
    for step in (150, 300, 500, 700) if not args.quick else (700,):
        ctx = [i + step for i, o in zip(in_lens, out_lens, strict=True) if o > step]
        if args.quick:
            ctx = [c // 64 + 1 for c in ctx[:6]]
        n = len(ctx)
        size = min(s for s in sizes if s >= n)
        need = -(-max(ctx) // bs)
        nb = min(b for b in cuda_graph_context_buckets(2048 + 1024, bs) if b >= need)
        total_blocks = sum(-(-c // bs) for c in ctx) + 1
        kc = torch.randn(total_blocks, bs, kv_heads, head_dim, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        qkv = torch.randn(size, (heads + 2 * kv_heads) * head_dim, device=dev, dtype=torch.bfloat16)
        q = qkv[:, : heads * head_dim].view(size, heads, head_dim)  # strided, as the QKV output's view
        nk = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(size, kv_heads, head_dim)
        nv = qkv[:, (heads + kv_heads) * head_dim :].view(size, kv_heads, head_dim)
        kv_bytes = sum(ctx) * kv_heads * head_dim * 2 * 2
        gen = torch.Generator().manual_seed(step)
        # block 0 stays the padding block; "contiguous": each sequence's blocks in a row,
        # "shuffled": the same tables over a random permutation of the blocks
        perm = [0, *(torch.randperm(total_blocks - 1, generator=gen) + 1).tolist()]
        orders = ("admission", "longest_first") if step != 300 else ("longest_first",)
        for order in orders:
            idx = list(range(n)) if order == "admission" else sorted(range(n), key=lambda i: -ctx[i])
            for layout in ("contiguous", "shuffled") if order == "longest_first" else ("contiguous",):
                rows, nxt = [], 1
                firsts = {}
                for i in range(n):
                    nblk = -(-ctx[i] // bs)
                    firsts[i] = nxt
                    nxt += nblk
                for i in idx:
                    nblk = -(-ctx[i] // bs)
                    blocks = list(range(firsts[i], firsts[i] + nblk))
                    if layout == "shuffled":
                        blocks = [perm[b] for b in blocks]
                    rows.append(blocks + [0] * (nb - nblk))
                rows += [[0] * nb] * (size - n)
                lens = [ctx[i] for i in idx] + [1] * (size - n)
                bt = torch.tensor(rows, dtype=torch.int64, device=dev)
                cl = torch.tensor(lens, dtype=torch.int32, device=dev)
                last = torch.tensor(
                    [r[(c - 1) // bs] * bs + (c - 1) % bs for r, c in zip(rows, lens, strict=True)],
                    dtype=torch.int64,
                    device=dev,
                )
                cos, sin = ops.rope_tables((cl - 1).long(), inv_freq, torch.bfloat16)
                base = (q, kc, vc, bt, cl)
                variants: dict[str, Callable[[int], None]] = {}
                for hf in (False, True) if layout == "contiguous" else (True,):
                    name = "grid " + ("heads" if hf else "seqs") + " fastest"
                    variants[name] = functools.partial(decode_call, *base, hf, None)
                gemm_us = 0.0
                if order == "longest_first":
                    rope = ta.RopeStore(nk, nv, cos, sin, last)
                    variants["fused RoPE + store"] = functools.partial(decode_call, *base, True, rope)
                    variants["RoPE + store, then decode"] = functools.partial(separate_call, *base, rope)
                    if layout == "contiguous" and dev.type == "cuda":
                        w = torch.randn(28672, 4096, device=dev, dtype=torch.bfloat16) * 0.02
                        x = torch.randn(size, 4096, device=dev, dtype=torch.bfloat16)
                        y = torch.empty(size, 28672, device=dev, dtype=torch.bfloat16)
                        gemm_us = time_graph(functools.partial(gemm_call, x, w, y), 20, dev)
                        variants["fused, after a gate_up GEMM (minus the GEMM alone)"] = functools.partial(
                            hot_call, x, w, y, *base, rope
                        )
                for label, fn in variants.items():
                    us = time_graph(fn, 4 if args.quick else 20, dev)
                    if label.startswith("fused, after"):
                        us -= gemm_us
                    log(
                        f"  step {step}: {n} seqs (graph {size}, {nb} blocks), {order:13s} {layout:10s} "
                        f"{label:52s}: {us:7.1f} us, {kv_bytes / us / 1e6:5.2f} TB/s  [{gpu_clock()}]"
                    )
                    cell = {"step": step, "n": n, "graph_rows": size, "order": order, "layout": layout}
                    RESULTS["attention"].append(
                        {**cell, "variant": label, "us": us, "tb_s": kv_bytes / us / 1e6}
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="gemm,attention")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (a CPU dry run under the interpreter)"
    )
    parser.add_argument("--rows", default=None, help="gemm row counts, comma-separated (default: ROWS)")
    parser.add_argument("--no-triton", action="store_true", help="gemm: cuBLAS layouts only")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for part, fn in (("gemm", gemm_part), ("attention", attention_part)):
        if part in args.parts.split(","):
            log(f"== {part}")
            try:
                fn(args, dev)
            except Exception:
                traceback.print_exc()
    if args.out:
        Path(args.out, "gpu_batch_diag.json").write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
    main()
