"""Decode GEMVs on the GPU: the path the model runs now (ops.add_rms_norm / ops.silu_mul, then
cuBLAS F.linear) against triton_gemv's fused kernels, per projection of Qwen2.5-0.5B and
Llama-3.1-8B at M = 1 (and M = 4 for a few), with a small sweep of launch configs per shape.

Each measurement is a CUDA graph of back-to-back launches, so launch gaps count as in the engine's
decode graph; the launches cycle through copies of the weights (>= 256 MB in all) so that L2 never
holds a weight read by the previous launch, as in a real decode step. Every config is checked
against the current path's output before it is timed (max error relative to the largest output).
"TB/s" is weight bytes / time. The sweep phase stops at --budget-s; what it skipped is listed.

    PYTHONPATH=<dir holding llmdeploy_engine> python benchmarks/gpu_gemv.py [--shapes 8b-] [--budget-s 80]
    TRITON_INTERPRET=1 PYTHONPATH=... python benchmarks/gpu_gemv.py --device cpu --quick   # dry run

(The interpreter needs numpy < 2.4 on the path: it converts 1-element arrays to the loop bounds.)
"""

from __future__ import annotations

import argparse
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from llmdeploy_engine.kernels import ops, triton_gemv
from llmdeploy_engine.kernels.triton_gemv import GemvConfig

EPS = 1e-6
EVICT_BYTES = 256 << 20
MAX_CONFIGS = 12


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # "norm": add + RMSNorm + GEMV, "plain": GEMV, "silu": SiLU * up + GEMV, "head": norm + GEMV to float32
    n: int
    k: int
    rows: int
    bias: bool = False


def model_shapes() -> list[Shape]:
    shapes = []
    for model, hidden, qkv, inter, vocab, bias in [
        ("0.5b", 896, 1152, 4864, 151936, True),
        ("8b", 4096, 6144, 14336, 128256, False),
    ]:
        shapes += [
            Shape(f"{model}-qkv", "norm", qkv, hidden, 1, bias),
            Shape(f"{model}-o_proj", "plain", hidden, hidden, 1),
            Shape(f"{model}-gate_up", "norm", 2 * inter, hidden, 1),
            Shape(f"{model}-down", "silu", hidden, inter, 1),
            Shape(f"{model}-lm_head", "head", vocab, hidden, 1),
        ]
    # Llama-3.1-8B at tensor_parallel_size 2: each rank's half (the LM head's half runs on cuBLAS)
    shapes += [
        Shape("8b-tp2-qkv", "norm", 3072, 4096, 1),
        Shape("8b-tp2-o_proj", "plain", 4096, 2048, 1),
        Shape("8b-tp2-gate_up", "norm", 14336, 4096, 1),
        Shape("8b-tp2-down", "silu", 4096, 7168, 1),
    ]
    shapes += [
        Shape("0.5b-qkv", "norm", 1152, 896, 4, True),
        Shape("0.5b-down", "silu", 896, 4864, 4),
        Shape("8b-gate_up", "norm", 28672, 4096, 4),
        Shape("8b-down", "silu", 4096, 14336, 4),
    ]
    return shapes


def shrink(s: Shape) -> Shape:
    """The interpreter's dry-run version of a shape (K a multiple of 8, as the kernels require)."""
    return replace(s, n=max(8, s.n // 512), k=max(16, s.k // 64 // 8 * 8))


class Case:
    """One shape's tensors: weight copies to cycle through, the activations, both paths."""

    def __init__(self, s: Shape, dtype: torch.dtype, device: torch.device, evict_bytes: int) -> None:
        self.s = s
        gen = torch.Generator(device=device).manual_seed(s.n + s.k)
        w_bytes = s.n * s.k * torch.finfo(dtype).bits // 8
        self.copies = max(1, min(64, math.ceil(evict_bytes / w_bytes)))
        self.w = [
            (torch.randn(s.n, s.k, generator=gen, device=device) * s.k**-0.5).to(dtype)
            for _ in range(self.copies)
        ]
        self.bias = torch.randn(s.n, generator=gen, device=device).to(dtype) if s.bias else None
        self.h = torch.randn(s.rows, s.k, generator=gen, device=device).to(dtype)
        self.res = torch.randn(s.rows, s.k, generator=gen, device=device).to(dtype)
        self.norm_w = (1 + 0.1 * torch.randn(s.k, generator=gen, device=device)).to(dtype)
        self.gate_up = torch.randn(s.rows, 2 * s.k, generator=gen, device=device).to(dtype)
        self.w_bytes = w_bytes

    def current(self, i: int) -> torch.Tensor:
        s, w = self.s, self.w[i % self.copies]
        if s.kind == "plain":
            return F.linear(self.h, w)
        if s.kind == "silu":
            gate, up = self.gate_up.split(s.k, dim=-1)
            return F.linear(ops.silu_mul(gate, up), w)
        normed, _ = ops.add_rms_norm(self.h, self.res, self.norm_w, EPS)
        y = F.linear(normed, w, self.bias)
        return y.float() if s.kind == "head" else y

    def fused(self, i: int, cfg: GemvConfig) -> torch.Tensor:
        s, w = self.s, self.w[i % self.copies]
        kw = asdict(cfg)
        if s.kind == "plain":
            return triton_gemv.linear(self.h, w, **kw)
        if s.kind == "silu":
            return triton_gemv.silu_mul_linear(self.gate_up, w, **kw)
        out_dtype = torch.float32 if s.kind == "head" else None
        y, _ = triton_gemv.add_rms_norm_linear(
            self.h,
            self.res,
            self.norm_w,
            EPS,
            w,
            self.bias,
            out_dtype,
            **kw,
        )
        return y


def time_us(fn: Callable[[int], torch.Tensor], copies: int, device: torch.device) -> float:
    """Microseconds a launch: a CUDA graph of back-to-back launches (cycling the weight copies)."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn(0)
        return (time.perf_counter() - start) * 1e6
    launches = max(20, copies)
    for i in range(min(launches, 3)):
        fn(i)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(0)
        with torch.cuda.graph(graph, stream=stream):
            for i in range(launches):
                fn(i)
    torch.cuda.synchronize()
    replays = max(5, 400 // launches)
    for _ in range(2):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (replays * launches)


def candidates(s: Shape, default: GemvConfig, quick: bool) -> list[GemvConfig]:
    """Up to MAX_CONFIGS configs around the default: the same tile split other ways, tiles twice and
    half the size, the other mode, warps, no prefetch; at M > 1 two tensor-core dots. num_stages is
    left alone outside the dot (Triton's pipeliner leaves these loops unchanged: same PTX)."""
    bn, bk = default.block_n, default.block_k
    block_m = 1 << (s.rows - 1).bit_length()
    out = [
        default,
        replace(default, block_n=max(1, bn // 2), block_k=bk * 2),
        replace(default, block_n=bn * 2, block_k=max(32, bk // 2)),
        replace(default, block_k=bk * 2),
        replace(default, block_k=max(32, bk // 2)),
        replace(default, block_n=bn * 2),
        replace(default, block_n=max(1, bn // 2)),
        replace(default, mode="reduce" if default.mode == "defer" else "defer"),
        replace(default, num_warps=8),
        replace(default, num_warps=2),
        replace(default, prefetch=not default.prefetch),
        replace(default, block_n=bn * 2, num_warps=8),
    ]
    if s.rows > 1:
        out.insert(1, GemvConfig(block_n=16, block_k=128, num_warps=4, num_stages=3, mode="dot"))
        out.insert(2, GemvConfig(block_n=32, block_k=128, num_warps=4, num_stages=3, mode="dot"))
    kept: list[GemvConfig] = []
    for c in out:
        # registers: the tile path's "defer" keeps [M, BLOCK_N, BLOCK_K] products, the others a tile
        tile = c.block_n * c.block_k * (block_m if c.mode == "defer" else 1)
        if c not in kept and tile <= 16384 and c.block_k <= 1 << (s.k - 1).bit_length():
            kept.append(c)
    return kept[: 3 if quick else MAX_CONFIGS]


def fmt(c: GemvConfig) -> str:
    return (
        f"GemvConfig(block_n={c.block_n}, block_k={c.block_k}, num_warps={c.num_warps}, "
        f"num_stages={c.num_stages}, mode={c.mode!r}, prefetch={c.prefetch})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="small shapes, 3 configs each (the CPU dry run)")
    p.add_argument("--shapes", default="", help="only shapes whose name starts with this (e.g. 8b-)")
    p.add_argument("--budget-s", type=float, default=80.0, help="stop sweeping after this long")
    p.add_argument("--no-sweep", action="store_true", help="current path and default config only")
    args = p.parse_args()
    t0 = time.perf_counter()
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    tol = 1e-4 if cpu else 2e-2
    shapes = [s for s in model_shapes() if s.name.startswith(args.shapes)]
    if args.quick or cpu:
        shapes = [shrink(s) for s in shapes]
    if not shapes:
        raise SystemExit(f"no shape name starts with {args.shapes!r}")
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if not cpu else 132
    print(
        f"device {torch.cuda.get_device_name(device) if not cpu else 'cpu'}, {dtype}, {num_sms} SMs",
        flush=True,
    )

    results: dict[tuple[str, int], dict[str, object]] = {}
    cases: dict[tuple[str, int], Case] = {}

    def check(case: Case, cfg: GemvConfig) -> float:
        want = case.current(0).float()
        got = case.fused(0, cfg).float()
        return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))

    print("\n== current path vs fused kernel (default config) ==", flush=True)
    for s in shapes:
        key = (s.name, s.rows)
        try:
            case = Case(s, dtype, device, 0 if cpu else EVICT_BYTES)
            cases[key] = case
            default = triton_gemv.default_config(s.rows, s.n, s.k, num_sms)
            err = check(case, default)
            cur = time_us(case.current, case.copies, device)
            fus = time_us(lambda i, c=case, d=default: c.fused(i, d), case.copies, device)
            results[key] = {"current": cur, "default": fus, "default_cfg": default, "err": err}
            tbs = case.w_bytes / fus / 1e6
            flag = "" if err < tol else "  WRONG"
            print(
                f"{s.name:14s} M={s.rows} {s.kind:5s} [{s.n} x {s.k}] current {cur:8.2f} us  fused {fus:8.2f} us "
                f"({tbs:5.2f} TB/s, x{cur / fus:4.2f})  err {err:.1e}{flag}  {fmt(default)}",
                flush=True,
            )
        except Exception as exc:
            traceback.print_exc()
            print(f"{s.name:14s} M={s.rows} FAILED: {type(exc).__name__}: {exc}", flush=True)
        finally:
            if not cpu:
                torch.cuda.empty_cache()

    skipped: list[str] = []
    if not args.no_sweep:
        print("\n== sweep ==", flush=True)
        for s in shapes:
            key = (s.name, s.rows)
            if key not in results:
                continue
            if time.perf_counter() - t0 > args.budget_s:
                skipped.append(f"{s.name} M={s.rows}")
                continue
            case, res = cases[key], results[key]
            best_cfg, best_us = res["default_cfg"], float(res["default"])  # type: ignore[arg-type]
            for cfg in candidates(s, best_cfg, args.quick or cpu)[1:]:  # type: ignore[arg-type]
                if time.perf_counter() - t0 > args.budget_s:
                    skipped.append(f"{s.name} M={s.rows} (part)")
                    break
                try:
                    err = check(case, cfg)
                    if err >= tol:
                        print(
                            f"  {s.name:14s} M={s.rows} {fmt(cfg)}  err {err:.1e} WRONG: not timed",
                            flush=True,
                        )
                        continue
                    us = time_us(lambda i, c=case, g=cfg: c.fused(i, g), case.copies, device)
                except Exception as exc:
                    print(
                        f"  {s.name:14s} M={s.rows} {fmt(cfg)}  FAILED: {type(exc).__name__}: {exc}",
                        flush=True,
                    )
                    continue
                print(
                    f"  {s.name:14s} M={s.rows} {fmt(cfg)}  {us:8.2f} us  "
                    f"{case.w_bytes / us / 1e6:5.2f} TB/s  err {err:.1e}",
                    flush=True,
                )
                if us < best_us:
                    best_cfg, best_us = cfg, us
            res["best"], res["best_cfg"] = best_us, best_cfg
            if not cpu:
                torch.cuda.empty_cache()

    print("\n== summary (us a launch; TB/s = weight bytes / time) ==", flush=True)
    print(f"{'shape':14s} {'M':>2s} {'current':>9s} {'fused':>9s} {'best':>9s} {'TB/s':>6s} {'speed-up':>8s}")
    total_cur = total_best = 0.0
    for s in shapes:
        res = results.get((s.name, s.rows))
        if res is None:
            print(f"{s.name:14s} {s.rows:2d} FAILED")
            continue
        cur, dflt = float(res["current"]), float(res["default"])  # type: ignore[arg-type]
        best = float(res.get("best", dflt))  # type: ignore[arg-type]
        total_cur, total_best = total_cur + cur, total_best + best
        tbs = cases[(s.name, s.rows)].w_bytes / best / 1e6
        print(f"{s.name:14s} {s.rows:2d} {cur:9.2f} {dflt:9.2f} {best:9.2f} {tbs:6.2f} {cur / best:7.2f}x")
    print(f"{'all rows':14s}    {total_cur:9.2f} {'':9s} {total_best:9.2f}")
    # per decode token at M = 1: the four projections of every layer plus the LM head (the fused
    # path also drops the separate add+RMSNorm and SiLU*mul launches, counted in "current")
    for model, num_layers in (("0.5b", 24), ("8b", 32)):
        per = {n: results.get((f"{model}-{n}", 1)) for n in ("qkv", "o_proj", "gate_up", "down", "lm_head")}
        if any(r is None for r in per.values()):
            continue
        cur_ms = best_ms = 0.0
        for n, r in per.items():
            times = num_layers if n != "lm_head" else 1
            cur_ms += times * float(r["current"]) / 1e3  # type: ignore[arg-type,index]
            best_ms += times * float(r.get("best", r["default"])) / 1e3  # type: ignore[arg-type,union-attr,index]
        print(
            f"{model} per token, projections + norms + SiLU*mul: current {cur_ms:.3f} ms, fused {best_ms:.3f} ms"
        )
    print("\n== best configs for triton_gemv.TUNED (key: (N, K, row bucket)) ==")
    for s in shapes:
        res = results.get((s.name, s.rows))
        if res is not None and "best_cfg" in res:
            bucket = 1 if s.rows == 1 else 4 if s.rows <= 4 else 8
            print(f"    ({s.n}, {s.k}, {bucket}): {fmt(res['best_cfg'])},  # {s.name}")  # type: ignore[arg-type]
    if skipped:
        print(f"\nnot swept (budget {args.budget_s:.0f} s): {', '.join(skipped)}")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
