"""`plan --fit`'s decode model against the built-in engine on this GPU: predicted vs measured tok/s.

For each model (random weights, bf16, architecture from llmdeploy's catalog) and each batch size,
the engine decodes `batch` sequences that each hold `--context` prompt tokens, all started together;
the script times the decode phase alone (from the step where every sequence has its first token to
the end) and prints it next to the roofline ceiling `llmdeploy.planner.roofline.decode_tok_s` gives
for the same model, GPU, batch and mean context. The ratio is how close the engine comes to the
planner's figure; docs/planner.md quotes it.

Run from the repository root on the GPU machine (pydantic and PyYAML importable):

    PYTHONUNBUFFERED=1 python3 benchmarks/fit_check.py [--models ...] [--batches 1,16,64,256] [--json F]

CPU dry run of the script itself: `python benchmarks/fit_check.py --device cpu --quick`.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from engine_path import import_engine  # noqa: E402

import_engine()

import torch  # noqa: E402
from llmdeploy_engine import EngineConfig, LLMEngine, RequestOutputKind, SamplingParams  # noqa: E402

from llmdeploy.catalog.gpus import GPUSpec, resolve_gpu  # noqa: E402
from llmdeploy.catalog.models import resolve_model  # noqa: E402
from llmdeploy.memory.plan_inputs import PlanInputs  # noqa: E402
from llmdeploy.planner.roofline import decode_step  # noqa: E402


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def header(device: str) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    gpu = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    return f"commit {commit.stdout.strip() or 'unknown'}, {gpu}, torch {torch.__version__}, python {platform.python_version()}"


def measure_decode(engine: LLMEngine, batch: int, context: int, decode_tokens: int, device: str) -> float:
    """Decode tok/s of `batch` sequences started together (prefill excluded)."""
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(0, 256, (context,), generator=gen).tolist()
        params = SamplingParams(
            max_tokens=decode_tokens,
            ignore_eos=True,
            temperature=0.0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        engine.add_request(f"b{batch}-{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
        running = engine.scheduler.running
        if (
            not engine.scheduler.waiting
            and len(running) == batch
            and all(s.num_output_tokens >= 1 for s in running)
        ):
            break
    sync(device)
    started = {s.request_id: s.num_output_tokens for s in engine.scheduler.running}
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    sync(device)
    elapsed = time.perf_counter() - t0
    made = sum(decode_tokens - n for n in started.values())
    return made / elapsed


def run_model(model: str, gpu: GPUSpec, args: argparse.Namespace) -> list[dict[str, Any]]:
    batches = [int(b) for b in args.batches.split(",")]
    config = EngineConfig(
        model=f"random:{model}",
        device=args.device,
        dtype="bfloat16",
        max_model_len=args.context + args.decode_tokens + 16,
        max_num_seqs=max(batches),
        max_num_batched_tokens=max(8192, args.context),
        kv_cache_memory_bytes=2**30 if args.device == "cpu" else None,
        gpu_memory_utilization=0.9,
        seed=0,
    )
    engine = LLMEngine(config)
    measure_decode(engine, 2, min(args.context, 64), 8, args.device)  # warm-up: kernels, allocator
    inputs = PlanInputs(
        spec=resolve_model(model), engine="builtin", gpu=gpu, max_model_len=config.max_model_len
    )
    rows = []
    for batch in batches:
        measured = measure_decode(engine, batch, args.context, args.decode_tokens, args.device)
        step = decode_step(inputs, gpu, batch, args.context + args.decode_tokens // 2)
        predicted = batch / step.seconds
        rows.append(
            {
                "model": model,
                "batch": batch,
                "context": args.context,
                "predicted_tok_s": predicted,
                "measured_tok_s": measured,
                "measured_over_predicted": measured / predicted,
                "bound": step.bound,
            }
        )
        print(
            f"  {model} batch {batch}: predicted {predicted:,.0f}, measured {measured:,.0f} tok/s", flush=True
        )
    del engine
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="Qwen/Qwen2.5-0.5B,meta-llama/Llama-3.1-8B")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens of every sequence")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--gpu", help="catalog GPU name (default: from the CUDA device name)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny CPU dry run of the script")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args()
    if args.quick:
        args.models, args.batches, args.context, args.decode_tokens = (
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "1,2",
            32,
            8,
        )
    name = args.gpu or (
        torch.cuda.get_device_name().removeprefix("NVIDIA ") if args.device == "cuda" else "H200"
    )
    gpu = resolve_gpu(name)
    print(header(args.device), f"; catalog GPU {gpu.name}", flush=True)
    rows = [row for model in args.models.split(",") for row in run_model(model, gpu, args)]
    print(f"\n{'model':<36}{'batch':>6}{'context':>9}{'predicted':>11}{'measured':>10}{'ratio':>7}  bound")
    for r in rows:
        print(
            f"{r['model']:<36}{r['batch']:>6}{r['context']:>9}{r['predicted_tok_s']:>11,.0f}"
            f"{r['measured_tok_s']:>10,.0f}{r['measured_over_predicted']:>7.2f}  {r['bound']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header(args.device), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
