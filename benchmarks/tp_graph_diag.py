"""Why did tensor-parallel CUDA-graph replay hang? (issue 6, docs/gpu-notes.md) - a diagnosis run for
the 2-GPU machine. Each case runs in its own process group with a time limit, and every rank dumps
its Python stack if the case is still running after --dump-s seconds, so a hang shows where it waits.

Cases:
- `torch-nccl` / `torch-symm`: plain torch, no engine: L layers of (matmul, all-reduce) captured in
  one CUDA graph per rank (warm-up on a side stream, as the engine's graph runner does), replayed R
  times, checked against the eager result; NCCL's all-reduce or the symmetric-memory one-shot kernel.
- `torch-nccl-mixed`: as torch-nccl, with an eager all-reduce between replays (the engine mixes eager
  prefill steps with decode replays).
- `engine-auto` / `engine-symm_mem` / `engine-nccl`: the built-in engine at tensor_parallel_size 2
  (random Qwen2.5-0.5B, one request, 32 greedy tokens) with that LLMDEPLOY_TP_ALLREDUCE: graphs with
  the symmetric-memory all-reduce (auto, symm_mem), eager steps with NCCL only (nccl). Run 7 (before
  the engine refused NCCL inside captures) ran its engine case with NCCL collectives in the graphs.

    CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/tp_graph_diag.py --cases torch-nccl,engine-nccl
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torch_case(rank: int, world: int, port: int, mode: str, layers: int, replays: int) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
    )
    group = dist.group.WORLD
    reduce = None
    if mode == "symm":
        import torch.distributed._symmetric_memory as symm_mem

        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            enable(group.group_name)
        buf = symm_mem.empty(1 << 20, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(buf, group.group_name)

        def reduce(x: torch.Tensor) -> torch.Tensor:
            staging = buf[: x.numel() * x.element_size()].view(x.dtype)
            staging.copy_(x.reshape(-1))
            return torch.ops.symm_mem.one_shot_all_reduce(staging, "sum", group.group_name).view(x.shape)
    else:

        def reduce(x: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(x, group=group)
            return x

    torch.manual_seed(0)
    weights = [torch.randn(896, 896, device=device, dtype=torch.bfloat16) / 30 for _ in range(layers)]
    static = torch.randn(1, 896, device=device, dtype=torch.bfloat16)

    def forward(x: torch.Tensor) -> torch.Tensor:
        for w in weights:
            x = reduce(x @ w) / world
        return x

    with torch.inference_mode():
        ref = forward(static.clone())
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            forward(static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.graph(graph):
            out = forward(static)
        torch.cuda.synchronize(device)
        print(f"rank {rank}: captured in {time.perf_counter() - t0:.3f} s", flush=True)
        t0 = time.perf_counter()
        for i in range(replays):
            graph.replay()
            if mode == "nccl-mixed" and i % 10 == 0:
                probe = torch.ones(4, device=device)
                dist.all_reduce(probe, group=group)
        torch.cuda.synchronize(device)
        dt = (time.perf_counter() - t0) / replays
        err = (out.float() - ref.float()).abs().max().item()
        print(
            f"rank {rank}: {replays} replays, {dt * 1e6:.1f} us each ({layers} all-reduces), max err {err:.3g}",
            flush=True,
        )
    dist.destroy_process_group()


def engine_case(allreduce: str, tokens: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from engine_path import import_engine

    import_engine()
    os.environ["LLMDEPLOY_TP_ALLREDUCE"] = allreduce
    from llmdeploy_engine.config import EngineConfig
    from llmdeploy_engine.llm_engine import LLMEngine
    from llmdeploy_engine.sampling_params import SamplingParams

    config = EngineConfig(
        model="random:Qwen/Qwen2.5-0.5B", tensor_parallel_size=2, dtype="bfloat16", max_model_len=512,
        max_num_seqs=8, gpu_memory_utilization=0.3, seed=0,
    )  # fmt: skip
    t0 = time.perf_counter()
    engine = LLMEngine(config)
    print(f"engine up in {time.perf_counter() - t0:.1f} s", flush=True)
    try:
        engine.add_request("r", list(range(10, 42)), SamplingParams(max_tokens=tokens, ignore_eos=True))
        steps = 0
        t0 = time.perf_counter()
        out = []
        while engine.has_unfinished_requests():
            out = engine.step() or out
            steps += 1
            if steps <= 3:
                print(f"step {steps} done at {time.perf_counter() - t0:.3f} s", flush=True)
        dt = time.perf_counter() - t0
        print(
            f"{steps} steps, {tokens / dt:.1f} tok/s, replays {getattr(engine.runner.runner, 'num_replays', '?')}",
            flush=True,
        )
    finally:
        engine.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="torch-nccl,torch-symm,torch-nccl-mixed,engine-auto,engine-nccl")
    p.add_argument("--limit-s", type=float, default=75)
    p.add_argument("--dump-s", type=float, default=45)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--role", default="driver")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    if args.role != "driver":
        faulthandler.dump_traceback_later(args.dump_s, exit=False)
        if args.role.startswith("torch-"):
            torch_case(args.rank, 2, args.port, args.role.removeprefix("torch-"), args.layers, args.replays)
        else:
            engine_case(args.role.removeprefix("engine-"), args.tokens)
        return 0
    import socket

    for case in args.cases.split(","):
        print(f"=== {case}", flush=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", LLMDEPLOY_HANG_DUMP_S=str(args.dump_s))
        env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ranks = [0, 1] if case.startswith("torch-") else [0]
        base = [sys.executable, __file__, "--role", case, "--port", str(port), "--dump-s", str(args.dump_s),
                "--layers", str(args.layers), "--replays", str(args.replays), "--tokens", str(args.tokens)]  # fmt: skip
        procs = [subprocess.Popen([*base, "--rank", str(r)], env=env, start_new_session=True) for r in ranks]
        t0 = time.time()
        for proc in procs:
            try:
                proc.wait(timeout=max(1.0, args.limit_s - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                print(f"=== {case}: still running after {args.limit_s:.0f} s: HUNG, killing", flush=True)
                break
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()
        # tensor-parallel worker processes of an engine case are in the same session: gone with killpg
        print(
            f"=== {case}: exit codes {[pr.returncode for pr in procs]} after {time.time() - t0:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
