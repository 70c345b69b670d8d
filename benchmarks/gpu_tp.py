"""Tensor parallelism speed-up of the built-in engine (issue 6): tp=1 vs tp=N, single stream.

Random Llama-3.1-8B (architecture from llmdeploy's catalog, no hub), bf16, CUDA graphs on: one
request with a 128-token prompt and 256 greedy output tokens (ignore_eos); end-to-end and decode
tok/s per tensor_parallel_size, the tp=N / tp=1 ratio (target on 2 H200s: >= 1.5x) for each
all-reduce path asked for (--allreduce auto,p2p,symm_mem,nccl: auto = p2p on CUDA, this project's
one-barrier Triton kernel, else torch's symm_mem one-shot; CUDA graphs at tp > 1 need one of them;
nccl alone runs tp > 1 eagerly), and how many of the greedy tokens agree (bf16 sums in another order
may flip a near tie, so this is reported, not asserted). JSON to --out (a file, or a folder that gets
gpu_tp.json); the table is printed last.

GPU (from the repository root, 2 GPUs visible):

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_tp.py --out $OUT

CPU dry run (gloo, a tiny checkpoint written to a temporary folder, float32):
`python benchmarks/gpu_tp.py --quick --device cpu`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


from engine_path import import_engine  # noqa: E402

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.config import EngineConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.runner.distributed import ALLREDUCE_ENV  # noqa: E402
from llmdeploy_engine.sampling_params import SamplingParams  # noqa: E402

START = time.perf_counter()


def steps_or_auto(text: str) -> int | None:
    """--num-scheduler-steps: a whole number >= 1, or auto (None: the engine's default)."""
    return None if text == "auto" else int(text)


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


def tiny_checkpoint(folder: Path) -> str:
    """A 2-layer Qwen2-shaped checkpoint (14 heads, 2 KV heads) for the CPU dry run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=512,
        hidden_size=448,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return str(folder)


def single_stream(
    model: str, tp: int, args: argparse.Namespace, prompt: list[int]
) -> tuple[dict[str, Any], list[int]]:
    cpu = args.device == "cpu"
    config = EngineConfig(
        model=model,
        tokenizer="random:byte-level" if cpu else None,
        device=args.device,
        dtype="float32" if cpu else "bfloat16",
        tensor_parallel_size=tp,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(args.prompt_len, 256),
        kv_cache_memory_bytes=64 * 2**20 if cpu else None,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.eager,
        num_scheduler_steps=args.num_scheduler_steps,
        async_scheduling=args.async_scheduling,
        seed=0,
    )
    t0 = time.perf_counter()
    engine = LLMEngine(config)
    startup_s = time.perf_counter() - t0
    log(f"tp={tp}: engine up in {startup_s:.1f} s")
    try:
        params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
        engine.add_request(
            "warmup", prompt[: max(1, len(prompt) // 2)], SamplingParams(max_tokens=8, ignore_eos=True)
        )
        while engine.has_unfinished_requests():
            engine.step()
        engine.add_request("r", prompt, params)
        t_start = time.perf_counter()
        first: float | None = None
        tokens: list[int] = []
        steps = 0
        profiled = 0.0
        profiled_tokens = 0  # tokens of the profiled steps: left out with their time
        kernels: dict[str, Any] = {}
        while engine.has_unfinished_requests():
            steps += 1
            # about 64 tokens in (a multi-step window is one engine step; auto: up to its longest)
            if (
                steps == max(2, 64 // engine.num_scheduler_steps)
                and args.profile_steps
                and args.device == "cuda"
            ):
                t_prof = time.perf_counter()
                kernels, outs = profile_decode(engine, args.profile_steps)
                profiled = time.perf_counter() - t_prof  # left out of the timings
                if outs:
                    profiled_tokens = len(outs[-1].outputs[0].token_ids) - len(tokens)
            else:
                outs = engine.step()
            for out in outs:
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter()
                tokens = list(out.outputs[0].token_ids)
        end = time.perf_counter() - profiled
        windows = dict(sorted(engine.num_windows_by_steps.items()))
    finally:
        engine.close()
    assert first is not None and len(tokens) == args.output_len, (first, len(tokens))
    total = end - t_start
    decode = end - first
    # the profiled steps' time and tokens are both left out (before v8 only their time was, which
    # raised both tp figures by ~14 % at --profile-steps 4; the ratio was not changed by it)
    timed_tokens = len(tokens) - profiled_tokens
    res = {
        "tp": tp,
        "startup_s": startup_s,
        "ttft_s": first - t_start,
        "total_s": total,
        "profiled_tokens": profiled_tokens,
        "tok_s": timed_tokens / total,
        "decode_tok_s": (timed_tokens - 1) / decode if decode > 0 else float("nan"),
        "num_scheduler_steps": args.num_scheduler_steps or "auto",
        "windows_by_steps": windows,
    }
    if kernels:
        res["profile"] = kernels
    log(f"tp={tp}: {res}")
    del engine
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return res, tokens


def profile_decode(engine: LLMEngine, num_steps: int) -> tuple[dict[str, Any], list[Any]]:
    """Rank 0's CUDA kernels over num_steps decode steps (each step's outputs kept): kernel ms and
    launches per step, wall ms per step, and the top kernels by time per step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    outputs: list[Any] = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            outputs += engine.step()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    per_name: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == DeviceType.CUDA:
            entry = per_name.setdefault(ev.name[:70], [0.0, 0.0])
            entry[0] += 1
            entry[1] += ev.time_range.elapsed_us()
    top = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:12]
    result = {
        "wall_ms_per_step": wall / num_steps * 1e3,
        "kernel_ms_per_step": sum(v[1] for v in per_name.values()) / num_steps * 1e-3,
        "kernels_per_step": sum(v[0] for v in per_name.values()) / num_steps,
        "top": [(name, round(v[0] / num_steps, 1), round(v[1] / num_steps, 1)) for name, v in top],
    }
    for name, count, us in result["top"]:
        log(f"    {us:8.1f} us/step {count:6.1f}x  {name}")
    return result, outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:meta-llama/Llama-3.1-8B")
    parser.add_argument("--tp", type=int, default=2, help="tensor_parallel_size compared with 1")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=1,
        help="the engine's max_num_seqs (1: graphs for batch 1 only, so the prompt's prefill runs eagerly; "
        "the engine's default 256 adds the short-prefill graphs)",
    )
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU dry run)")
    parser.add_argument(
        "--allreduce",
        default="auto",
        help="comma-separated all-reduce paths to time at tp=N: auto, push, p2p, symm_mem, nccl (eager at tp > 1)",
    )
    parser.add_argument(
        "--num-scheduler-steps",
        type=steps_or_auto,
        default=None,
        help="decode steps per scheduler call (multi-step), or auto (the engine's default: the engine "
        "chooses each window's length)",
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch the next decode window before the last one's tokens are processed (default: on with "
        "--num-scheduler-steps > 1 or on a CUDA GPU)",
    )
    parser.add_argument(
        "--profile-steps", type=int, default=0, help="profile this many decode steps on rank 0 (0: none)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON file, or folder for gpu_tp.json")
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        print(f"need {args.tp} visible GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    tmp = None
    model = args.model
    if args.quick:
        args.prompt_len, args.output_len, args.max_model_len = 16, 16, 128
        if args.device == "cpu":
            tmp = tempfile.TemporaryDirectory(prefix="gpu_tp_")
            model = tiny_checkpoint(Path(tmp.name))
            torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 250, (args.prompt_len,), generator=gen).tolist()
    variants = [v for v in args.allreduce.split(",") if v]
    runs: list[dict[str, Any]] = []
    result = {
        "model": args.model if not (args.quick and args.device == "cpu") else "tiny qwen2 checkpoint",
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "cuda_graphs": args.device == "cuda" and not args.eager,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "runs": runs,
    }

    def save() -> None:  # after every run: a later variant that takes the process down loses nothing
        if args.out is not None:
            path = args.out / "gpu_tp.json" if args.out.is_dir() else args.out
            path.write_text(json.dumps(result, indent=2))

    ref, ref_tokens = single_stream(model, 1, args, prompt)
    ref["allreduce"] = "-"
    runs.append(ref)
    save()
    for variant in variants:
        os.environ[ALLREDUCE_ENV] = variant  # read by every rank (workers inherit the environment)
        try:
            run, toks = single_stream(model, args.tp, args, prompt)
        except Exception as exc:  # report the variant as failed, keep the others
            log(f"tp={args.tp} allreduce={variant} failed: {exc!r}")
            runs.append({"tp": args.tp, "allreduce": variant, "error": repr(exc)})
            save()
            continue
        finally:
            os.environ.pop(ALLREDUCE_ENV, None)
        same = next((i for i, (a, b) in enumerate(zip(ref_tokens, toks, strict=True)) if a != b), None)
        run.update(
            allreduce=variant,
            ratio_tok_s=run["tok_s"] / ref["tok_s"],
            ratio_decode_tok_s=run["decode_tok_s"] / ref["decode_tok_s"],
            greedy_tokens_identical_prefix=args.output_len if same is None else same,
        )
        runs.append(run)
        save()
    if tmp is not None:
        tmp.cleanup()
    print()
    print(
        f"{'tp':>3} {'allreduce':>10} {'startup s':>10} {'TTFT ms':>9} {'tok/s':>9} {'decode tok/s':>13} "
        f"{'x tok/s':>8} {'x decode':>9} {'same tokens':>12}"
    )
    for r in runs:
        if "error" in r:
            print(f"{r['tp']:>3} {r['allreduce']:>10} failed: {r['error'][:80]}")
            continue
        ratios = (
            f"{r['ratio_tok_s']:>8.2f} {r['ratio_decode_tok_s']:>9.2f} {r['greedy_tokens_identical_prefix']:>12}"
            if "ratio_tok_s" in r
            else f"{'':>8} {'':>9} {'':>12}"
        )
        print(
            f"{r['tp']:>3} {r['allreduce']:>10} {r['startup_s']:>10.1f} {r['ttft_s'] * 1e3:>9.1f} "
            f"{r['tok_s']:>9.1f} {r['decode_tok_s']:>13.1f} {ratios}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
