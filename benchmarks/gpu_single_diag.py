"""Single-stream diagnosis on the built-in engine (issue 6, v8): the same 128-token prompt and 256
greedy output tokens as gpu_bench.py, under one engine configuration given on the command line, so
that configurations can be compared in separate processes.

Why it exists: in run 23 the same random Llama-3.1-8B decoded 238 tok/s in gpu_bench.py (engine for
256 sequences, 2,048-token context, 90 % of GPU memory, gpu_bench's warm-up) and 270 tok/s at tp = 1
in gpu_tp.py (one sequence, 1,024 tokens, 30 %, one short warm-up request); and the 0.5B's first
step in gpu_bench costs ~16 ms against gpu_ttft.py's 1.7 ms. This script varies one setting at a time.

Per request (R single requests one after another in the same engine, each with its own random prompt
unless --same-prompt): first-step ms (timed with a
device sync), end-to-end and decode tok/s, and the engine steps' wall times (median, slowest, and
which step). `--cprofile-first` runs the first request's first step under cProfile and prints the
functions with the most cumulative time (host-side one-time costs: compilation, module loading);
`--trace-first N` runs its first N engine steps under torch.profiler and prints the longest single
events (CUDA runtime calls and kernels included).

    PYTHONPATH=<dir holding llmdeploy_engine> python3 benchmarks/gpu_single_diag.py --model llama
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine
from gpu_bench import log, sync

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.config import EngineConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

MODELS = {"qwen": "random:Qwen/Qwen2.5-0.5B", "llama": "random:meta-llama/Llama-3.1-8B"}


def drain(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def warm_up(engine: LLMEngine, kind: str, prompt: list[int], gen: torch.Generator) -> None:
    """`bench`: gpu_bench.py's warm-up (4 x 64-token prompts, then 16 prompts of 100-1,024 tokens);
    `tp`: gpu_tp.py's (one request of half the prompt, 8 tokens); `none`."""
    if kind == "bench":
        final = RequestOutputKind.FINAL_ONLY
        p8 = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0, output_kind=final)
        for i in range(4):
            engine.add_request(f"w{i}", torch.randint(0, 256, (64,), generator=gen).tolist(), p8)
        drain(engine)
        lens = torch.randint(100, 1025, (16,), generator=torch.Generator().manual_seed(2)).tolist()
        p16 = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0, output_kind=final)
        for i, n in enumerate(lens):
            engine.add_request(f"x{i}", torch.randint(0, 256, (n,), generator=gen).tolist(), p16)
        drain(engine)
    elif kind == "tp":
        engine.add_request(
            "warmup", prompt[: len(prompt) // 2], SamplingParams(max_tokens=8, ignore_eos=True)
        )
        drain(engine)
    elif kind != "none":
        raise ValueError(f"unknown warm-up {kind!r}")


def one_request(
    engine: LLMEngine, name: str, prompt: list[int], args: argparse.Namespace, profile_first: bool
) -> dict[str, Any]:
    kind = RequestOutputKind.FINAL_ONLY if args.output_kind == "final" else RequestOutputKind.CUMULATIVE
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0, output_kind=kind)
    engine.add_request(name, prompt, params)
    sync(args.device)
    t0 = time.perf_counter()
    prof = cProfile.Profile() if profile_first and args.cprofile_first else None
    trace = profile_first and args.trace_first > 0
    if trace:
        from torch.profiler import ProfilerActivity, profile

        tracer = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        tracer.__enter__()
    if prof is not None:
        prof.enable()
    engine.step()
    sync(args.device)
    if prof is not None:
        prof.disable()
    t_first = time.perf_counter()
    steps: list[float] = []
    last = t_first
    while engine.has_unfinished_requests():
        engine.step()
        now = time.perf_counter()
        steps.append(now - last)
        last = now
        if trace and len(steps) == args.trace_first - 1:
            sync(args.device)
            tracer.__exit__(None, None, None)
            trace = False
            print(longest_events(tracer, args.cprofile_lines), flush=True)
    sync(args.device)
    t_end = time.perf_counter()
    res: dict[str, Any] = {
        "first_step_ms": (t_first - t0) * 1e3,
        "e2e_tok_s": args.output_len / (t_end - t0),
        "decode_tok_s": (args.output_len - 1) / (t_end - t_first),
        "engine_steps": len(steps),
        "step_ms_median": statistics.median(steps) * 1e3 if steps else 0.0,
        "step_ms_max": max(steps) * 1e3 if steps else 0.0,
        "slowest_step": steps.index(max(steps)) if steps else -1,
    }
    if prof is not None:
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(args.cprofile_lines)
        stats.sort_stats("tottime").print_stats(args.cprofile_lines // 2)
        res["cprofile"] = buf.getvalue()
    return res


def longest_events(tracer: Any, limit: int) -> str:
    """The profiled window's single longest events (host ops and CUDA runtime calls, GPU kernels),
    each with its start relative to the first event: one-time costs (module loading, graph upload,
    compilation) show up as one long call."""
    events = list(tracer.events())
    if not events:
        return "(no events)"
    t0 = min(ev.time_range.start for ev in events)

    def own_us(ev: Any) -> float:  # host events: time outside their child ops; kernels: duration
        if ev.device_type.name == "CUDA":
            return float(ev.time_range.elapsed_us())
        return float(ev.self_cpu_time_total)

    rows = sorted(events, key=lambda ev: -own_us(ev))[:limit]
    lines = [f"longest events of the traced steps by own time ({len(events)} events):"]
    for ev in rows:
        where = "gpu" if ev.device_type.name == "CUDA" else "cpu"
        lines.append(
            f"  {own_us(ev) / 1e3:9.3f} ms own, {ev.time_range.elapsed_us() / 1e3:9.3f} ms span, at "
            f"{(ev.time_range.start - t0) / 1e3:8.3f} ms  {where}  {ev.name[:100]}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=sorted(MODELS))
    parser.add_argument("--label", default="")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--num-scheduler-steps", type=int, default=8)
    parser.add_argument("--warmup", default="bench", choices=["bench", "tp", "none"])
    parser.add_argument("--output-kind", default="final", choices=["final", "cumulative"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--cprofile-first", action="store_true")
    parser.add_argument(
        "--trace-first",
        type=int,
        default=0,
        help="torch.profiler over the first request's first N engine steps: the longest single events",
    )
    parser.add_argument(
        "--same-prompt",
        action="store_true",
        help="every request repeats the first prompt (prefix-cache hits)",
    )
    parser.add_argument("--cprofile-lines", type=int, default=40)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="CPU dry run: a random SmolLM2-135M, float32")
    parser.add_argument(
        "--out", default=None, help="a folder: appends one JSON line to gpu_single_diag.jsonl"
    )
    args = parser.parse_args()
    config = EngineConfig(
        model="random:HuggingFaceTB/SmolLM2-135M-Instruct" if args.quick else MODELS[args.model],
        device=args.device,
        dtype="float32" if args.quick else "bfloat16",
        kv_cache_memory_bytes=2**28 if args.device == "cpu" else None,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(args.max_num_batched_tokens, args.prompt_len),
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_scheduler_steps=args.num_scheduler_steps,
        seed=0,
    )
    t0 = time.perf_counter()
    engine = LLMEngine(config)
    log(
        f"{args.model} {args.label}: engine up in {time.perf_counter() - t0:.1f} s; {getattr(engine.runner, 'report', 'eager')}"
    )
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (args.prompt_len,), generator=gen).tolist()
    warm_up(engine, args.warmup, prompt, gen)
    results = []
    if args.trace_first and args.device == "cuda":  # the profiler's own first-use cost, outside the trace
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            torch.ones(1, device="cuda").add_(1)
            sync(args.device)
    for r in range(args.requests):
        if r and not args.same_prompt:  # a new prompt: no prefix-cache hits
            prompt = torch.randint(0, 256, (args.prompt_len,), generator=gen).tolist()
        res = one_request(engine, f"single{r}", prompt, args, r == 0)
        text = res.pop("cprofile", None)
        log(f"  request {r}: {res}")
        if text:
            print(text, flush=True)
        results.append(res)
    engine.close()
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "cprofile_lines", "quick", "device")}
    line = {"settings": settings, "requests": results}
    if args.out:
        with Path(args.out, "gpu_single_diag.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
    print(
        f"| {args.model} | {args.label} | "
        + " | ".join(
            f"{r['first_step_ms']:.1f} ms, {r['e2e_tok_s']:.0f} / {r['decode_tok_s']:.0f}" for r in results
        )
        + " |"
    )


if __name__ == "__main__":
    main()
