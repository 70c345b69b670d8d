"""Time to first token of one short prompt on the built-in engine (issue 6, v7): the prefill step
alone, with the short-prefill CUDA graphs (cuda_graph_runner.PREFILL_GRAPH_ROWS) and without them
(eager prefill), same process, same weights.

Per model and prompt length: the engine is warmed with a few requests, then R single requests run
one after another; for each, the first `engine.step()` (admission, the prefill forward, the first
token's sampling) is timed with a device sync, and the graph replays it used are counted. The table
gives the median first-step ms and the replays per first step.

    PYTHONPATH=<dir holding llmdeploy_engine> python3 benchmarks/gpu_ttft.py
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine
from gpu_bench import log, sync

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.config import EngineConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.runner import cuda_graph_runner  # noqa: E402
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

MODELS = {"qwen": "random:Qwen/Qwen2.5-0.5B", "llama": "random:meta-llama/Llama-3.1-8B"}


def first_steps(engine: LLMEngine, prompt_len: int, repeats: int, device: str) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(prompt_len)
    times, replays = [], []
    params = SamplingParams(
        max_tokens=2, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY
    )
    for r in range(repeats + 1):  # the first one is a warm-up
        engine.add_request(
            f"p{prompt_len}-{r}", torch.randint(0, 256, (prompt_len,), generator=gen).tolist(), params
        )
        before = getattr(engine.runner, "num_replays", 0)
        sync(device)
        t0 = time.perf_counter()
        engine.step()
        sync(device)
        if r:
            times.append((time.perf_counter() - t0) * 1e3)
            replays.append(getattr(engine.runner, "num_replays", 0) - before)
        while engine.has_unfinished_requests():
            engine.step()
    return statistics.median(times), statistics.mean(replays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen,llama")
    parser.add_argument("--prompt-lens", default="16,128,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    rows = []
    default_rows = cuda_graph_runner.PREFILL_GRAPH_ROWS
    for key in args.models.split(","):
        for label, prefill_rows in (("prefill graphs", default_rows), ("eager prefill", ())):
            cuda_graph_runner.PREFILL_GRAPH_ROWS = prefill_rows
            engine = LLMEngine(
                EngineConfig(
                    model=MODELS[key], device=args.device, dtype="bfloat16", max_model_len=2048, seed=0
                )
            )
            log(f"{key}, {label}: {engine.runner.report.log_line()}")
            for n in (int(x) for x in args.prompt_lens.split(",")):
                ms, replays = first_steps(engine, n, args.repeats, args.device)
                rows.append((key, label, n, ms, replays))
                log(f"  {n}-token prompt: first step {ms:.2f} ms, {replays:.1f} graph replays")
            del engine
            gc.collect()
            torch.cuda.empty_cache()
    cuda_graph_runner.PREFILL_GRAPH_ROWS = default_rows
    print("| model | prefill | prompt tokens | first step ms (median) | graph replays |")
    print("|---|---|---|---|---|")
    for key, label, n, ms, replays in rows:
        print(f"| {key} | {label} | {n} | {ms:.2f} | {replays:.1f} |")


if __name__ == "__main__":
    main()
