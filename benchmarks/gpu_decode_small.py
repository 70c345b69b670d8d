"""Single-sequence paged decode on the GPU: context splits and tile size at short contexts (issue 6).

Single-stream decode runs the Triton decode kernel once a layer for one query token; at a few
hundred cached tokens it is latency-bound (v4: 7.3 us a layer for Qwen2.5-0.5B, 9.3 us for
Llama-3.1-8B, with one or two programs per KV head). This times `paged_decode` (with its split merge)
inside a CUDA graph of 20 back-to-back calls, as the engine's decode graph runs it, for both models'
head layouts at contexts 128-1024 (graph bucket = next power of two of the context), per split count
and tile, against the engine's default choice; every cell is checked against a float32 reference.

    PYTHONPATH=<dir holding llmdeploy_engine> python3 benchmarks/gpu_decode_small.py
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.kernels import triton_attention as ta  # noqa: E402

BS = 16
LAYOUTS = {"qwen0.5b": (14, 2, 64), "llama8b": (32, 8, 128)}  # q heads, KV heads, head_dim
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


def graph_us(fn: object, reps: int = 20) -> float:
    """us per call: a CUDA graph of `reps` calls, replayed 50 times, median of 5 timings."""
    torch.cuda.synchronize()
    for _ in range(3):
        fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()  # type: ignore[operator]
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (50 * reps))
    return sorted(times)[2]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [1, H, D], k/v [T, KVH, D] -> [1, H, D] in float32."""
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)  # [T, H, D]
    vv = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("hd,thd->ht", q[0].float(), kk) * scale
    return torch.einsum("ht,thd->hd", s.softmax(-1), vv)[None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="128,256,384,512,1024")
    parser.add_argument("--splits", default="1,2,4,8,16")
    parser.add_argument("--tiles", default="32,64")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[str] = []
    for name, (heads, kv_heads, dim) in LAYOUTS.items():
        for ctx in (int(x) for x in args.contexts.split(",")):
            bucket = 1 << (ctx - 1).bit_length()
            nb = bucket // BS
            k_cache = torch.randn(nb + 4, BS, kv_heads, dim, device=dev, generator=gen).to(torch.bfloat16)
            v_cache = torch.randn(nb + 4, BS, kv_heads, dim, device=dev, generator=gen).to(torch.bfloat16)
            perm = torch.randperm(nb + 4, device=dev, generator=gen)[:nb]
            tables = perm[None, :].to(torch.int32)
            lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
            q = torch.randn(1, heads, dim, device=dev, generator=gen).to(torch.bfloat16)
            scale = dim**-0.5
            flat_k = k_cache[perm].reshape(-1, kv_heads, dim)[:ctx]
            flat_v = v_cache[perm].reshape(-1, kv_heads, dim)[:ctx]
            ref = reference(q, flat_k, flat_v, scale)
            default = ta.choose_num_splits(
                1, kv_heads, bucket, dev, ta.decode_config(False, 1, kv_heads).programs_per_sm
            )
            cells = []
            inputs = (q, k_cache, v_cache, tables, lens, scale)
            us_default = graph_us(functools.partial(ta.paged_decode, *inputs))
            cells.append(f"default ({default} split): {us_default:.2f}")
            best = (us_default, "default")
            for tile in (int(x) for x in args.tiles.split(",")):
                for splits in (int(x) for x in args.splits.split(",")):
                    if splits * tile > bucket * 2 or splits > ta.MAX_SPLITS:
                        continue
                    call = functools.partial(ta.paged_decode, *inputs, num_splits=splits, tile=tile)
                    err = float((call().float() - ref).abs().max() / ref.abs().max())
                    if err > 2e-2:
                        cells.append(f"t{tile}/s{splits}: WRONG err {err:.1e}")
                        continue
                    us = graph_us(call)
                    cells.append(f"t{tile}/s{splits}: {us:.2f}")
                    if us < best[0]:
                        best = (us, f"tile {tile}, {splits} splits")
            line = (
                f"| {name} | {ctx} (bucket {bucket}) | "
                + "; ".join(cells)
                + f" | {best[1]} {best[0]:.2f} us |"
            )
            log(line)
            rows.append(line)
    print("\n| layout | context | us per call in a graph (default, tile/splits) | best |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
