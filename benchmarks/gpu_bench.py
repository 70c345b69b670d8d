"""GPU speed of the built-in engine (issue 6): single stream, 256-request throughput, transformers peer.

One call runs everything and prints a table last. Per model (random weights, bf16, architecture from
llmdeploy's catalog, no hub):

- single stream: 128-token prompt, 256 output tokens (greedy, ignore_eos); end-to-end and decode-only
  tok/s, and decode tok/s as a fraction of the HBM roofline = copy bandwidth (measured here, bytes read
  + written over time) / bytes read per token (weights a decode step reads + the mean KV context);
- throughput: N requests (default 256), input and output lengths uniform in [100, 1024] (seed 0),
  ignore_eos, all added at once; output tok/s;
- peer: the same requests (or a stated subset) through transformers `generate` in static batches
  (left padding, max_new_tokens = the batch's longest output), same GPU, same run, same weights;
  useful output tok/s (each request's own output length) and engine / peer ratio;
- where the time goes (the single stream runs twice, with its own prompt each time: the headline
  figures with the timers below bypassed, then under them for the split): host timers around
  schedule / execute / sample for every step (execute split
  into CUDA-graph replays and eager steps), the rest of the step's host time (output processing:
  stop checks, detokenization, RequestOutputs) and the host time per output token outside execute,
  and torch.profiler CUDA kernel time per step by kind (matmul, attention, KV gather/scatter, other);
  and for the throughput run the device's idle time between the engine's launches (`DeviceGaps`:
  CUDA events around every launch and sampler call, the gaps between them on the device).

The engine runs as `LLM.generate` drives it: requests ask for `RequestOutputKind.FINAL_ONLY`. By
default LLMEngine builds its own CUDA graphs on CUDA and attention dispatches pure-decode batches to
the Triton kernel when triton is importable; `--eager` sets `enforce_eager`.
`--num-scheduler-steps N` sets the engine's multi-step decoding (default auto: the engine chooses 1-8
decode steps a window on a CUDA GPU; 1: one decode step per scheduler call); with windows greedy decode
runs up to N steps with one host sync, the timers count a window's time under execute, per-step
figures are per decode step (forward pass), and the throughput profile starts at engine step
`--profile-step` // N (N = 8 with auto). The log lists the windows the 256-request run launched. The throughput figure counts
neither the profiled steps' time nor their tokens; the SM clock and board power are sampled through
the run (a GPU held at its power limit runs below its top clock).

Run from the repository root (GPU machine):

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_bench.py --out $OUT

CPU dry run of the script itself (tiny sizes): `python benchmarks/gpu_bench.py --device cpu --quick`.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


from engine_path import import_engine  # noqa: E402

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.config import EngineConfig, ModelConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

MODELS = {"qwen": "random:Qwen/Qwen2.5-0.5B", "llama": "random:meta-llama/Llama-3.1-8B"}
# transformers generate's generated tokens/s (padding included) measured in run 1 (docs/gpu-notes.md)
PEER_GENERATED_TOK_S = {"qwen": 1909.0, "llama": 622.0}
RESULTS: dict[str, Any] = {}
START = time.perf_counter()


def steps_or_auto(text: str) -> int | None:
    """--num-scheduler-steps: a whole number >= 1, or auto (None: the engine's default)."""
    return None if text == "auto" else int(text)


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth_bytes_per_s(device: str, size_bytes: int) -> float:
    """Device-to-device copy, bytes read + written over the median of 10 timed copies."""
    src = torch.randint(0, 255, (size_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    del src, dst
    times.sort()
    return 2 * size_bytes / times[len(times) // 2]


class ClockSampler:
    """The SM clock (MHz) and board power (W) every `period` seconds on a thread (NVML through
    torch) while the `with` block runs: whether a run held its clock or hit the power limit."""

    def __init__(self, device: str, period: float = 0.05) -> None:
        self.samples: list[tuple[float, int, float]] = []  # (seconds from start, MHz, W)
        self.period = period
        self.on = device == "cuda"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.wait(self.period):
            try:
                self.samples.append((time.perf_counter() - t0, *read_clock()))
            except Exception:  # no NVML: no samples (summary() then says nothing)
                return

    def __enter__(self) -> ClockSampler:
        if self.on:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on:
            self._stop.set()
            self._thread.join()

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        mhz = [m for _, m, _ in self.samples]
        watts = [w for _, _, w in self.samples]
        return {
            "samples": len(mhz),
            "sm_mhz_mean": sum(mhz) / len(mhz),
            "sm_mhz_min": min(mhz),
            "sm_mhz_max": max(mhz),
            "power_w_mean": sum(watts) / len(watts),
            "power_w_max": max(watts),
        }


def read_clock() -> tuple[int, float]:
    """(SM clock MHz, board power W) now, through torch's NVML calls; raises without NVML."""
    return torch.cuda.clock_rate(), torch.cuda.power_draw() / 1000


def gpu_clock() -> str:
    """The SM clock and board power now, or what stopped the reading."""
    if not torch.cuda.is_available():
        return "no GPU clock"
    try:
        mhz, watts = read_clock()
        return f"SM clock {mhz} MHz, {watts:.0f} W"
    except Exception as e:
        return f"no GPU clock ({type(e).__name__})"


# names of the engine's Triton kernels compiled so far in this process, in order (Triton's
# post-compile hook appends them; see watch_compiles). Until v10 StepTimers polled every kernel's
# variant cache before and after each execute call instead: ~13 us a poll on a 2-core CPU, two a
# call, which the single-stream figures counted as host time.
COMPILED: list[str] = []


def watch_compiles() -> None:
    """Record each compilation of an engine Triton kernel in COMPILED (after any hook already set)."""
    try:
        from triton import knobs
    except ImportError:
        return
    previous = knobs.runtime.jit_post_compile_hook
    if getattr(previous, "llmdeploy_watch", False):
        return

    def hook(**kwargs: Any) -> Any:
        fn = kwargs["fn"]
        if str(fn.module).startswith("llmdeploy_engine"):
            COMPILED.append(fn.name)
        return previous(**kwargs) if previous is not None else None

    hook.llmdeploy_watch = True  # type: ignore[attr-defined]
    knobs.runtime.jit_post_compile_hook = hook


class StepTimers:
    """Host wall time of each engine phase, summed over steps (execute waits for its GPU work)."""

    def __init__(self, engine: LLMEngine, device: str) -> None:
        self.totals = {"schedule": 0.0, "execute": 0.0, "sample": 0.0}
        self.execute_split = {"graph": 0.0, "eager": 0.0}  # execute time of replayed / eager steps
        self.eager_steps: list[tuple[int, int, float]] = []  # (tokens, sequences, seconds) of eager steps
        self.compiles: list[tuple[int, float, dict[str, int]]] = []  # (execute call, seconds, new variants)
        self.window_lengths: list[int] = []  # steps of each launched window, in order
        self.steps_seen = 0
        self.steps = 0
        self.forward_steps = 0  # forward passes run (a multi-step window counts each of its steps)
        self.runner = engine.runner
        self.enabled = True  # off during profiled steps, whose time is left out of the run's figures
        self.bypass = False  # the wrapped calls run bare (no timing, no sync): the headline single stream
        wrapped = [
            ("schedule", engine.scheduler, "schedule"),
            ("execute", engine.runner, "execute"),
            ("sample", engine.sampler, "sample"),
        ]
        if engine.num_scheduler_steps > 1:
            wrapped.append(("execute", engine.runner, "execute_multi_step"))
        # asynchronous windows: a launch is timed without a sync (that would serialize the windows),
        # and the wait in its DecodeWindow.result() counts as execute time
        self.launch = getattr(engine, "_async_windows", False)
        if self.launch:
            wrapped.append(("execute", engine.runner, "launch_multi_step"))
        for name, obj, attr in wrapped:
            setattr(obj, attr, self._wrap(name, getattr(obj, attr), device, attr == "launch_multi_step"))

    def _wrap(
        self, name: str, fn: Callable[..., Any], device: str, launch: bool = False
    ) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.bypass:
                return fn(*args, **kwargs)
            replays = getattr(self.runner, "num_replays", 0)
            compiled = len(COMPILED)
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if name == "execute":
                if launch:
                    out.result = self._timed_result(out.result)
                    if self.enabled:
                        self.window_lengths.append(args[1])
                else:
                    sync(device)
                self.forward_steps += args[1] if len(args) > 1 else 1  # execute_multi_step(batch, n)
            dt = time.perf_counter() - t0
            if not self.enabled:
                return out
            self.totals[name] += dt
            if name == "execute":
                replayed = getattr(self.runner, "num_replays", 0) != replays
                self.execute_split["graph" if replayed else "eager"] += dt
                if not replayed and args and hasattr(args[0], "num_tokens"):
                    self.eager_steps.append((args[0].num_tokens, args[0].num_seqs, dt))
                new: dict[str, int] = {}
                for kernel in COMPILED[compiled:]:
                    new[kernel] = new.get(kernel, 0) + 1
                if new:
                    self.compiles.append((self.steps_seen, dt, new))
            if name == "execute":
                self.steps_seen += 1
            return out

        return timed

    def _timed_result(self, result: Callable[[], Any]) -> Callable[[], Any]:
        def timed() -> Any:
            t0 = time.perf_counter()
            ids = result()
            if self.enabled:
                dt = time.perf_counter() - t0
                self.totals["execute"] += dt
                self.execute_split["graph"] += dt
            return ids

        return timed

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.totals, 0.0)
        self.execute_split = dict.fromkeys(self.execute_split, 0.0)
        self.eager_steps = []
        self.compiles = []
        self.window_lengths = []
        self.steps = 0

    def host_split(self, elapsed: float, tokens: int) -> dict[str, float]:
        """Seconds per phase, the rest of the host time, and host microseconds per output token."""
        rest = elapsed - sum(self.totals.values())
        host = elapsed - self.totals["execute"]
        return {
            **self.totals,
            "execute_graph": self.execute_split["graph"],
            "execute_eager": self.execute_split["eager"],
            "rest": rest,
            "eager_steps": len(self.eager_steps),
            "eager_tokens": sum(t for t, _, _ in self.eager_steps),
            "host_us_per_token": host / tokens * 1e6,
            "rest_us_per_token": rest / tokens * 1e6,
        }


class DeviceGaps:
    """Device time with no engine work queued: a CUDA event is recorded on the current stream before
    and after every runner launch (execute, launch_multi_step) and sampler call, and the time from
    one call's end event to the next call's start event on the device is idle time (a start event
    recorded while the device still runs earlier work completes right after it: gap ~0). Under
    asynchronous windows this says whether the host's work between windows leaves the device idle,
    which the host timers cannot. CUDA only; calls while `active()` is false (profiled steps) break
    the chain, so no gap spans them."""

    def __init__(self, engine: LLMEngine, timers: StepTimers) -> None:
        self.timers = timers  # its calls are recorded while it times them (not bypassed, not profiling)
        self.calls: list[tuple[str, Any, Any, bool]] = []  # (kind, start, end, first after a break)
        self._broken = True
        targets = [("execute", engine.runner, "execute"), ("sample", engine.sampler, "sample")]
        if hasattr(engine.runner, "launch_multi_step"):
            targets.append(("window", engine.runner, "launch_multi_step"))
        for kind, obj, attr in targets:
            setattr(obj, attr, self._wrap(kind, getattr(obj, attr)))

    def _wrap(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if not self.timers.enabled or self.timers.bypass:
                self._broken = True
                return fn(*args, **kwargs)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            if kind == "execute" and args and hasattr(args[0], "num_tokens"):
                kind_now = "eager" if args[0].num_tokens > args[0].num_seqs else "decode"
            else:
                kind_now = kind
            self.calls.append((kind_now, start, end, self._broken))
            self._broken = False
            return out

        return recorded

    def reset(self) -> None:
        self.calls = []
        self._broken = True

    def summary(self) -> dict[str, Any]:
        """Idle ms in all, by the kind of call that followed the gap, the span the calls cover, and
        the largest gaps (index, kind before -> after, ms)."""
        torch.cuda.synchronize()
        idle = 0.0
        by_next: dict[str, float] = {}
        gaps: list[tuple[float, int, str]] = []
        span = 0.0
        seg_start = None
        for i, (kind, start, _end, first) in enumerate(self.calls):
            if first:
                if seg_start is not None:
                    span += seg_start.elapsed_time(self.calls[i - 1][2])
                seg_start = start
                continue
            gap = self.calls[i - 1][2].elapsed_time(start)
            idle += gap
            by_next[kind] = by_next.get(kind, 0.0) + gap
            gaps.append((gap, i, f"{self.calls[i - 1][0]}->{kind}"))
        if seg_start is not None:
            span += seg_start.elapsed_time(self.calls[-1][2])
        gaps.sort(reverse=True)
        return {
            "calls": len(self.calls),
            "span_ms": span,
            "idle_ms": idle,
            "idle_ms_before": by_next,
            "gaps_over_0.1ms": sum(1 for g, _, _ in gaps if g > 0.1),
            "largest": [(i, k, round(g, 2)) for g, i, k in gaps[:8]],
        }


class EagerPhases:
    """Host time of an eager step's phases (the runner's metadata build, the model's forward call,
    the LM head call) and the wait for the GPU after them, summed over steps with more than one
    token: forward call ~ wall means the step is host-bound (launches), a long wait GPU-bound."""

    def __init__(self, engine: LLMEngine, device: str) -> None:
        from llmdeploy_engine.runner import model_runner

        runner: Any = getattr(engine.runner, "runner", engine.runner)
        self.device = device
        self.totals = {"metadata": 0.0, "forward_call": 0.0, "logits_call": 0.0, "gpu_wait": 0.0}
        self.steps = 0
        self.active = False
        build = model_runner.build_attention_metadata
        forward, logits = runner.model.forward, runner.model.compute_logits
        execute = runner.execute

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                if self.active:
                    self.totals[name] += time.perf_counter() - t0
                return out

            return wrapper

        def timed_execute(batch: Any) -> Any:
            self.active = batch.num_tokens > batch.num_seqs  # steps with a prefill chunk
            out = execute(batch)
            if self.active:
                t0 = time.perf_counter()
                sync(self.device)
                self.totals["gpu_wait"] += time.perf_counter() - t0
                self.steps += 1
            self.active = False
            return out

        model_runner.build_attention_metadata = timed("metadata", build)  # type: ignore[assignment]
        runner.model.forward = timed("forward_call", forward)
        runner.model.compute_logits = timed("logits_call", logits)
        runner.execute = timed_execute

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.totals, 0.0)
        self.steps = 0

    def summary(self) -> dict[str, float]:
        return {f"{k}_ms": v / max(1, self.steps) * 1e3 for k, v in self.totals.items()} | {
            "steps": self.steps
        }


def kernel_kind(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("fmha", "flash", "attention", "attn", "paged_decode")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "xmma", "cublas", "cutlass", "matmul", "splitk")):
        return "matmul"
    if "index" in n or "gather" in n or "scatter" in n:
        return "kv_index"
    return "other"


def profile_steps(
    engine: LLMEngine,
    num_steps: int,
    device: str,
    timers: StepTimers | None = None,
    top_kernels: int = 0,
) -> tuple[dict[str, float], list[Any]]:
    """CUDA kernel time per step by kind, and host wall per step, over num_steps profiled engine steps;
    with timers, "per step" is per forward pass (a multi-step window is several). top_kernels > 0 also
    logs that many kernel names by time, with their count and us per step."""
    forward_before = timers.forward_steps if timers is not None else 0
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    outputs: list[Any] = []
    with profile(activities=acts) as prof:
        for _ in range(num_steps):
            outputs += engine.step()
        sync(device)
    wall = time.perf_counter() - t0
    if timers is not None:
        num_steps = max(1, timers.forward_steps - forward_before)
    kinds = {"matmul": 0.0, "attention": 0.0, "kv_index": 0.0, "other": 0.0}
    launches = 0
    by_name: dict[str, list[float]] = {}  # kernel name -> [count, us]
    for ev in prof.events():
        if ev.device_type == DeviceType.CUDA:
            kinds[kernel_kind(ev.name)] += ev.time_range.elapsed_us() * 1e-6
            launches += 1
            entry = by_name.setdefault(ev.name, [0, 0.0])
            entry[0] += 1
            entry[1] += ev.time_range.elapsed_us()
    for name, (count, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top_kernels]:
        log(f"    {count / num_steps:7.1f}/step {us / num_steps:9.1f} us/step  {name[:110]}")
    out = {f"{k}_ms": v / num_steps * 1e3 for k, v in kinds.items()}
    out["kernels_total_ms"] = sum(kinds.values()) / num_steps * 1e3
    out["wall_profiled_ms"] = wall / num_steps * 1e3
    out["kernels_per_step"] = launches / num_steps
    return out, outputs


def make_engine(
    model: str,
    device: str,
    max_model_len: int,
    max_batched: int,
    eager: bool,
    num_scheduler_steps: int = 1,
    kv_cache_dtype: str = "auto",
    async_scheduling: bool | None = None,
    block_size: int = 16,
) -> LLMEngine:
    config = EngineConfig(
        model=model,
        device=device,
        dtype="bfloat16",
        max_model_len=max_model_len,
        max_num_batched_tokens=max_batched,
        kv_cache_memory_bytes=2**30 if device == "cpu" else None,
        gpu_memory_utilization=0.9,
        seed=0,
        enforce_eager=eager,
        num_scheduler_steps=num_scheduler_steps,
        kv_cache_dtype=kv_cache_dtype,
        async_scheduling=async_scheduling,
        block_size=block_size,
    )
    return LLMEngine(config)


def single_stream(
    engine: LLMEngine, request_id: str, prompt: list[int], out_len: int, device: str
) -> tuple[float, float, float]:
    """One greedy request of out_len tokens (ignore_eos) alone: (start, first token, end) times."""
    params = SamplingParams(
        max_tokens=out_len, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY
    )
    engine.add_request(request_id, prompt, params)
    t_start = time.perf_counter()
    t_first = None
    while engine.has_unfinished_requests():
        engine.step()
        if t_first is None:
            sync(device)
            t_first = time.perf_counter()
    sync(device)
    assert t_first is not None
    return t_start, t_first, time.perf_counter()


def run_requests(
    engine: LLMEngine,
    prompts: list[list[int]],
    out_lens: list[int],
    profile_at: list[int],
    device: str,
    timers: StepTimers | None = None,
    top_kernels: int = 0,
) -> tuple[float, int, list[dict[str, float]]]:
    """Add all requests at once, step to the end; (seconds, output tokens made in those seconds, a
    profile of 3 engine steps from each step in profile_at). The profiled steps are left out of the
    seconds, the timers and the tokens (before run 46 their tokens were counted: the rate came out
    ~4 % high with one profile of 240 running sequences)."""
    for i, (ids, n) in enumerate(zip(prompts, out_lens, strict=True)):
        params = SamplingParams(
            max_tokens=n, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY
        )
        engine.add_request(f"r{i}", ids, params)
    produced: dict[str, int] = {}
    profs: list[dict[str, float]] = []
    profiled_tokens = 0
    steps = 0
    sync(device)
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        if steps in profile_at:
            p0 = time.perf_counter()
            if timers is not None:
                timers.enabled = False
            running = len(engine.scheduler.running)
            seqs = [*engine.scheduler.running, *engine.scheduler.waiting]
            before = [s.num_output_tokens for s in seqs]
            log(
                f"  throughput profile from engine step {steps} ({running} sequences running; {gpu_clock()}):"
            )
            prof, outs = profile_steps(engine, 3, device, timers, top_kernels)
            made = sum(s.num_output_tokens - b for s, b in zip(seqs, before, strict=True))
            profiled_tokens += made
            profs.append({"engine_step": steps, "running": running, "tokens": made, **prof})
            if timers is not None:
                timers.enabled = True
            t0 += time.perf_counter() - p0
            steps += 3
        else:
            outs = engine.step()
            steps += 1
        for out in outs:
            if out.finished:
                produced[out.request_id] = len(out.outputs[0].token_ids)
    sync(device)
    elapsed = time.perf_counter() - t0
    want = {f"r{i}": n for i, n in enumerate(out_lens)}
    if produced != want:
        raise RuntimeError("engine did not produce every request's output length exactly")
    return elapsed, sum(out_lens) - profiled_tokens, profs


def decode_bytes_per_token(mc: ModelConfig, weights_bytes: int, kv_bytes_per_token: int, ctx: float) -> float:
    """Bytes one single-stream decode step reads: every weight except the input embedding table (one row
    is read; a tied table is read whole as lm_head), plus the KV cache of the context."""
    embed_bytes = mc.vocab_size * mc.hidden_size * 2
    read = weights_bytes - (0 if mc.tie_word_embeddings else embed_bytes)
    return read + kv_bytes_per_token * ctx


def hf_model(mc: ModelConfig, state: dict[str, torch.Tensor], device: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(
        mc.architecture,
        vocab_size=mc.vocab_size,
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_hidden_layers,
        num_attention_heads=mc.num_attention_heads,
        num_key_value_heads=mc.num_key_value_heads,
        head_dim=mc.head_dim,
        max_position_embeddings=mc.max_position_embeddings,
        rms_norm_eps=mc.rms_norm_eps,
        tie_word_embeddings=mc.tie_word_embeddings,
    )
    rope: dict[str, Any] = {"rope_type": mc.rope_scaling.rope_type, "rope_theta": mc.rope_theta}
    if mc.rope_scaling.rope_type == "llama3":
        rs = mc.rope_scaling
        rope.update(
            factor=rs.factor,
            low_freq_factor=rs.low_freq_factor,
            high_freq_factor=rs.high_freq_factor,
            original_max_position_embeddings=rs.original_max_position_embeddings,
        )
    hf_config.rope_parameters = rope
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16, attn_implementation="sdpa")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.eval()


def hf_generate(
    model: Any, prompts: list[list[int]], out_lens: list[int], batch: int, device: str
) -> dict[str, Any]:
    """Static batches in request order; useful tokens = each request's own output length."""
    useful = generated = 0
    sync(device)
    t0 = time.perf_counter()
    for b in range(0, len(prompts), batch):
        ps, ns = prompts[b : b + batch], out_lens[b : b + batch]
        width = max(len(p) for p in ps)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=device)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max(ns),
                min_new_tokens=max(ns),
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
        assert out.shape[1] == width + max(ns)
        useful += sum(ns)
        generated += len(ps) * max(ns)
    sync(device)
    elapsed = time.perf_counter() - t0
    return {
        "requests": len(prompts),
        "batch": batch,
        "seconds": elapsed,
        "useful_tok_s": useful / elapsed,
        "generated_tok_s": generated / elapsed,
    }


def bench_model(key: str, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    model = MODELS[key] if not args.quick else "random:HuggingFaceTB/SmolLM2-135M-Instruct"
    res: dict[str, Any] = {"model": model}
    dev = args.device
    engine = make_engine(
        model,
        dev,
        2048,
        args.max_num_batched_tokens,
        args.eager,
        args.num_scheduler_steps,
        args.kv_cache_dtype,
        args.async_scheduling,
        args.block_size,
    )
    res["kv_cache_dtype"] = args.kv_cache_dtype
    res["block_size"] = args.block_size
    res["async_scheduling"] = bool(getattr(engine, "_async_windows", False))
    runner: Any = getattr(engine.runner, "runner", engine.runner)  # the ModelRunner under any wrapper
    for line in runner.startup_report.log_lines():
        log("  " + line)
    mc, rep = runner.model_config, runner.startup_report
    graphs: Any = None
    if engine.runner is not runner:  # the engine built its own CUDA graphs
        graphs = engine.runner
        res["cuda_graphs"] = graphs.report.log_line()
        log("  " + res["cuda_graphs"])
        res["cuda_graph_gib"] = rep.cuda_graph_bytes / 2**30
        res["cuda_graph_reserved_gib"] = rep.cuda_graph_reserved_bytes / 2**30
    phases = EagerPhases(engine, dev) if args.eager_phases else None
    timers = StepTimers(engine, dev)
    gaps = DeviceGaps(engine, timers) if dev == "cuda" else None
    gen = torch.Generator().manual_seed(0)

    # warm-up (first kernels, allocator, and the Triton kernels' compiled variants of mixed
    # prefill + decode steps: 16 prompts of the throughput run's length range, another seed)
    run_requests(engine, [torch.randint(0, 256, (64,), generator=gen).tolist()] * 4, [8] * 4, [], dev)
    warm_lens = torch.randint(100, 1025, (16,), generator=torch.Generator().manual_seed(2)).tolist()
    warm_prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in warm_lens]
    run_requests(engine, warm_prompts, [16] * 16, [], dev)
    # the compile hook's own check: start-up and warm-up compile the engine's kernels, so on a GPU
    # this is > 0 unless the hook is not called
    log(f"  Triton compilations the hook saw up to the end of the warm-up: {len(COMPILED)}")

    # single stream: timed twice, each with its own prompt (no prefix-cache hit). The headline figures
    # come from the first, with the step timers bypassed (their wrappers and syncs are the benchmark's
    # host work, not the engine's); the second, timed per phase, gives the host split.
    prompt_len, out_len = 128, args.single_tokens
    prompt = torch.randint(0, 256, (prompt_len,), generator=gen).tolist()
    timers.bypass = True
    t_start, t_first, t_end = single_stream(engine, "single", prompt, out_len, dev)
    timers.bypass = False
    timers.reset()
    prompt2 = torch.randint(0, 256, (prompt_len,), generator=gen).tolist()
    t2_start, t2_first, t2_end = single_stream(engine, "single-timed", prompt2, out_len, dev)
    e2e = out_len / (t_end - t_start)
    decode = (out_len - 1) / (t_end - t_first)
    per_tok = decode_bytes_per_token(mc, rep.weights_bytes, rep.kv_bytes_per_token, prompt_len + out_len / 2)
    roofline = bandwidth / per_tok
    split = {k: v / out_len * 1e3 for k, v in timers.totals.items()}
    host_split = timers.host_split(t2_end - t2_start, out_len)
    res["single"] = {
        "timed_e2e_tok_s": out_len / (t2_end - t2_start),  # the second run, under the step timers
        "timed_decode_tok_s": (out_len - 1) / (t2_end - t2_first),
        "host_us_per_token": host_split["host_us_per_token"],
        "rest_us_per_token": host_split["rest_us_per_token"],
        "e2e_tok_s": e2e,
        "decode_tok_s": decode,
        "roofline_tok_s": roofline,
        "roofline_fraction": decode / roofline,
        "bytes_per_token": per_tok,
        "ms_per_step": {**split, "step_total": (t2_end - t2_start) / out_len * 1e3},
    }
    log(
        f"  single stream: {e2e:.0f} tok/s end to end, {decode:.0f} tok/s decode, roofline {roofline:.0f} "
        f"tok/s ({per_tok / 1e9:.2f} GB/token) -> {decode / roofline:.1%}; ms/step {res['single']['ms_per_step']}; "
        f"host outside execute {host_split['host_us_per_token']:.0f} us/token; under the step timers "
        f"{res['single']['timed_e2e_tok_s']:.0f} / {res['single']['timed_decode_tok_s']:.0f} tok/s"
    )
    # profile of single-stream decode steps (separate short request)
    engine.add_request(
        "single-prof",
        prompt,
        # 8 engine steps of warm-up, 5 profiled, each up to num_scheduler_steps tokens
        SamplingParams(
            max_tokens=13 * engine.num_scheduler_steps + 11,
            ignore_eos=True,
            temperature=0.0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        ),
    )
    for _ in range(8):
        engine.step()
    log("  single-stream decode step, top kernels by time (count/step, us/step, name):")
    res["single"]["profile_ms_per_step"] = profile_steps(engine, 5, dev, timers, top_kernels=25)[0]
    while engine.has_unfinished_requests():
        engine.step()
    log(f"  single-stream decode step profile: {res['single']['profile_ms_per_step']}")

    if key not in args.throughput_models.split(","):
        del engine, runner, timers, graphs, gaps
        gc.collect()
        return res
    # throughput
    n = args.num_requests
    in_lens = torch.randint(100, 1025, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    out_lens = torch.randint(100, 1025, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    if args.quick:
        in_lens, out_lens = [x // 16 for x in in_lens], [x // 32 for x in out_lens]
    pg = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (m,), generator=pg).tolist() for m in in_lens]
    timers.reset()
    if phases is not None:
        phases.reset()
    if gaps is not None:
        gaps.reset()
    # auto windows: divided by the longest window the engine may choose
    profile_at = [max(1, int(s) // engine.num_scheduler_steps) for s in args.profile_step.split(",")]
    windows_before = dict(engine.num_windows_by_steps)
    with ClockSampler(dev) as clocks:
        elapsed, tokens, profs = run_requests(
            engine, prompts, out_lens, profile_at, dev, timers, args.profile_top
        )
    windows = {
        k: v - windows_before.get(k, 0)
        for k, v in sorted(engine.num_windows_by_steps.items())
        if v > windows_before.get(k, 0)
    }
    log(f"  decode windows launched in the run, by steps: {windows}")
    runs = [(k, len(list(g))) for k, g in itertools.groupby(timers.window_lengths)]
    log("  window lengths in launch order (steps x windows): " + " ".join(f"{k}x{c}" for k, c in runs))
    prof = profs[0] if profs else None
    if clocks.samples:
        log(f"  SM clock and board power during the run: {clocks.summary()}")
    res["throughput"] = {
        "requests": n,
        "seconds": elapsed,
        "output_tok_s": tokens / elapsed,  # the profiled steps' time and tokens left out
        "prompt_tokens": sum(in_lens),
        "output_tokens": sum(out_lens),
        "timed_tokens": tokens,  # made outside the profiled steps
        "host_s": timers.host_split(elapsed, tokens),
        "profile_ms_per_step": prof,
        "profiles": profs,
        "clock": clocks.summary(),
        "clock_samples": clocks.samples,
        "windows_by_steps": windows,
        "eager_steps": [list(x) for x in timers.eager_steps],  # (tokens, sequences, seconds) each
        "triton_compiles": [list(x) for x in timers.compiles],  # (execute call, seconds, new variants)
    }
    log(f"  Triton kernels compiled during the run (execute call, s, kernels): {timers.compiles}")
    if gaps is not None:
        res["throughput"]["device_gaps"] = gaps.summary()
        log(f"  device idle between the engine's launches in the run: {res['throughput']['device_gaps']}")
    if phases is not None:
        res["throughput"]["eager_phases"] = phases.summary()
        log(f"  eager steps with prefill chunks, host ms per step: {phases.summary()}")
    log(
        "  eager steps (tokens/seqs/ms): "
        + " ".join(f"{t}/{q}/{dt * 1e3:.1f}" for t, q, dt in timers.eager_steps[:60])
    )
    log(
        f"  throughput: {n} requests, {sum(out_lens)} output tokens ({tokens} outside the profiled steps) in "
        f"{elapsed:.1f} s -> {tokens / elapsed:.0f} tok/s; "
        f"host split {res['throughput']['host_s']}; profiles: {profs}"
    )

    # peer: transformers generate on the same weights
    state = {k: v for k, v in runner.model.hf_state_dict().items()}
    del engine, runner, timers, graphs, gaps
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    k = min(n, args.hf_requests[key])
    # the peer's duration from run 1's generated tok/s (padding included) on the H200, plus 10 %
    lens = out_lens[:k]
    peer_gen = sum(
        len(lens[b : b + args.hf_batch]) * max(lens[b : b + args.hf_batch])
        for b in range(0, k, args.hf_batch)
    )
    peer_est = 1.1 * peer_gen / PEER_GENERATED_TOK_S.get(key, 600.0) + 20.0  # + model build, warm-up
    elapsed_so_far = time.perf_counter() - START
    if args.no_peer or elapsed_so_far + peer_est > args.budget_s:
        res["peer"] = None
        log(
            f"  peer skipped (--no-peer, or {elapsed_so_far:.0f} s so far + ~{peer_est:.0f} s estimated "
            f"> budget {args.budget_s:.0f} s)"
        )
        return res
    hf = hf_model(mc, state, dev)
    del state
    hf_generate(hf, [prompts[0][:32]], [4], 1, dev)  # warm-up
    peer = hf_generate(hf, prompts[:k], out_lens[:k], args.hf_batch, dev)
    peer["ratio"] = res["throughput"]["output_tok_s"] / peer["useful_tok_s"]
    res["peer"] = peer
    log(f"  transformers peer: {peer}")
    del hf
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


def table(
    bandwidth: float,
    num_scheduler_steps: int | None = 1,
    kv_cache_dtype: str = "auto",
    async_scheduling: bool = False,
) -> str:
    asynchronous = "on" if async_scheduling else "off"
    lines = [
        f"built-in engine, num_scheduler_steps {num_scheduler_steps or 'auto'}, async scheduling "
        f"{asynchronous}, kv_cache_dtype {kv_cache_dtype}"
        + (" (per-step figures are per decode step)" if num_scheduler_steps != 1 else ""),
        "",
        f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read+write)",
        "",
        "| model | workload | figure | value |",
        "|---|---|---|---|",
    ]
    for key, r in RESULTS.items():
        s, t, p = r["single"], r.get("throughput"), r.get("peer")
        if "cuda_graphs" in r:
            lines.append(f"| {key} | start-up | CUDA graphs | {r['cuda_graphs']} |")
            lines.append(
                f"| {key} | start-up | CUDA graph GiB measured / set aside | "
                f"{r['cuda_graph_gib']:.2f} / {r['cuda_graph_reserved_gib']:.2f} |"
            )
        lines += [
            f"| {key} | single stream | tok/s end to end / decode | {s['e2e_tok_s']:.0f} / {s['decode_tok_s']:.0f} |",
            f"| {key} | single stream | decode / HBM roofline | {s['roofline_fraction']:.1%} of {s['roofline_tok_s']:.0f} tok/s |",
            f"| {key} | single stream | under the step timers: tok/s end to end / decode | "
            f"{s['timed_e2e_tok_s']:.0f} / {s['timed_decode_tok_s']:.0f} |",
            f"| {key} | single stream | host ms/step schedule/execute/sample/total | "
            + " / ".join(f"{v:.2f}" for v in s["ms_per_step"].values())
            + " |",
            f"| {key} | single stream | GPU kernel ms/step (matmul/attn/kv_index/other) | "
            + " / ".join(
                f"{s['profile_ms_per_step'][x + '_ms']:.2f}"
                for x in ("matmul", "attention", "kv_index", "other")
            )
            + f" of {s['profile_ms_per_step']['wall_profiled_ms']:.2f} wall |",
            f"| {key} | single stream | host us/token outside execute (of it: after sampling) | "
            f"{s['host_us_per_token']:.0f} ({s['rest_us_per_token']:.0f}) |",
        ]
        if t is None:
            continue
        lines.append(
            f"| {key} | {t['requests']} requests | output tok/s | {t['output_tok_s']:.0f} ({t['seconds']:.1f} s) |"
        )
        c = t.get("clock") or {}
        if c:
            lines.append(
                f"| {key} | {t['requests']} requests | SM clock MHz mean (min-max) / board W mean (max) | "
                f"{c['sm_mhz_mean']:.0f} ({c['sm_mhz_min']}-{c['sm_mhz_max']}) / "
                f"{c['power_w_mean']:.0f} ({c['power_w_max']:.0f}) |"
            )
        if t.get("windows_by_steps"):
            w = t["windows_by_steps"]
            lines.append(
                f"| {key} | {t['requests']} requests | decode windows by steps (mean steps) | "
                + ", ".join(f"{k}: {v}" for k, v in w.items())
                + f" ({sum(k * v for k, v in w.items()) / sum(w.values()):.2f}) |"
            )
        h = t["host_s"]
        lines.append(
            f"| {key} | {t['requests']} requests | host s schedule / execute (graph + eager) / sample / rest | "
            f"{h['schedule']:.2f} / {h['execute']:.2f} ({h['execute_graph']:.2f} + {h['execute_eager']:.2f}) / "
            f"{h['sample']:.2f} / {h['rest']:.2f} |"
        )
        lines.append(
            f"| {key} | {t['requests']} requests | host us/token outside execute (of it: rest) | "
            f"{h['host_us_per_token']:.1f} ({h['rest_us_per_token']:.1f}) |"
        )
        if t["profile_ms_per_step"]:
            pr = t["profile_ms_per_step"]
            lines.append(
                f"| {key} | {t['requests']} requests | GPU kernel ms/step (matmul/attn/kv_index/other) | "
                + " / ".join(f"{pr[x + '_ms']:.2f}" for x in ("matmul", "attention", "kv_index", "other"))
                + f" of {pr['wall_profiled_ms']:.2f} wall |"
            )
        if p:
            lines.append(
                f"| {key} | transformers, {p['requests']} requests, batch {p['batch']} | useful tok/s; engine/peer | "
                f"{p['useful_tok_s']:.0f}; {p['ratio']:.2f}x |"
            )
        else:
            lines.append(f"| {key} | transformers | skipped (--no-peer or time budget) | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen,llama")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--single-tokens", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--hf-batch", type=int, default=128)
    parser.add_argument("--hf-requests", default="qwen=256,llama=128", help="peer subset per model")
    parser.add_argument(
        "--profile-step",
        default="300",
        help="throughput steps to profile, comma-separated (3 engine steps from each step // N)",
    )
    parser.add_argument(
        "--profile-top", type=int, default=0, help="log this many kernels by time in each throughput profile"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=570.0,
        help="skip a peer whose estimated end (run 1's peer rates) falls after this many seconds",
    )
    parser.add_argument("--eager", action="store_true", help="enforce_eager: no CUDA graphs")
    parser.add_argument(
        "--num-scheduler-steps",
        type=steps_or_auto,
        default=None,
        help="the engine's num_scheduler_steps: decode steps per scheduler call with one host sync (1: off; "
        "default auto: the engine chooses 1-8 a window on a CUDA GPU)",
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the engine's async_scheduling: launch the next decode window before the last one's tokens "
        "are processed (default: the engine's auto, on on a CUDA GPU or with --num-scheduler-steps > 1)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="the default now (the engine builds its graphs); accepted for older command lines",
    )
    parser.add_argument(
        "--triton-attention",
        action="store_true",
        help="the default now (attention dispatches to the kernel); accepted for older command lines",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="the engine's kv_cache_dtype (auto: the model's bf16; fp8_e4m3 / fp8_e5m2: the FP8 KV cache)",
    )
    parser.add_argument(
        "--block-size", type=int, default=16, help="the engine's block_size (tokens per KV block)"
    )
    parser.add_argument("--throughput-models", default="qwen,llama")
    parser.add_argument("--no-peer", action="store_true", help="skip the transformers peer")
    parser.add_argument(
        "--eager-phases",
        action="store_true",
        help="time the host phases of eager steps with prefill chunks (adds a sync after each)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny CPU dry run of the script")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.hf_requests = {k: int(v) for k, v in (x.split("=") for x in args.hf_requests.split(","))}
    if args.quick:
        args.num_requests, args.single_tokens, args.profile_step = 8, 16, "5"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_bench needs a CUDA GPU (or --device cpu --quick for a dry run)")
    import transformers

    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {name}")
    switches = (
        "LLMDEPLOY_PDL",
        "LLMDEPLOY_FUSED_GEMV",
        "LLMDEPLOY_FUSED_DECODE",
        "LLMDEPLOY_DECODE_MERGE",
        "LLMDEPLOY_FAST_ARGMAX",
    )
    log("engine switches: " + ", ".join(f"{k}={os.environ.get(k, '(default)')}" for k in switches))
    watch_compiles()
    bandwidth = copy_bandwidth_bytes_per_s(args.device, 2**32 if args.device == "cuda" else 2**26)
    log(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s")
    for key in args.models.split(","):
        log(f"== {key}")
        RESULTS[key] = bench_model(key, args, bandwidth)
        if args.out:
            Path(args.out, "gpu_bench.json").write_text(
                json.dumps(
                    {"bandwidth": bandwidth, "num_scheduler_steps": args.num_scheduler_steps, **RESULTS},
                    indent=1,
                )
            )
    # the engines' own decision (auto: on with windows > 1 or on a CUDA device)
    decided = {r.get("async_scheduling") for r in RESULTS.values()}
    print(table(bandwidth, args.num_scheduler_steps, args.kv_cache_dtype, decided == {True}))


if __name__ == "__main__":
    main()
