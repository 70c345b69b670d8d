"""Skinny decode GEMMs on the GPU (9..64 rows): the path the model runs now (cuBLAS F.linear after
the separate triton_ops add+RMSNorm / SiLU*mul kernels) against triton_skinny's fused kernels, per
projection of Qwen2.5-0.5B and Llama-3.1-8B at M = 32 (and 16 / 64 for a few), with a sweep of up to
12 launch configs per shape.

Each timing is a CUDA graph of >= 20 back-to-back launches, so launch gaps count as they do in the
engine's decode graph; the launches cycle through copies of the weights (>= 256 MB in all) so that L2
does not hold a weight read by the previous launch, as in a real decode step (every other layer's
weights pass through L2 in between). Every config is checked against F.linear on the current path's
output before it is timed (max error relative to the largest output; a wrong config is not timed).
"TB/s" is weight bytes / time. The sweep stops at --budget-s; what it skipped is listed. The last
block prints, per shape, the best config as a line to paste into triton_skinny.TUNED.

    PYTHONPATH=<dir holding llmdeploy_engine> python benchmarks/gpu_skinny.py [--shapes 8b-] [--budget-s 75]
    TRITON_INTERPRET=1 PYTHONPATH=... python benchmarks/gpu_skinny.py --device cpu --quick   # dry run

(The interpreter needs numpy < 2.4 on the path: it converts 1-element arrays to loop bounds.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine

import_engine()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from llmdeploy_engine import ops, triton_skinny  # noqa: E402
from llmdeploy_engine.triton_skinny import SkinnyConfig  # noqa: E402

EPS = 1e-6
EVICT_BYTES = 256 << 20
MAX_CONFIGS = 12
SMEM_BYTES = 224 * 1024  # leave configs whose pipeline stages cannot fit in an H200 SM's 227 KB
NUM_LAYERS = {"0.5b": 24, "8b": 32}


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # "norm": add + RMSNorm + GEMM, "plain": GEMM, "silu": SiLU * up + GEMM
    n: int
    k: int
    rows: int
    bias: bool = False


def model_shapes() -> list[Shape]:
    """The 8B's projections first (the FP8-KV benchmark's 32 sequences), then the 0.5B's, then the
    other row counts."""
    shapes = []
    for model, hidden, qkv, inter, bias in [
        ("8b", 4096, 6144, 14336, False),
        ("0.5b", 896, 1152, 4864, True),
    ]:
        shapes += [
            Shape(f"{model}-qkv", "norm", qkv, hidden, 32, bias),
            Shape(f"{model}-o_proj", "plain", hidden, hidden, 32),
            Shape(f"{model}-gate_up", "norm", 2 * inter, hidden, 32),
            Shape(f"{model}-down", "silu", hidden, inter, 32),
        ]
    for rows in (16, 64):
        shapes += [
            Shape("8b-qkv", "norm", 6144, 4096, rows),
            Shape("8b-gate_up", "norm", 28672, 4096, rows),
            Shape("8b-down", "silu", 4096, 14336, rows),
        ]
    shapes.append(Shape("0.5b-qkv", "norm", 1152, 896, 64, True))
    return shapes


def shrink(s: Shape) -> Shape:
    """The interpreter's dry-run version of a shape (K a multiple of 8, as the kernels require)."""
    return replace(s, n=max(24, s.n // 256), k=max(32, s.k // 32 // 8 * 8))


class Case:
    """One shape's tensors: weight copies to cycle through, the activations, and both paths."""

    def __init__(self, s: Shape, dtype: torch.dtype, device: torch.device, evict_bytes: int) -> None:
        self.s = s
        gen = torch.Generator(device=device).manual_seed(s.n + s.k + s.rows)
        self.w_bytes = s.n * s.k * torch.finfo(dtype).bits // 8
        self.copies = max(1, min(200, math.ceil(evict_bytes / self.w_bytes)))
        self.w = [
            (torch.randn(s.n, s.k, generator=gen, device=device) * s.k**-0.5).to(dtype)
            for _ in range(self.copies)
        ]
        self.bias = torch.randn(s.n, generator=gen, device=device).to(dtype) if s.bias else None
        self.h = torch.randn(s.rows, s.k, generator=gen, device=device).to(dtype)
        self.res = torch.randn(s.rows, s.k, generator=gen, device=device).to(dtype)
        self.norm_w = (1 + 0.1 * torch.randn(s.k, generator=gen, device=device)).to(dtype)
        self.gate_up = torch.randn(s.rows, 2 * s.k, generator=gen, device=device).to(dtype)

    def current(self, i: int) -> torch.Tensor:
        """What the model runs now: the separate norm / SiLU kernel, then cuBLAS."""
        s, w = self.s, self.w[i % self.copies]
        if s.kind == "plain":
            return F.linear(self.h, w)
        if s.kind == "silu":
            gate, up = self.gate_up.split(s.k, dim=-1)
            return F.linear(ops.silu_mul(gate, up), w)
        normed, _ = ops.add_rms_norm(self.h, self.res, self.norm_w, EPS)
        return F.linear(normed, w, self.bias)

    def fused(self, i: int, cfg: SkinnyConfig) -> torch.Tensor:
        s, w = self.s, self.w[i % self.copies]
        kw = asdict(cfg)
        rstd_epilogue = kw.pop("rstd_epilogue")
        if s.kind == "plain":
            return triton_skinny.linear(self.h, w, **kw)
        if s.kind == "silu":
            return triton_skinny.silu_mul_linear(self.gate_up, w, **kw)
        y, _ = triton_skinny.add_rms_norm_linear(
            self.h, self.res, self.norm_w, EPS, w, self.bias, rstd_epilogue=rstd_epilogue, **kw
        )
        return y


def time_us(fn: Callable[[int], torch.Tensor], copies: int, device: torch.device) -> float:
    """Microseconds a launch: a CUDA graph of back-to-back launches cycling the weight copies."""
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
    graph.replay()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (replays * launches)


def act_tiles(s: Shape) -> int:
    """Activation tiles a pipeline stage loads besides the weight's (h and residual; gate and up)."""
    return 1 if s.kind == "plain" else 2


def candidates(s: Shape, default: SkinnyConfig, quick: bool) -> list[SkinnyConfig]:
    """Up to MAX_CONFIGS configs around the default: column and K tiles, the dot's orientation,
    warps and pipeline depth, and for the norm shapes the one-pass rstd_epilogue; those whose
    stages do not fit in shared memory are left out."""
    bn, bk, st = default.block_n, default.block_k, default.num_stages
    block_m = triton_skinny.block_m_for(s.rows)
    out = [default]
    if s.kind == "norm":
        # one pass over the activations instead of two (their L2 reads rival the weight's bytes)
        out += [replace(default, rstd_epilogue=True), replace(default, rstd_epilogue=True, block_n=bn * 2)]
    out += [
        replace(default, swap_ab=not default.swap_ab),
        replace(default, block_n=bn // 2, block_k=bk * 2),
        replace(default, block_n=bn * 2, block_k=bk // 2),
        replace(default, block_k=bk * 2),
        replace(default, block_k=bk // 2, num_stages=st + 2),
        replace(default, num_stages=st + 1),
        replace(default, num_stages=max(2, st - 1)),
        replace(default, num_warps=8),
        replace(default, block_n=max(64, bn), swap_ab=True),
        replace(default, block_n=max(64, bn), swap_ab=True, num_warps=8),
        replace(default, block_n=bn // 2, swap_ab=not default.swap_ab),
        replace(default, block_n=bn * 2, num_warps=8),
    ]
    kept = [default]
    for c in out[1:]:
        smem = triton_skinny.pipeline_bytes(block_m, c, act_tiles(s))
        k_pow2 = 1 << (s.k - 1).bit_length()
        if c.block_n >= 16 and 16 <= c.block_k <= k_pow2 and smem <= SMEM_BYTES and c not in kept:
            kept.append(c)
    return kept[: 3 if quick else MAX_CONFIGS]


def fmt(c: SkinnyConfig) -> str:
    return (
        f"SkinnyConfig(block_n={c.block_n}, block_k={c.block_k}, num_warps={c.num_warps}, "
        f"num_stages={c.num_stages}, swap_ab={c.swap_ab}"
        + (", rstd_epilogue=True)" if c.rstd_epilogue else ")")
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="small shapes, 3 configs each (the CPU dry run)")
    p.add_argument("--shapes", default="", help="only shapes whose name starts with this (e.g. 8b-)")
    p.add_argument("--rows", default="", help="only these row counts, comma-separated (e.g. 32)")
    p.add_argument("--budget-s", type=float, default=75.0, help="stop sweeping after this long")
    p.add_argument("--no-sweep", action="store_true", help="current path and default config only")
    p.add_argument("--out", default="", help="directory for gpu_skinny.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    tol = 1e-4 if cpu else 2e-2
    shapes = [s for s in model_shapes() if s.name.startswith(args.shapes)]
    if args.rows:
        wanted = {int(r) for r in args.rows.split(",")}
        shapes = [s for s in shapes if s.rows in wanted]
    if args.quick or cpu:
        shapes = [shrink(s) for s in shapes]
    if not shapes:
        raise SystemExit(f"no shape matches --shapes {args.shapes!r} --rows {args.rows!r}")
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if not cpu else 132
    name = torch.cuda.get_device_name(device) if not cpu else "cpu (interpreter)"
    print(f"device {name}, {dtype}, {num_sms} SMs", flush=True)

    results: dict[tuple[str, int], dict[str, object]] = {}
    cases: dict[tuple[str, int], Case] = {}

    def check(case: Case, cfg: SkinnyConfig) -> float:
        want = case.current(0).float()
        got = case.fused(0, cfg).float()
        return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))

    def label(s: Shape) -> str:
        return f"{s.name:14s} M={s.rows:<2d}"

    print("\n== current path vs fused kernel (default config) ==", flush=True)
    for s in shapes:
        key = (s.name, s.rows)
        try:
            case = Case(s, dtype, device, 0 if cpu else EVICT_BYTES)
            cases[key] = case
            default = triton_skinny.default_config(s.rows, s.n, s.k, num_sms, act_tiles(s))
            err = check(case, default)
            cur = time_us(case.current, case.copies, device)
            fus = time_us(lambda i, c=case, d=default: c.fused(i, d), case.copies, device)
            results[key] = {"current": cur, "default": fus, "default_cfg": default, "err": err}
            flag = "" if err < tol else "  WRONG"
            print(
                f"{label(s)} {s.kind:5s} [{s.n} x {s.k}] current {cur:8.2f} us "
                f"({case.w_bytes / cur / 1e6:4.2f} TB/s)  fused {fus:8.2f} us "
                f"({case.w_bytes / fus / 1e6:4.2f} TB/s, x{cur / fus:4.2f})  err {err:.1e}{flag}  {fmt(default)}",
                flush=True,
            )
        except Exception as exc:
            traceback.print_exc()
            print(f"{label(s)} FAILED: {type(exc).__name__}: {exc}", flush=True)
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
            default = res["default_cfg"]
            assert isinstance(default, SkinnyConfig)
            best_cfg, best_us = default, float(res["default"])  # type: ignore[arg-type]
            if float(res["err"]) >= tol:  # type: ignore[arg-type]
                best_us = math.inf  # a wrong default is no baseline
            exact_cfg, exact_us = best_cfg, best_us  # the best with ops.rms_norm's exact roundings
            for cfg in candidates(s, default, args.quick or cpu)[1:]:
                if time.perf_counter() - t0 > args.budget_s:
                    skipped.append(f"{s.name} M={s.rows} (part)")
                    break
                try:
                    err = check(case, cfg)
                    if err >= tol:
                        print(f"  {label(s)} {fmt(cfg)}  err {err:.1e} WRONG: not timed", flush=True)
                        continue
                    us = time_us(lambda i, c=case, g=cfg: c.fused(i, g), case.copies, device)
                except Exception as exc:
                    print(f"  {label(s)} {fmt(cfg)}  FAILED: {type(exc).__name__}: {exc}", flush=True)
                    continue
                print(
                    f"  {label(s)} {fmt(cfg)}  {us:8.2f} us  {case.w_bytes / us / 1e6:5.2f} TB/s  err {err:.1e}",
                    flush=True,
                )
                if us < best_us:
                    best_cfg, best_us = cfg, us
                if not cfg.rstd_epilogue and us < exact_us:
                    exact_cfg, exact_us = cfg, us
            if math.isfinite(best_us):
                res["best"], res["best_cfg"] = best_us, best_cfg
            if math.isfinite(exact_us):
                res["exact"], res["exact_cfg"] = exact_us, exact_cfg
            if not cpu:
                torch.cuda.empty_cache()

    print("\n== summary (us a launch; TB/s = weight bytes / best time) ==", flush=True)
    print(
        f"{'shape':14s} {'M':>2s} {'current':>9s} {'default':>9s} {'exact':>9s} {'best':>9s} {'TB/s':>6s} "
        f"{'speed-up':>8s}  (exact: best with ops.rms_norm's roundings; best: rstd_epilogue allowed)"
    )
    for s in shapes:
        res = results.get((s.name, s.rows))
        if res is None:
            print(f"{s.name:14s} {s.rows:2d} FAILED")
            continue
        cur, dflt = float(res["current"]), float(res["default"])  # type: ignore[arg-type]
        best = float(res.get("best", dflt))  # type: ignore[arg-type]
        exact = float(res.get("exact", dflt))  # type: ignore[arg-type]
        tbs = cases[(s.name, s.rows)].w_bytes / best / 1e6
        print(
            f"{s.name:14s} {s.rows:2d} {cur:9.2f} {dflt:9.2f} {exact:9.2f} {best:9.2f} {tbs:6.2f} {cur / best:7.2f}x"
        )
    # per decode step: the four projections of every layer (the current path's times include the
    # separate add+RMSNorm and SiLU*mul launches the fused kernels remove)
    for model, num_layers in NUM_LAYERS.items():
        for rows in sorted({s.rows for s in shapes}):
            per = [results.get((f"{model}-{n}", rows)) for n in ("qkv", "o_proj", "gate_up", "down")]
            if any(r is None for r in per):
                continue
            cur_ms = sum(float(r["current"]) for r in per if r) * num_layers / 1e3  # type: ignore[arg-type]
            best_ms = sum(float(r.get("best", r["default"])) for r in per if r) * num_layers / 1e3  # type: ignore[arg-type]
            print(
                f"{model} M={rows} per step ({num_layers} layers, projections + norms + SiLU*mul): "
                f"current {cur_ms:.3f} ms, fused {best_ms:.3f} ms, saves {cur_ms - best_ms:.3f} ms"
            )

    print("\n== best configs for triton_skinny.TUNED (key: (N, K, BLOCK_M)) ==")
    print("# the best with exact norm roundings; a commented line follows where rstd_epilogue was faster")
    for s in shapes:
        res = results.get((s.name, s.rows))
        if res is None or "exact_cfg" not in res:
            continue
        key = (s.n, s.k, triton_skinny.block_m_for(s.rows))
        cfg, us = res["exact_cfg"], float(res["exact"])  # type: ignore[arg-type]
        assert isinstance(cfg, SkinnyConfig)
        print(f"    {key}: {fmt(cfg)},  # {s.name} M={s.rows}, {us:.2f} us")
        best = res.get("best_cfg")
        if isinstance(best, SkinnyConfig) and best.rstd_epilogue:
            print(f"    # {key}: {fmt(best)},  # {float(res['best']):.2f} us (rstd_epilogue)")  # type: ignore[arg-type]
    if skipped:
        print(f"\nskipped (budget {args.budget_s:.0f} s): {', '.join(skipped)}")
    if args.out:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        rows_json = []
        for (shape_name, rows), res in results.items():
            entry = {"shape": shape_name, "rows": rows}
            for k, v in res.items():
                entry[k] = asdict(v) if isinstance(v, SkinnyConfig) else v
            rows_json.append(entry)
        (out_dir / "gpu_skinny.json").write_text(json.dumps({"device": name, "results": rows_json}, indent=1))
    print(f"\ntotal {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
