"""Host cost per output token of LLMEngine's Python, measured on CPU with a near-free fake model.

The runner is a stand-in that returns one-hot logits (next token = a hash of the sequence's last
ids) without any model, so what is timed is the engine around it: scheduling, building the
ForwardBatch, sampling (the real `Sampler`, on a small vocabulary), stop checks, detokenization
(the real byte-level tokenizer the engine uses for random-weight models) and RequestOutputs. The
runner's own time is measured and left out.

Workload: N requests (default 256) of P prompt tokens, each generating exactly T tokens (ignore_eos,
greedy), all added at once, driven like `LLM.generate` (`--output-kind final`, what it asks for) or
like a streaming server (`--output-kind cumulative`, the engine's behaviour before output kinds).

    python benchmarks/host_overhead.py                               # final_only and cumulative
    python benchmarks/host_overhead.py --num-requests 64 --output-len 64 --output-kind final
    python benchmarks/host_overhead.py --num-scheduler-steps 1,8     # multi-step decoding off / N = 8
    python benchmarks/host_overhead.py --async-scheduling on         # one-step asynchronous windows

With `--num-scheduler-steps N` > 1 the engine runs decode windows of up to N steps through the
runner's `execute_multi_step` (the same next-token rule, fed forward in the runner), so scheduling,
batch building and the output path run once per window instead of once per step. `--decode-only`
times only the steps after every prompt is prefilled, and adds ms per engine step (a window) with its
reservation (`Scheduler.reserve_decode_window`) and output (`LLMEngine._process_window`) parts:

    python benchmarks/host_overhead.py --num-requests 256 --prompt-len 560 --output-len 560 \
        --num-scheduler-steps 8 --output-kind final --decode-only
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.model.sampler import Sampler
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams

KINDS = {
    "final": RequestOutputKind.FINAL_ONLY,
    "cumulative": RequestOutputKind.CUMULATIVE,
    "delta": RequestOutputKind.DELTA,
}


class FastRunner:
    """Paged-runner contract with no model: one-hot float32 logits, one tensor op per step."""

    def __init__(self, vocab: int, num_kv_blocks: int, block_size: int, max_model_len: int) -> None:
        self.vocab = vocab
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.device = torch.device("cpu")
        self.seconds = 0.0

    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        start = time.perf_counter()
        rows = batch.logit_rows()
        nxt = torch.tensor([(batch.input_ids[r] * 31 + batch.positions[r]) % 200 + 32 for r in rows])
        logits = torch.zeros(len(rows), self.vocab)
        logits[torch.arange(len(rows)), nxt] = 1.0
        self.seconds += time.perf_counter() - start
        return logits

    def execute_multi_step(self, batch: ForwardBatch, num_steps: int) -> list[list[int]]:
        """A decode window: the same rule as `execute`, each step fed the previous step's tokens."""
        start = time.perf_counter()
        ids, sampled = list(batch.input_ids), []
        for k in range(num_steps):
            ids = [(t * 31 + p + k) % 200 + 32 for t, p in zip(ids, batch.positions, strict=True)]
            sampled.append(ids)
        self.seconds += time.perf_counter() - start
        return sampled

    def launch_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: Any = None,
        seed: Any = None,
        follow: Any = None,
        follow_rows: list[int] | None = None,
    ) -> DoneWindow:
        """Asynchronous scheduling's launch: the window runs at once (as on a CPU); a follow-on takes
        its step-0 ids from the window it follows."""
        if follow is not None:
            assert follow_rows is not None
            batch = ForwardBatch(**{**vars(batch), "input_ids": [follow.last_ids[r] for r in follow_rows]})
        return DoneWindow(self.execute_multi_step(batch, num_steps))


class DoneWindow:
    """multi_step.DecodeWindow's interface over ids that are already there."""

    def __init__(self, sampled: list[list[int]]) -> None:
        self.sampled = sampled
        self.last_ids = sampled[-1]

    def result(self) -> list[list[int]]:
        return self.sampled


def run(
    args: argparse.Namespace,
    kind: RequestOutputKind,
    num_scheduler_steps: int = 1,
    asynchronous: bool | None = None,
) -> dict[str, float]:
    tokenizer = Tokenizer.byte_level()
    vocab = int(tokenizer.vocab_size)
    max_len = args.prompt_len + args.output_len + 16
    blocks_per_seq = -(-max_len // 16)
    runner = FastRunner(vocab, args.num_requests * blocks_per_seq + 16, 16, max_len)
    engine = LLMEngine(
        EngineConfig(
            model="fake",
            max_num_seqs=args.num_requests,
            max_num_batched_tokens=8192,
            num_scheduler_steps=num_scheduler_steps,
            async_scheduling=asynchronous,
        ),
        runner=runner,
        tokenizer=tokenizer,
        sampler=Sampler(set(tokenizer.eos_token_ids)),
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, output_kind=kind)
    for i in range(args.num_requests):
        prompt = [(i * 7 + k) % 200 + 32 for k in range(args.prompt_len)]
        engine.add_request(f"r{i}", prompt, params)
    timers = {"schedule": 0.0, "sample": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers[name] += time.perf_counter() - t0

        return wrapper

    finals = 0
    tokens_before = 0
    if args.decode_only:
        # every prompt prefilled and decoding, nothing waiting: only decode steps (windows) are timed
        scheduler = engine.scheduler
        while scheduler.waiting or any(s.num_output_tokens == 0 for s in scheduler.running):
            for out in engine.step():
                finals += out.finished
        tokens_before = sum(s.num_output_tokens for s in scheduler.running) + finals * args.output_len
        runner.seconds = 0.0
    engine.scheduler.schedule = timed("schedule", engine.scheduler.schedule)  # type: ignore[method-assign]
    engine.sampler.sample = timed("sample", engine.sampler.sample)  # type: ignore[method-assign]
    engine.scheduler.reserve_decode_window = timed(  # type: ignore[method-assign]
        "reserve", engine.scheduler.reserve_decode_window
    )
    engine._process_window = timed("process_window", engine._process_window)  # type: ignore[method-assign]
    timers.update(reserve=0.0, process_window=0.0)
    engine_steps = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine_steps += 1
        for out in engine.step():
            finals += out.finished
    total = time.perf_counter() - start
    assert finals == args.num_requests
    tokens = args.num_requests * args.output_len - tokens_before
    host = total - runner.seconds
    rest = host - timers["schedule"] - timers["sample"]
    return {
        "tokens": tokens,
        "host_us_per_token": host / tokens * 1e6,
        "schedule_us": timers["schedule"] / tokens * 1e6,
        "sample_us": timers["sample"] / tokens * 1e6,
        "rest_us": rest / tokens * 1e6,
        "runner_s": runner.seconds,
        "total_s": total,
        "engine_steps": engine_steps,
        "host_ms_per_engine_step": host / engine_steps * 1e3,
        "reserve_ms_per_engine_step": timers["reserve"] / engine_steps * 1e3,
        "process_window_ms_per_engine_step": timers["process_window"] / engine_steps * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--output-kind", choices=[*KINDS, "both"], default="both")
    parser.add_argument(
        "--num-scheduler-steps",
        default="1",
        help="comma-separated values of the engine's num_scheduler_steps to compare, e.g. 1,8",
    )
    parser.add_argument(
        "--decode-only",
        action="store_true",
        help="time only the steps after every prompt is prefilled (decode windows); adds ms per engine "
        "step and its window reservation / window processing parts",
    )
    parser.add_argument(
        "--async-scheduling",
        choices=["auto", "on", "off"],
        default="auto",
        help="the engine's async_scheduling (auto: on with N > 1, off at 1 on this CPU runner; on: "
        "one-step windows at N = 1 too, each launched before the last one's tokens are processed)",
    )
    args = parser.parse_args()
    asynchronous = {"auto": None, "on": True, "off": False}[args.async_scheduling]
    steps = [int(x) for x in args.num_scheduler_steps.split(",")]
    torch.set_num_threads(1)
    kinds = ["final", "cumulative"] if args.output_kind == "both" else [args.output_kind]
    print(
        f"{args.num_requests} requests x {args.prompt_len} prompt + {args.output_len} output tokens; "
        "host us per output token (runner time left out)"
    )
    print(
        f"{'output kind':<12} {'steps':>5} {'host us/tok':>11} {'schedule':>9} {'sample':>8} {'rest':>8} "
        f"{'runner s':>9} {'ms/eng step':>11} {'reserve':>8} {'process':>8}"
    )
    for name in kinds:
        for n in steps:
            gc.collect()  # the previous run's engine, else its garbage is collected inside this run
            r = run(args, KINDS[name], n, asynchronous)
            print(
                f"{name:<12} {n:>5} {r['host_us_per_token']:>11.1f} {r['schedule_us']:>9.1f} "
                f"{r['sample_us']:>8.1f} {r['rest_us']:>8.1f} {r['runner_s']:>9.2f} "
                f"{r['host_ms_per_engine_step']:>11.2f} {r['reserve_ms_per_engine_step']:>8.2f} "
                f"{r['process_window_ms_per_engine_step']:>8.2f}"
            )


if __name__ == "__main__":
    main()
