"""Decode speed of the built-in engine with an fp8 KV cache against a 16-bit one (issue 6 item 4).

The target workload: Llama-3.1-8B with random bf16 weights, 32 sequences of ~8,000 prompt tokens each
(random byte-token ids, seed 0), 256 output tokens each (greedy, ignore_eos), all added at once. Only
decode is timed: the clock starts after the step in which the last sequence got its first token
(every prefill done, all 32 decoding). The figure ("full batch") stops at the end of the first engine
step in which a sequence finishes: chunked prefill staggers the sequences (the first ones decode while
later prompts are prefilled, and finish ~30 tokens earlier), so after that the batch drains and the
steps no longer hold 32 streams. "With the drain" runs to the last sequence's end, as v0-v6 measured
with 128 output tokens. Requests ask for FINAL_ONLY outputs, as `LLM.generate` and gpu_bench.py do
(v0-v6 here: cumulative outputs, with per-token text); progress is read from the engine's sequences. One engine per KV dtype (default: auto = bf16, fp8_e4m3, fp8_e5m2), same
process, same prompts; the table gives each run's ratio to the first run.

Each run also says which attention path served its pure-decode steps (counted at CUDA graph capture
and in eager steps): the Triton decode kernel, or the pure-torch path (block gather + SDPA). Until
the Triton kernel reads fp8 caches, fp8 decode runs the pure-torch path, so the ratio then compares
two different attention implementations; the column keeps the figure honest. "ms/step" is per forward
step (one token for every sequence: decode time / tokens per sequence, so a multi-step window of N
steps counts N), "bytes/step" what one such step must read (weights, minus the embedding table, plus
every sequence's KV context) and "GB/s" that over the step time. `--profile-window W` profiles engine
step W of the timed decode (left out of the timing) and gives CUDA kernel time per forward step by
kind (matmul, attention, other), so the part of the step the KV format does not touch is measured,
not inferred. With programmatic dependent launch a kernel starts before its predecessor ends and
its time includes that wait: the split merge, launched while the decode kernel runs, shows about the
decode kernel's time under "other", so the kinds overlap and their sum exceeds the wall time. `--repeats R` times the decode R times per engine (fresh requests, same prompts) and
reports the median, with every repeat in the JSON.

Run from the repository root (GPU machine):

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_fp8.py --out $OUT

CPU dry run of the script itself (tiny sizes): `python benchmarks/gpu_fp8.py --quick`.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine
from gpu_bench import log, profile_steps, sync

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.config import EngineConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.model import attention, model  # noqa: E402
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

TARGET_MODEL = "random:meta-llama/Llama-3.1-8B"
QUICK_MODEL = "random:HuggingFaceTB/SmolLM2-135M-Instruct"


class PathCounter:
    """Counts pure-decode attention calls per path by wrapping the Triton entry point and the torch path."""

    def __init__(self) -> None:
        self.triton = 0
        self.torch = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        try:
            from llmdeploy_engine.kernels import triton_attention
        except ImportError:  # no Triton: every call takes the torch path
            triton_attention = None
        if triton_attention is not None:
            kernel = triton_attention.paged_attention_triton
            self._patch(triton_attention, "paged_attention_triton", self._wrap_triton(kernel))
        # RoPE + KV store + decode attention in one launch: the model calls it by its own name
        self._patch(model, "fused_rope_decode", self._wrap_fused(model.fused_rope_decode))
        self._patch(attention, "_paged_attention", self._wrap_torch(attention._paged_attention))

    def uninstall(self) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()

    def reset(self) -> None:
        self.triton = self.torch = 0

    def counts(self) -> tuple[int, int]:
        return self.triton, self.torch

    @staticmethod
    def describe(triton: int, torch_calls: int) -> str:
        if triton and not torch_calls:
            return "triton decode kernel"
        if torch_calls and not triton:
            return "pure-torch (gather + SDPA)"
        if not (triton or torch_calls):
            return "unknown (no decode call seen)"
        return f"mixed: triton {triton} / torch {torch_calls} calls"

    def _patch(self, module: Any, name: str, replacement: Any) -> None:
        self._saved.append((module, name, getattr(module, name)))
        setattr(module, name, replacement)

    def _wrap_triton(self, kernel: Callable[..., Any]) -> Callable[..., Any]:
        def counted(q: Any, k: Any, v: Any, kv_cache: Any, meta: Any, *args: Any, **kwargs: Any) -> Any:
            if kv_cache is not None and meta.num_decodes and not meta.prefills:
                self.triton += 1
            return kernel(q, k, v, kv_cache, meta, *args, **kwargs)

        return counted

    def _wrap_fused(self, fused: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            out = fused(*args, **kwargs)
            if out is not None:  # None: not applicable, the two-launch path follows (and is counted)
                self.triton += 1
            return out

        return counted

    def _wrap_torch(self, torch_path: Callable[..., Any]) -> Callable[..., Any]:
        def counted(q: Any, k: Any, v: Any, kv_cache: Any, meta: Any, *args: Any, **kwargs: Any) -> Any:
            if kv_cache is not None and meta.num_decodes and not meta.prefills:
                self.torch += 1
            return torch_path(q, k, v, kv_cache, meta, *args, **kwargs)

        return counted


def make_engine(args: argparse.Namespace, kv_cache_dtype: str) -> LLMEngine:
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        kv_cache_dtype=kv_cache_dtype,
        calculate_kv_scales=not args.no_calculate_kv_scales,
        max_model_len=args.prompt_len + args.output_len,
        max_num_seqs=max(args.num_seqs, 1),
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=False,  # random prompts share nothing; keep the block manager out of it
        seed=0,
        enforce_eager=args.enforce_eager,
        num_scheduler_steps=args.num_scheduler_steps,
    )
    return LLMEngine(config)


class WindowTimer:
    """Wraps the engine runner's `execute_multi_step`: per decode window its host wall time inside the
    call and the GPU's span from the window's first launch to its end (CUDA events), so the step's
    time splits into kernels, GPU idle inside the window (the host launching replays) and host
    work between windows (scheduling, output processing)."""

    def __init__(self, engine: LLMEngine, device: str) -> None:
        self.records: list[tuple[float, float, int]] = []  # (host s in the call, GPU span s, steps)
        self.paused = False
        self._runner: Any = engine.runner
        self._orig: Any = getattr(engine.runner, "execute_multi_step", None)
        if self._orig is None:
            return
        orig = self._orig
        cuda = device == "cuda"

        def timed(batch: Any, num_steps: int, *args: Any, **kwargs: Any) -> Any:
            if self.paused:
                return orig(batch, num_steps, *args, **kwargs)
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t = time.perf_counter()
            out = orig(batch, num_steps, *args, **kwargs)
            host = time.perf_counter() - t
            gpu = 0.0
            if cuda:
                e1.record()
                e1.synchronize()
                gpu = e0.elapsed_time(e1) / 1e3
            self.records.append((host, gpu, num_steps))
            return out

        engine.runner.execute_multi_step = timed  # type: ignore[method-assign]

    def uninstall(self) -> None:
        """Back to the class's method; no reference to the runner is kept (the engine can be freed)."""
        if self._orig is not None:
            del self._runner.execute_multi_step
        self._runner = self._orig = None

    def summary(self, start: int, end: int, wall_s: float) -> dict[str, float]:
        """Per forward step over records[start:end], whose engine steps took wall_s in all."""
        recs = self.records[start:end]
        steps = sum(r[2] for r in recs)
        if not steps:
            return {}
        return {
            "windows": len(recs),
            "steps": steps,
            "wall_ms": wall_s / steps * 1e3,
            "gpu_span_ms": sum(r[1] for r in recs) / steps * 1e3,
            "host_in_window_call_ms": sum(r[0] for r in recs) / steps * 1e3,
            "host_outside_ms": (wall_s - sum(r[0] for r in recs)) / steps * 1e3,
        }


def decode_run(
    engine: LLMEngine,
    prompts: list[list[int]],
    output_len: int,
    device: str,
    tag: str = "r",
    profile_window: int | None = None,
    timer: WindowTimer | None = None,
) -> dict[str, Any]:
    """All prompts at once. The clock starts after the step that gives the last sequence its first
    token (every prefill done). "Full batch": until the end of the first engine step in which a
    sequence finishes, so every sequence decodes in every forward step timed (chunked prefill
    staggers the sequences: the first ones finish earlier and the batch then drains); "all": until
    the last one finishes, the drain included. With profile_window W, engine step W after the start
    is profiled, and its time and tokens are left out of both."""
    # as LLM.generate drives the engine (and gpu_bench.py): outputs only at the end, no per-token
    # text; progress is read from the engine's sequences
    params = SamplingParams(
        max_tokens=output_len, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY
    )
    for i, ids in enumerate(prompts):
        engine.add_request(f"{tag}{i}", ids, params)
    produced: dict[str, int] = {}
    t_prefill = time.perf_counter()
    t0: float | None = None
    last = 0.0
    engine_steps = tokens = profiled_tokens = 0
    clock = 0.0
    full: tuple[float, int, int] | None = None  # (seconds, tokens, engine steps) at the first finish
    profile: dict[str, float] | None = None
    while engine.has_unfinished_requests():
        profiling = t0 is not None and engine_steps == profile_window
        if profiling:
            if timer is not None:
                timer.paused = True
            profile, outs = profile_steps(engine, 1, device)
            if timer is not None:
                timer.paused = False
        else:
            outs = engine.step()
        new = 0
        finished = False
        counts = [(out.request_id, len(out.outputs[0].token_ids)) for out in outs]
        counts += [(rid, req.seqs[0].num_output_tokens) for rid, req in engine.requests.items()]
        for rid, n in counts:
            new += n - produced.get(rid, 0)
            produced[rid] = n
        finished = any(out.finished for out in outs)
        if t0 is None:
            if len(produced) == len(prompts) and all(produced.values()):
                sync(device)
                t0 = last = time.perf_counter()
                first_window = len(timer.records) if timer is not None else 0
            continue
        sync(device)
        now = time.perf_counter()
        engine_steps += 1
        if profiling:
            profiled_tokens = new
        else:
            clock += now - last
            tokens += new
        last = now
        if finished and full is None:
            full = (clock, tokens, engine_steps - (profile is not None))
            full_windows = len(timer.records) if timer is not None else 0
    if produced != {f"{tag}{i}": output_len for i in range(len(prompts))}:
        raise RuntimeError("the engine did not produce every request's output length exactly")
    assert t0 is not None and full is not None
    full_s, full_tokens, full_steps = full
    forward_steps = full_tokens / len(prompts)  # every sequence decodes one token a forward step
    res: dict[str, Any] = {
        "prefill_s": t0 - t_prefill,
        "decode_s": full_s,
        "engine_steps": full_steps,
        "forward_steps": forward_steps,
        "decode_tokens": full_tokens,
        "decode_tok_s": full_tokens / full_s,
        "ms_per_step": full_s / max(forward_steps, 1e-9) * 1e3,
        "decode_all_s": clock,
        "decode_all_tok_s": tokens / clock,
    }
    if timer is not None:
        res["window_split_ms_per_step"] = timer.summary(first_window, full_windows, full_s)
    if profile is not None:
        # profile_steps gives figures per engine step: back to forward steps (a window is several)
        window_steps = max(profiled_tokens / len(prompts), 1e-9)
        res["profile_ms_per_step"] = {k: v / window_steps for k, v in profile.items()}
    return res


def bench_dtype(args: argparse.Namespace, kv_cache_dtype: str, prompts: list[list[int]]) -> dict[str, Any]:
    counter = PathCounter()
    counter.install()  # before start-up: CUDA graph capture runs the dispatch once per graph
    try:
        engine = make_engine(args, kv_cache_dtype)
        runner: Any = getattr(engine.runner, "runner", engine.runner)
        report = runner.startup_report
        for line in report.log_lines():
            log("  " + line)
        if engine.runner is not runner:
            log("  " + engine.runner.report.log_line())
        layer0 = runner.model.model.layers[0].self_attn
        # warm-up: first kernels, allocator, the eager path's shapes
        warm = [p[: min(len(p), 64)] for p in prompts[: min(4, len(prompts))]]
        decode_run(engine, warm, 4, args.device)
        at_start_up = counter.counts()  # CUDA graph capture and warm-up
        counter.reset()
        replays_before = getattr(engine.runner, "num_replays", 0)
        repeats = []
        timer = WindowTimer(engine, args.device)
        try:
            for r in range(args.repeats):
                window = args.profile_window if r == 0 else None
                repeats.append(
                    decode_run(engine, prompts, args.output_len, args.device, f"r{r}_", window, timer)
                )
                log(
                    f"  {kv_cache_dtype} repeat {r}: {repeats[-1]['decode_tok_s']:.0f} tok/s, "
                    f"{repeats[-1]['ms_per_step']:.2f} ms/step; windows, per step: "
                    f"{_fmt(repeats[-1].get('window_split_ms_per_step', {}))}"
                )
        finally:
            timer.uninstall()
        replays = getattr(engine.runner, "num_replays", 0) - replays_before
        timed = counter.counts()
        res = dict(sorted(repeats, key=lambda x: x["decode_tok_s"])[(len(repeats) - 1) // 2])
        res["repeats_decode_tok_s"] = [x["decode_tok_s"] for x in repeats]
        if "profile_ms_per_step" in repeats[0]:
            res["profile_ms_per_step"] = repeats[0]["profile_ms_per_step"]
            log(f"  {kv_cache_dtype} profile per forward step: {_fmt(res['profile_ms_per_step'])}")
    finally:
        counter.uninstall()
    if any(timed):
        path = PathCounter.describe(*timed)
    else:  # every timed decode step replayed a graph: no Python ran, the capture decided the path
        path = PathCounter.describe(*at_start_up) + " (as captured in the CUDA graphs)"
    mc = runner.model_config
    embed = 0 if mc.tie_word_embeddings else mc.vocab_size * mc.hidden_size * runner.dtype.itemsize
    mean_ctx = args.prompt_len + args.output_len / 2
    bytes_per_step = report.weights_bytes - embed + len(prompts) * mean_ctx * report.kv_bytes_per_token
    res.update(
        kv_cache_dtype=kv_cache_dtype,
        storage_dtype=report.kv_cache_dtype,
        decode_attention_path=path,
        cuda_graph_replays=replays,
        kv_bytes_per_token=report.kv_bytes_per_token,
        kv_cache_tokens=report.kv_cache_tokens,
        k_scale_layer0=float(layer0.k_scale),
        v_scale_layer0=float(layer0.v_scale),
        bytes_per_step=bytes_per_step,
        achieved_gb_s=bytes_per_step / (res["ms_per_step"] / 1e3) / 1e9,
    )
    log(
        f"  {kv_cache_dtype}: decode {res['decode_tok_s']:.0f} tok/s ({res['ms_per_step']:.2f} ms a forward step, "
        f"{res['forward_steps']:.0f} steps in {res['engine_steps']} engine steps; median of "
        f"{len(repeats)}), prefill {res['prefill_s']:.1f} s, path: {res['decode_attention_path']}"
    )
    del engine, runner
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return res


def _fmt(profile: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in profile.items())


def table(results: list[dict[str, Any]]) -> str:
    base = results[0]["decode_tok_s"]
    lines = [
        "| KV cache dtype | storage | decode attention path | KV tokens | decode tok/s (full batch) "
        "| with the drain | ms/step "
        "| bytes/step | GB/s | repeats (tok/s) | kernels ms/step: attention / matmul / other | vs first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        pr = r.get("profile_ms_per_step")
        kernels = (
            f"{pr['attention_ms']:.2f} / {pr['matmul_ms']:.2f} / {pr['other_ms'] + pr['kv_index_ms']:.2f}"
            if pr
            else "-"
        )
        reps = ", ".join(f"{x:.0f}" for x in r["repeats_decode_tok_s"])
        lines.append(
            f"| {r['kv_cache_dtype']} | {r['storage_dtype']} | {r['decode_attention_path']} | "
            f"{r['kv_cache_tokens']:,} | {r['decode_tok_s']:.0f} | {r['decode_all_tok_s']:.0f} | {r['ms_per_step']:.2f} | "
            f"{r['bytes_per_step'] / 1e9:.2f} GB | {r['achieved_gb_s']:.0f} | {reps} | {kernels} | "
            f"{r['decode_tok_s'] / base:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=TARGET_MODEL)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-dtypes", default="auto,fp8_e4m3,fp8_e5m2", help="first one is the baseline")
    parser.add_argument("--num-seqs", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=8000)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=1,
        help="decode steps per scheduler call (multi-step; ms/step stays per forward step)",
    )
    parser.add_argument("--no-calculate-kv-scales", action="store_true", help="fp8 scales stay 1.0")
    parser.add_argument("--repeats", type=int, default=1, help="timed decodes per engine (median reported)")
    parser.add_argument(
        "--profile-window",
        type=int,
        default=None,
        help="profile this engine step of the first timed decode (left out of its timing)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny CPU dry run of the script")
    parser.add_argument("--out", default=None, help="folder for gpu_fp8.json")
    parser.add_argument(
        "--fp8-decode-config",
        default=None,
        help="JSON of a triton_attention.DecodeConfig (gpu_fp8_sweep.py --best-out writes one): one more "
        "fp8_e4m3 run with it as the fp8 decode default; skipped if the file is missing",
    )
    args = parser.parse_args()
    if args.quick:
        args.model, args.device, args.dtype = QUICK_MODEL, "cpu", "float32"
        args.num_seqs, args.prompt_len, args.output_len = 4, 48, 8
        args.max_num_batched_tokens, args.kv_cache_memory_bytes = 256, 64 * 2**20
        torch.set_num_threads(1)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_fp8 needs a CUDA GPU (or --quick for a CPU dry run)")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    log(
        f"torch {torch.__version__}, {name}; {args.model}, {args.num_seqs} x ({args.prompt_len} + {args.output_len})"
    )
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, 256, (args.prompt_len,), generator=gen).tolist() for _ in range(args.num_seqs)
    ]
    results: list[dict[str, Any]] = []
    for kv in args.kv_dtypes.split(","):
        log(f"== kv_cache_dtype {kv}")
        results.append(bench_dtype(args, kv, prompts))
        if args.out:
            payload = {"args": vars(args), "device": name, "runs": results}
            Path(args.out, "gpu_fp8.json").write_text(json.dumps(payload, indent=1))
    if args.fp8_decode_config:
        path = Path(args.fp8_decode_config)
        if not path.exists():
            log(f"{path} not found: no run with another fp8 decode config")
        else:
            from llmdeploy_engine.kernels import triton_attention

            config = triton_attention.DecodeConfig(**json.loads(path.read_text()))
            saved = triton_attention.DECODE_CONFIG[True], triton_attention.FP8_LARGE_BATCH_CONFIG
            # the one configuration for every fp8 batch shape
            triton_attention.DECODE_CONFIG[True] = triton_attention.FP8_LARGE_BATCH_CONFIG = config
            log(f"== kv_cache_dtype fp8_e4m3 with fp8 decode config {config}")
            try:
                res = bench_dtype(args, "fp8_e4m3", prompts)
            finally:
                triton_attention.DECODE_CONFIG[True], triton_attention.FP8_LARGE_BATCH_CONFIG = saved
            res["kv_cache_dtype"] = (
                f"fp8_e4m3 ({config.tile}/{config.num_warps}/{config.num_stages}/{config.fp8_cvt})"
            )
            res["fp8_decode_config"] = vars(config)
            results.append(res)
    print(table(results))


if __name__ == "__main__":
    main()
