"""Sweep of the paged decode kernel's configurations over fp8 and bf16 KV caches (issue 6, item 4).

The target: one layer of Llama-3.1-8B (32 query heads, 8 KV heads, head_dim 128, block_size 16),
32 sequences x 8,000 cached tokens, one decode token each; kernel only (`paged_decode`, no KV
write). Every cell is the median of `triton.testing.do_bench` and carries its output's relative
difference (2-norm) from a float32 reference computed on the GPU from the dequantized cache (the
same inputs: a wrong cell shows a large "err"). "GB/s" counts the K/V bytes that must be read once.

Rows: the bf16 cache's default and a few configurations; fp8 (e4m3) tile / warps / pipeline stages /
conversion ("to": Triton's `.to()`; "v": V tiles through the cvt helper; "kv": K and V) / softmax
sums at the end, each at one or more split counts; e5m2 with the default and the best e4m3 cell;
then the defaults (and half / double the chosen split count) at 16, 8, 4 and 1 x 8k and 256 x 2k;
last, 4-token verification (varlen_attention, 16 rows a program) over bf16 and e4m3 ("v" / "to").
With `--baseline FILE` (a copy of an earlier engine/triton_attention.py) its paged_decode is timed
too, on the same inputs. The table is printed last; `--max-s` stops the sweep early (the table
shows what ran).

    PYTHONPATH=<dir holding llmdeploy_engine> python3 benchmarks/gpu_fp8_sweep.py [--baseline F]

CPU dry run of the script itself (Triton's interpreter, tiny sizes, times meaningless):
`TRITON_INTERPRET=1 python benchmarks/gpu_fp8_sweep.py --device cpu --quick`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
import triton  # noqa: E402
import triton.testing  # noqa: E402
from llmdeploy_engine.kernels import triton_attention as ta  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BS = 32, 8, 128, 16
DEV = torch.device("cuda")  # --device cpu: the interpreter dry run
START = time.perf_counter()
ROWS: list[tuple[str, str]] = []
E4M3, E5M2, BF16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16

# (tile, warps, stages, conversion, softmax sums at the end, split counts) timed over the e4m3 cache
# at 32 x 8k. Run 1 (benchmarks/results/gpu_fp8_sweep_run1.log) timed the first set of candidates;
# these are the ones it left open: 2 or 3 programs an SM (5 or 4 stages), one- and two-warp
# programs (no cross-warp softmax reductions, more programs an SM), sums at the end.
FP8_CONFIGS = [
    (128, 4, 5, "v", False, (1, 2)),
    (128, 4, 5, "v", True, (1, 2)),
    (128, 4, 4, "v", False, (1, 2)),
    (128, 4, 4, "v", True, (1, 2)),
    (128, 4, 3, "v", True, (1,)),
    (32, 1, 4, "v", True, (2, 4, 8)),
    (32, 1, 3, "v", False, (4,)),
    (64, 2, 4, "v", True, (1, 2, 4)),
    (64, 2, 5, "v", True, (2,)),
    (32, 2, 4, "v", True, (2, 4)),
    (64, 4, 5, "v", True, (1, 2)),
    (128, 4, 5, "to", True, (1,)),
    (256, 8, 5, "v", True, (1,)),
]
BF16_CONFIGS = [(64, 4, 3), (64, 4, 5), (32, 4, 5)]


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


def bench(fn: Callable[[], Any]) -> float:
    if DEV.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


class Case:
    """n sequences of ctx cached tokens in shuffled blocks, a bf16 query, per-tensor fp8 scales."""

    def __init__(self, n: int, ctx: int, dtype: torch.dtype, table_tokens: int | None = None) -> None:
        gen = torch.Generator(device=DEV).manual_seed(n * 7 + ctx)
        per_seq = -(-(table_tokens or ctx) // BS)
        num_blocks = n * per_seq + 1
        perm = torch.randperm(num_blocks, device=DEV, generator=gen)
        self.tables = perm[: n * per_seq].view(n, per_seq)  # int64, as the engine passes them
        self.lengths = torch.full((n,), ctx, device=DEV, dtype=torch.int64)
        shape = (num_blocks, BS, KV_HEADS, HEAD_DIM)
        k = torch.randn(shape, device=DEV, generator=gen)
        v = torch.randn(shape, device=DEV, generator=gen)
        self.q = torch.randn(n, HEADS, HEAD_DIM, device=DEV, generator=gen).to(BF16)
        if dtype in (E4M3, E5M2):
            top = torch.finfo(dtype).max
            # scales that use the format's range: max |x| of a unit normal over ~1e9 values is ~6
            self.k_scale = torch.tensor([6.0 / top], device=DEV)
            self.v_scale = torch.tensor([6.0 / top], device=DEV)
            self.kc = (k / self.k_scale).clamp(-top, top).to(dtype)
            self.vc = (v / self.v_scale).clamp(-top, top).to(dtype)
        else:
            self.k_scale = self.v_scale = None
            self.kc, self.vc = k.to(dtype), v.to(dtype)
        del k, v
        self.n, self.ctx, self.dtype = n, ctx, dtype
        self.bytes = n * ctx * KV_HEADS * HEAD_DIM * 2 * self.kc.element_size()
        self.ref = self.reference()

    def reference(self) -> torch.Tensor:
        """float32 attention over the dequantized cache, one sequence at a time."""
        out = torch.empty(self.n, HEADS, HEAD_DIM, device=DEV)
        ks = float(self.k_scale) if self.k_scale is not None else 1.0
        vs = float(self.v_scale) if self.v_scale is not None else 1.0
        nb = -(-self.ctx // BS)
        for i in range(self.n):
            blocks = self.tables[i, :nb].long()
            k = self.kc[blocks].float().reshape(-1, KV_HEADS, HEAD_DIM)[: self.ctx] * ks
            v = self.vc[blocks].float().reshape(-1, KV_HEADS, HEAD_DIM)[: self.ctx] * vs
            q = self.q[i].float().view(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
            s = torch.einsum("hgd,thd->hgt", q, k) * HEAD_DIM**-0.5
            out[i] = torch.einsum("hgt,thd->hgd", torch.softmax(s, -1), v).reshape(HEADS, HEAD_DIM)
        return out

    def run(self, module: Any = ta, **kw: Any) -> torch.Tensor:
        return module.paged_decode(
            self.q,
            self.kc,
            self.vc,
            self.tables,
            self.lengths,
            HEAD_DIM**-0.5,
            self.k_scale,
            self.v_scale,
            **kw,
        )

    def cell(self, name: str, base_ms: float | None = None, module: Any = ta, **kw: Any) -> tuple[str, float]:
        try:
            out = self.run(module, **kw)
            # poison, then free: the caching allocator hands the same block to the next call's output
            out.fill_(float("nan"))
            del out
            out = self.run(module, **kw)
            if DEV.type == "cuda":
                torch.cuda.synchronize()
            err = float((out.float() - self.ref).norm() / self.ref.norm())
            ms = bench(lambda: self.run(module, **kw))
        except Exception as exc:  # one configuration failing leaves the others' cells
            traceback.print_exc()
            return f"{name}: FAILED {type(exc).__name__}: {str(exc)[:160]}", float("inf")
        ratio = f" | x{base_ms / ms:4.2f} of bf16" if base_ms else ""
        flag = "" if err < 2e-2 else " WRONG"
        text = f"{name}: {ms * 1e3:7.1f} us {self.bytes / ms / 1e6:6.0f} GB/s err {err:.1e}{flag}{ratio}"
        log(text)
        return text, ms


def row(name: str, cells: list[str]) -> None:
    ROWS.append((name, " ; ".join(cells)))


def load_baseline(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("baseline_triton_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_bandwidth() -> float:
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * 2 * 1024**3 / ms / 1e6


def fp8_kw(cfg: tuple[int, int, int, str, bool], splits: int | None = None) -> dict[str, Any]:
    tile, warps, stages, cvt, at_end = cfg
    kw: dict[str, Any] = {"tile": tile, "num_warps": warps, "num_stages": stages, "fp8_cvt": cvt}
    kw["row_sum_at_end"] = at_end
    if splits:
        kw["num_splits"] = splits
    return kw


def verification_cells(n: int) -> list[str]:
    """varlen_attention over n sequences x 4 new tokens at 2,048 cached: bf16 cache, then e4m3 with
    V through the cvt helper ("v", the default up to 32 rows) and with `.to()`."""
    from llmdeploy_engine.kernels.triton_varlen import varlen_attention
    from llmdeploy_engine.model.attention import VarlenMetadata

    cells: list[str] = []
    base_ms = None
    for dtype, cvt in ((BF16, None), (E4M3, "v"), (E4M3, "to")):
        c = Case(n, 2048, dtype)
        q = c.q.repeat_interleave(4, 0)  # 4 query tokens per sequence (same vectors: timing only)
        meta = VarlenMetadata(
            query_start=torch.arange(0, 4 * n, 4, device=DEV, dtype=torch.int32),
            query_len=torch.full((n,), 4, device=DEV, dtype=torch.int32),
            context_len=torch.full((n,), 2048, device=DEV, dtype=torch.int32),
            block_tables=c.tables,
            max_query_len=4,
        )

        def run(c: Case = c, q: torch.Tensor = q, meta: VarlenMetadata = meta, cvt: str | None = cvt) -> Any:
            kw = {} if cvt is None else {"fp8_cvt": cvt}
            return varlen_attention(q, c.kc, c.vc, meta, HEAD_DIM**-0.5, c.k_scale, c.v_scale, **kw)

        try:
            out = run()
            # the last of each sequence's 4 rows sees every key: compare it with the decode reference
            err = float((out[3::4].float() - c.ref).norm() / c.ref.norm())
            ms = bench(run)
        except Exception as exc:
            traceback.print_exc()
            cells.append(f"{dtype} {cvt}: FAILED {type(exc).__name__}: {str(exc)[:160]}")
            continue
        base_ms = base_ms or ms
        text = f"{str(dtype).removeprefix('torch.')} {cvt or ''}: {ms * 1e3:7.1f} us err {err:.1e} x{base_ms / ms:4.2f}"
        log(text)
        cells.append(text)
        del c
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", default=None, help="an earlier triton_attention.py to time as well")
    parser.add_argument("--max-s", type=float, default=190.0, help="stop starting new rows after this")
    parser.add_argument("--ctx", type=int, default=8000)
    parser.add_argument("--table-tokens", type=int, default=8128, help="block-table width in tokens")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--best-out", default=None, help="write the best e4m3 cell's DecodeConfig here (JSON)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (with --device cpu: a dry run)")
    args = parser.parse_args()
    global DEV
    DEV = torch.device(args.device)
    if args.quick:
        args.ctx, args.table_tokens = 300, 320
        del FP8_CONFIGS[2:], BF16_CONFIGS[2:]
    if DEV.type == "cuda":
        log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
        log(f"copy bandwidth (read + write): {copy_bandwidth():.0f} GB/s")
    base = load_baseline(args.baseline) if args.baseline else None
    n, ctx = (2 if args.quick else 32), args.ctx
    log(f"DECODE_CONFIG {ta.DECODE_CONFIG}")

    def over() -> bool:
        return time.perf_counter() - START > args.max_s

    bf = Case(n, ctx, BF16, args.table_tokens)
    text, bf_ms = bf.cell("bf16 default")
    cells = [text]
    if base is not None:
        cells.append(bf.cell("bf16 baseline kernel", bf_ms, base)[0])
    for tile, warps, stages in BF16_CONFIGS[1:]:
        cells.append(
            bf.cell(f"bf16 {tile}/{warps}/{stages}", bf_ms, tile=tile, num_warps=warps, num_stages=stages)[0]
        )
    row(f"bf16 cache {n} x {ctx}", cells)
    del bf

    e4 = Case(n, ctx, E4M3, args.table_tokens)
    cells = [e4.cell("e4m3 default", bf_ms)[0]]
    if base is not None:
        cells.append(e4.cell("e4m3 baseline kernel", bf_ms, base)[0])
    row(f"e4m3 cache {n} x {ctx}: defaults", cells)

    timed: list[tuple[float, tuple[Any, ...]]] = []
    cells = []
    for *cfg, split_counts in FP8_CONFIGS:
        for splits in split_counts:
            if over():
                break
            name = (
                "/".join(str(x) for x in cfg[:4]) + ("/sums-at-end" if cfg[4] else "") + f" splits {splits}"
            )
            text, ms = e4.cell(name, bf_ms, **fp8_kw(tuple(cfg), splits))  # type: ignore[arg-type]
            cells.append(text)
            timed.append((ms, (*cfg, splits)))
    row(f"e4m3 {n} x {ctx}: tile/warps/stages/conversion[/sums at end] splits", cells)
    del e4
    best = [cfg for _, cfg in sorted(timed)[:2]]
    log(f"best e4m3 configurations at {n} x {ctx}: {best}")
    if args.best_out and timed and sorted(timed)[0][0] < float("inf"):
        tile, warps, stages, cvt, at_end, splits = best[0]
        # programs an SM that make choose_num_splits pick `splits` at 32 sequences x 8 KV heads
        config = ta.DecodeConfig(tile, warps, stages, cvt, at_end, 2 * splits, None)
        Path(args.best_out).write_text(json.dumps(vars(config)))
        log(f"wrote {args.best_out}: {config}")

    if not over():
        e5 = Case(n, ctx, E5M2, args.table_tokens)
        cells = [e5.cell("e5m2 default", bf_ms)[0]]
        for *cfg, splits in best[:1]:
            cells.append(e5.cell(f"e5m2 best e4m3 config {best[0]}", bf_ms, **fp8_kw(tuple(cfg), splits))[0])
        row(f"e5m2 cache {n} x {ctx}", cells)
        del e5

    # the engine's batch shrinks as sequences finish: the defaults and their split counts by batch size
    sizes = [(16, args.ctx), (8, args.ctx), (4, args.ctx), (1, args.ctx), (256, 2048)]
    for n2, ctx2 in [(1, 300), (3, 64)] if args.quick else sizes:
        if over():
            break
        b16 = Case(n2, ctx2, BF16, args.table_tokens if ctx2 == args.ctx else None)
        text, b_ms = b16.cell("bf16 default")
        cells = [text]
        if base is not None:
            cells.append(b16.cell("bf16 baseline", b_ms, base)[0])
            cells.append(b16.cell("bf16 default again", b_ms)[0])
        del b16
        f8 = Case(n2, ctx2, E4M3, args.table_tokens if ctx2 == args.ctx else None)
        chosen = ta.choose_num_splits(
            n2, KV_HEADS, f8.tables.shape[1] * BS, DEV, ta.decode_config(True, n2, KV_HEADS).programs_per_sm
        )
        cells.append(f8.cell(f"e4m3 default ({chosen} splits)", b_ms)[0])
        if base is not None:
            cells.append(f8.cell("e4m3 baseline", b_ms, base)[0])
        for splits in (chosen // 2, chosen * 2):
            if 1 <= splits <= ta.MAX_SPLITS:
                cells.append(f8.cell(f"e4m3 default, {splits} splits", b_ms, num_splits=splits)[0])
        for *cfg, _ in best[:1]:
            cells.append(f8.cell(f"e4m3 {cfg}", b_ms, **fp8_kw(tuple(cfg)))[0])
        del f8
        row(f"{n2} x {ctx2}", cells)
        torch.cuda.empty_cache()

    if not over():
        row("4-token verification (varlen, 16 rows a program)", verification_cells(2 if args.quick else 32))

    print("\n| case | cells (time, K/V GB/s, error vs float32 reference, speed vs the bf16 cache) |")
    print("|---|---|")
    for name, text in ROWS:
        print(f"| {name} | {text} |")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
