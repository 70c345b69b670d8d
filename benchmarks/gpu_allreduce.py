"""The all-reduce of one decode token's hidden state on 2 GPUs, alone: microseconds per call of each
of this project's fast paths (issue 6, docs/gpu-notes.md v9).

For each path (`push`, `p2p`, `symm_mem`: LLMDEPLOY_TP_ALLREDUCE, each in a fresh pair of processes,
since a process sets symmetric memory up once) and, for `push`, each kernel shape (elements per
program, warps), both ranks capture one CUDA graph of --calls all-reduces of a [rows, hidden] bf16
tensor back to back in the model's slot order (attention 0, MLP 1, ...), replay it --warmup times,
then time --replays replays with CUDA events, five times; rank 0 prints the median microseconds per
all-reduce. The result is checked against the exact sum once. Back to back means no GEMV between the
calls, so this is the call's own latency (launch, the trip over NVLink, the other rank's skew), not
what it costs inside a decode step where PDL overlaps it with its neighbours.

    CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/gpu_allreduce.py --rows 1,8 --hidden 4096
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PUSH_SHAPES = [(2048, 8), (1024, 4), (512, 4), (512, 2), (256, 2), (4096, 16)]


def rank_main(rank: int, port: int, kind: str, args: argparse.Namespace, queue: Any) -> None:
    os.environ["LLMDEPLOY_TP_ALLREDUCE"] = kind
    import torch
    from llmdeploy_engine.runner.distributed import (
        ATTENTION_SLOT,
        MLP_SLOT,
        all_reduce,
        destroy_parallel,
        init_parallel,
    )

    device = torch.device("cuda", rank)
    rows_list = [int(r) for r in args.rows.split(",")]
    state = init_parallel(rank, 2, port, device, max(rows_list) * args.hidden * 4)
    fast = state.fast_all_reduce
    shapes: list[tuple[int, int] | None] = list(PUSH_SHAPES) if kind == "push" else [None]
    results = []
    for rows in rows_list:
        for shape in shapes:
            x = torch.full((rows, args.hidden), float(rank + 1), dtype=torch.bfloat16, device=device)

            def reduce(t: torch.Tensor, slot: int, shape: tuple[int, int] | None = shape) -> torch.Tensor:
                if shape is None:
                    return all_reduce(t, state, slot)
                block, warps = shape
                out: torch.Tensor = fast.kernels.push_exchange(
                    t.reshape(-1), fast.recv_ptrs, rank, 2, slot * 2 * fast.max_bytes // 2,
                    fast.max_bytes // 2, block=block, num_warps=warps,
                )  # fmt: skip
                return out.view(t.shape)

            def chain(t: torch.Tensor = x) -> torch.Tensor:  # values grow to inf: the timing does not care
                for i in range(args.calls):
                    t = reduce(t, (ATTENTION_SLOT, MLP_SLOT)[i % 2])
                return t

            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                first = reduce(x, ATTENTION_SLOT)  # compiles; checks one exact sum
                chain()
            torch.cuda.current_stream(device).wait_stream(side)
            assert float(first.float().min()) == 3.0 and float(first.float().max()) == 3.0, kind
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain()
            for _ in range(args.warmup):
                graph.replay()
            torch.cuda.synchronize(device)
            per_call = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.replays):
                    graph.replay()
                end.record()
                end.synchronize()
                per_call.append(start.elapsed_time(end) * 1e3 / (args.replays * args.calls))
            label = kind if shape is None else f"push {shape[0]}x{shape[1]}w"
            results.append({"path": label, "rows": rows, "us_per_call": statistics.median(per_call),
                            "spread_us": [min(per_call), max(per_call)]})  # fmt: skip
            del graph
    destroy_parallel(state)
    if rank == 0:
        queue.put(results)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paths", default="push,p2p,symm_mem")
    parser.add_argument("--rows", default="1,8", help="rows of the all-reduced tensor (decode batch)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=64, help="all-reduces per graph (a decode step has 65)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--timeout-s", type=float, default=150.0, help="per path")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from llmdeploy_engine.runner.distributed import free_port

    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    for kind in args.paths.split(","):
        queue = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, port, kind, args, queue)) for r in range(2)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        got: list[dict[str, Any]] = []
        try:
            got = queue.get(timeout=args.timeout_s)
        except Exception as exc:  # a hang or a crash: say so, go on with the next path
            print(f"{kind}: no result ({type(exc).__name__})", flush=True)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        print(
            f"{kind}: {time.perf_counter() - t0:.1f} s, exit codes {[p.exitcode for p in procs]}", flush=True
        )
        rows += got
    print("\n| path | rows | us per all-reduce (median of 5) | min - max |")
    print("|---|---|---|---|")
    for r in rows:
        lo, hi = r["spread_us"]
        print(f"| {r['path']} | {r['rows']} | {r['us_per_call']:.2f} | {lo:.2f} - {hi:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
