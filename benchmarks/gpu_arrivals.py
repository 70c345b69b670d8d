"""Latency under a stream of arriving requests on the built-in engine (issue 6, v15): what the
decode windows' length (`--num-scheduler-steps`: auto, the default, or fixed) costs new requests and
streamed tokens, and what it gives in throughput.

One process, one engine configuration (run it once per setting: benchmarks/gpu_all.sh does). The
engine is warmed with a few requests, then N requests arrive as a Poisson process at --rate requests
per second (seeded: every setting sees the same arrival times, prompts and lengths; input lengths
uniform in [--input-min, --input-max], outputs in [--output-min, --output-max], `ignore_eos`, greedy,
DELTA outputs). The loop adds each request once its arrival time has passed, then calls
`engine.step()`; when nothing is running it sleeps until the next arrival. Per request: time to the
first token (from its arrival time, so the time it waited for a window to end counts), and the gaps
between the outputs that carried its later tokens (a window of L steps delivers L tokens at once).
Printed last: TTFT p50 / p90 / p99, the gap p50 / p99 and the largest, output tok/s over the run,
the most sequences running, the windows by length, and every engine step over 100 ms (with the
engine's Triton kernels compiled during it).

    PYTHONPATH=<dir holding llmdeploy_engine> python3 benchmarks/gpu_arrivals.py --num-scheduler-steps auto
    python benchmarks/gpu_arrivals.py --device cpu --quick   # a dry run (random SmolLM2-135M)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine
from gpu_bench import COMPILED, log, steps_or_auto, sync, watch_compiles

import_engine()

from llmdeploy_engine.config import EngineConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

SLOW_STEP_S = 0.1  # engine.step() calls longer than this are listed (with Triton compilations in them)
MODELS = {"qwen": "random:Qwen/Qwen2.5-0.5B", "llama": "random:meta-llama/Llama-3.1-8B"}


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def workload(args: argparse.Namespace, vocab: int) -> list[tuple[float, list[int], int]]:
    """(arrival s, prompt ids, output length) per request, from --seed."""
    rng = random.Random(args.seed)
    t = 0.0
    out = []
    for _ in range(args.num_requests):
        t += rng.expovariate(args.rate)
        n_in = rng.randint(args.input_min, args.input_max)
        n_out = rng.randint(args.output_min, args.output_max)
        out.append((t, [rng.randrange(3, vocab) for _ in range(n_in)], n_out))
    return out


def run(engine: LLMEngine, reqs: list[tuple[float, list[int], int]], device: str) -> dict[str, Any]:
    pending = list(enumerate(reqs))
    pending.reverse()  # pop() takes the earliest
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    gaps: list[float] = []
    produced = 0
    most_running = 0
    slow: list[dict[str, Any]] = []
    before = dict(engine.num_windows_by_steps)
    sync(device)
    t0 = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while pending and pending[-1][1][0] <= now:
            i, (at, ids, n_out) = pending.pop()
            params = SamplingParams(
                max_tokens=n_out, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
            )
            engine.add_request(f"a{i}", ids, params)
            arrival[f"a{i}"] = at
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[-1][1][0] - (time.perf_counter() - t0)))
            continue
        waiting = len(engine.scheduler.waiting)
        compiled = len(COMPILED)
        t_step = time.perf_counter()
        outs = engine.step()
        most_running = max(most_running, len(engine.scheduler.running))
        now = time.perf_counter() - t0
        if now + t0 - t_step > SLOW_STEP_S:  # a step that held every stream up: what it was
            slow.append(
                {
                    "at_s": round(now, 3),
                    "ms": round((now + t0 - t_step) * 1e3, 1),
                    "running": len(engine.scheduler.running),
                    "waiting_before": waiting,
                    "compiled": COMPILED[compiled:],
                }
            )
        for out in outs:
            new = len(out.outputs[0].token_ids)
            if not new:
                continue
            produced += new
            rid = out.request_id
            if rid not in first:
                first[rid] = now
            else:
                gaps.append(now - last[rid])
            last[rid] = now
    sync(device)
    elapsed = time.perf_counter() - t0
    if len(first) != len(reqs) or produced != sum(n for _, _, n in reqs):
        raise RuntimeError(
            f"expected {sum(n for _, _, n in reqs)} tokens of {len(reqs)} requests, got {produced}"
        )
    ttft = [first[r] - arrival[r] for r in first]
    windows = {
        k: v - before.get(k, 0)
        for k, v in sorted(engine.num_windows_by_steps.items())
        if v - before.get(k, 0)
    }
    return {
        "seconds": elapsed,
        "output_tokens": produced,
        "tok_s": produced / elapsed,
        "ttft_ms": {q: percentile(ttft, p) * 1e3 for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "ttft_mean_ms": statistics.fmean(ttft) * 1e3,
        "gap_ms": {
            "p50": percentile(gaps, 0.5) * 1e3,
            "p99": percentile(gaps, 0.99) * 1e3,
            "max": max(gaps, default=float("nan")) * 1e3,
        },
        "most_running": most_running,
        "windows_by_steps": windows,
        "slow_steps": slow,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen", help="qwen, llama, or a model reference")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-scheduler-steps", type=steps_or_auto, default=None, help="N, or auto")
    parser.add_argument(
        "--admission-interval", type=int, default=1, help="the engine's admission_interval (decode steps)"
    )
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second (Poisson)")
    parser.add_argument("--num-requests", type=int, default=600)
    parser.add_argument("--input-min", type=int, default=100)
    parser.add_argument("--input-max", type=int, default=1024)
    parser.add_argument("--output-min", type=int, default=50)
    parser.add_argument("--output-max", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default=None, help="name of this setting in the table and the JSON")
    parser.add_argument("--quick", action="store_true", help="a tiny dry run (CPU: a random SmolLM2-135M)")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_arrivals_<label>.json")
    args = parser.parse_args()
    model = MODELS.get(args.model, args.model)
    if args.quick:
        args.num_requests, args.rate = 12, 20.0
        args.input_min, args.input_max, args.output_min, args.output_max = 8, 40, 4, 16
        if args.device == "cpu" and args.model == "qwen":
            model = "random:HuggingFaceTB/SmolLM2-135M"
    label = args.label or f"steps-{args.num_scheduler_steps or 'auto'}"
    config = EngineConfig(
        model=model,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_model_len=2048,
        kv_cache_memory_bytes=2**28 if args.device == "cpu" else None,
        gpu_memory_utilization=0.9,
        num_scheduler_steps=args.num_scheduler_steps,
        seed=0,
        **({"admission_interval": args.admission_interval} if args.admission_interval != 1 else {}),
    )
    watch_compiles()
    engine = LLMEngine(config)
    try:
        vocab = int(getattr(engine.tokenizer, "vocab_size", None) or engine.runner.model_config.vocab_size)
        warm = SamplingParams(max_tokens=16, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        for i in range(4):
            engine.add_request(f"w{i}", list(range(10, 10 + 32 * (i + 1))), warm)
        while engine.has_unfinished_requests():
            engine.step()
        log(
            f"{label}: {args.num_requests} requests at {args.rate}/s on {model}; {len(COMPILED)} compilations so far"
        )
        res = run(engine, workload(args, vocab), args.device)
    finally:
        engine.close()
    res.update(label=label, model=model, rate=args.rate, num_requests=args.num_requests)
    log(f"{label}: {res}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"gpu_arrivals_{label}.json").write_text(json.dumps(res, indent=1))
    t, g = res["ttft_ms"], res["gap_ms"]
    print(
        "| setting | TTFT ms p50 / p90 / p99 | token gap ms p50 / p99 / max | output tok/s | most running | windows |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {label} | {t['p50']:.1f} / {t['p90']:.1f} / {t['p99']:.1f} | {g['p50']:.1f} / {g['p99']:.1f} / "
        f"{g['max']:.1f} | {res['tok_s']:.0f} | {res['most_running']} | {res['windows_by_steps']} |"
    )


if __name__ == "__main__":
    main()
