"""GPU speed of quantized weights (issue 28): int4 (AWQ) and fp8 checkpoints against bf16, same run.

Builds random checkpoints of a catalog architecture (default Llama-3.1-8B) the way the quantization
tools write them (engine/quant_checkpoint.py: random bf16 weights, quantized with AWQ's / GPTQ's /
compressed-tensors' packing, safetensors + config.json), loads each through the engine's checkpoint
loader, and measures per format, as benchmarks/gpu_bench.py does:

- single stream: 128-token prompt, 256 greedy output tokens (ignore_eos); decode tok/s;
- throughput: N requests (default 256), input and output lengths uniform in [100, 1024] (seed 0),
  all added at once; output tok/s (`--throughput` picks the formats that run it).

bf16 runs the same architecture as `random:` weights. Prints a table last, ratios against bf16.

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_quant.py --workdir /tmp/quant --out $OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine_path import import_engine

import_engine()

import torch  # noqa: E402
from gpu_bench import copy_bandwidth_bytes_per_s, run_requests, single_stream  # noqa: E402
from llmdeploy_engine.config import EngineConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.loading.quant_checkpoint import hf_config_dict, write_quantized  # noqa: E402
from llmdeploy_engine.loading.random_weights import config_from_spec  # noqa: E402
from llmdeploy_engine.model.model import CausalLM  # noqa: E402

START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


def random_dense(shapes: dict[str, tuple[int, ...]], device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """normal(0, 0.02) matrices and unit norms, as random_weights.py draws them, one tensor at a time."""
    gen = torch.Generator(device=device).manual_seed(0)
    for name, shape in shapes.items():
        if len(shape) == 1:
            yield name, torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            yield name, (torch.randn(shape, generator=gen, device=device) * 0.02).to(torch.bfloat16)


def build(model_id: str, method: str, workdir: Path, device: str) -> Path:
    from llmdeploy.catalog.models import resolve_model

    mc = config_from_spec(resolve_model(model_id))
    with torch.device("meta"):
        shapes = CausalLM(mc).hf_shapes()
    dest = workdir / method
    t0 = time.perf_counter()
    write_quantized(dest, hf_config_dict(mc), random_dense(shapes, device), method)
    size = sum(f.stat().st_size for f in dest.iterdir())
    log(f"built {method} checkpoint {dest} ({size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s")
    return dest


def bench(model: str, label: str, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    dev = args.device
    t0 = time.perf_counter()
    # the checkpoints carry no tokenizer files: the byte-level one of random-weight models
    config = EngineConfig(
        model=model, tokenizer=f"random:{args.model}", device=dev, dtype="bfloat16", max_model_len=2048,
        max_num_batched_tokens=args.max_num_batched_tokens, gpu_memory_utilization=0.9, seed=0,
    )  # fmt: skip
    engine = LLMEngine(config)
    runner: Any = getattr(engine.runner, "runner", engine.runner)
    rep = runner.startup_report
    res: dict[str, Any] = {"weights_gib": rep.weights_bytes / 2**30, "start_s": time.perf_counter() - t0}
    log(f"{label}: engine up in {res['start_s']:.0f} s, weights {res['weights_gib']:.2f} GiB")
    gen = torch.Generator().manual_seed(0)
    run_requests(engine, [torch.randint(0, 256, (64,), generator=gen).tolist()] * 4, [8] * 4, [], dev)
    warm = torch.randint(100, 1025, (16,), generator=torch.Generator().manual_seed(2)).tolist()
    run_requests(
        engine, [torch.randint(0, 256, (n,), generator=gen).tolist() for n in warm], [16] * 16, [], dev
    )
    out_len = args.single_tokens
    decodes = []
    for i in range(2):
        prompt = torch.randint(0, 256, (128,), generator=gen).tolist()
        _, t_first, t_end = single_stream(engine, f"single{i}", prompt, out_len, dev)
        decodes.append((out_len - 1) / (t_end - t_first))
    res["decode_tok_s"] = max(decodes)
    bytes_per_token = (
        rep.weights_bytes
        - runner.model_config.vocab_size
        * runner.model_config.hidden_size
        * 2
        * (0 if runner.model_config.tie_word_embeddings else 1)
    )  # the embedding table is not read by a decode step (one row)
    res["weights_read_gb"] = bytes_per_token / 1e9
    res["roofline_fraction"] = res["decode_tok_s"] * bytes_per_token / bandwidth
    log(f"{label}: single stream decode {decodes} tok/s; ~{res['roofline_fraction']:.0%} of copy bandwidth")
    if label in args.throughput.split(","):
        g = torch.Generator().manual_seed(0)
        ins = torch.randint(100, 1025, (args.num_requests,), generator=g).tolist()
        outs = torch.randint(100, 1025, (args.num_requests,), generator=g).tolist()
        prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in ins]
        elapsed, tokens, _ = run_requests(engine, prompts, outs, [], dev)
        res["throughput_tok_s"] = tokens / elapsed
        log(f"{label}: {args.num_requests} requests, {tokens} output tokens in {elapsed:.1f} s: "
            f"{res['throughput_tok_s']:.0f} tok/s")  # fmt: skip
    del engine, runner
    gc.collect()
    torch.cuda.empty_cache()
    return res


SWEEP = [(8, 512, 4, False), (16, 512, 4, False), (16, 1024, 8, False), (32, 512, 8, False),
         (16, 256, 4, True), (8, 1024, 4, False), (32, 1024, 8, False)]  # fmt: skip


def sweep(device: str) -> dict[str, Any]:
    """Single-row GEMV per candidate launch config (triton_quant.GEMV_CONFIGS) at Llama-3.1-8B's
    gate_up and down shapes: us a launch and GB/s of weight bytes; the fastest becomes the config."""
    import triton.testing
    from llmdeploy_engine.kernels import triton_gemv, triton_quant
    from llmdeploy_engine.kernels.int4_formats import pack_last

    out: dict[str, Any] = {}
    for fmt, name in ((0, "int4"), (1, "fp8")):
        totals: dict[tuple[int, int, int, bool], float] = {}
        for n, k in ((28672, 4096), (4096, 14336)):
            x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
            if fmt == 0:
                w = pack_last(torch.randint(0, 16, (n, k), device=device, dtype=torch.uint8))
                s = torch.rand(n, k // 128, device=device, dtype=torch.bfloat16)
                z = torch.randint(0, 16, (n, k // 128), device=device, dtype=torch.uint8)
                args: tuple[Any, ...] = (0, w, s, z, 128, n, k)
                nbytes = n * k // 2 + n * k // 128 * 3
            else:
                w = torch.randint(0, 120, (n, k), device=device, dtype=torch.uint8)
                args = (1, w, torch.rand(n, device=device), None, 0, n, k)
                nbytes = n * k
            dense = torch.randn(n, k, device=device, dtype=torch.bfloat16)
            t_bf16 = triton.testing.do_bench(lambda: triton_gemv.linear(x, dense), return_mode="median")  # noqa: B023
            log(f"  bf16 triton_gemv {n}x{k}: {t_bf16 * 1e3:.1f} us ({n * k * 2 / t_bf16 / 1e6:.0f} GB/s)")
            for cfg in SWEEP:
                triton_quant.GEMV_CONFIGS[(fmt, 1)] = cfg
                try:
                    t = triton.testing.do_bench(lambda: triton_quant.gemv(x, *args), return_mode="median")  # noqa: B023
                except Exception as e:  # a config the compiler refuses (registers, shared memory)
                    log(f"  {name} {cfg}: {type(e).__name__}")
                    t = float("inf")
                totals[cfg] = totals.get(cfg, 0.0) + t
                log(f"  {name} {n}x{k} {cfg}: {t * 1e3:.1f} us ({nbytes / t / 1e6:.0f} GB/s)")
        best = min(totals, key=lambda c: totals[c])
        triton_quant.GEMV_CONFIGS[(fmt, 1)] = best
        out[name] = {"best": best, "us": {str(c): v * 1e3 for c, v in totals.items()}}
        log(f"{name}: fastest single-row config {best}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    p.add_argument("--formats", default="bf16,awq,fp8")
    p.add_argument("--throughput", default="bf16,awq", help="formats that also run the N-request workload")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--single-tokens", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--workdir", default="/tmp/quant-checkpoints")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    p.add_argument("--sweep", action="store_true", help="time GEMV launch configs first, keep the fastest")
    args = p.parse_args()
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}")
    bandwidth = copy_bandwidth_bytes_per_s(args.device, 2 * 2**30)
    log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    results: dict[str, Any] = {}
    if args.sweep:
        results["sweep"] = sweep(args.device)
    workdir = Path(args.workdir)
    for label in args.formats.split(","):
        try:
            if label == "bf16":
                model = f"random:{args.model}"
            else:
                model = str(build(args.model, label, workdir, args.device))
                gc.collect()
                torch.cuda.empty_cache()
            results[label] = bench(model, label, args, bandwidth)
        except Exception as e:  # one format's failure still leaves the others' figures
            log(f"{label}: FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
    if args.out:
        Path(args.out, "gpu_quant.json").write_text(json.dumps(results, indent=2))
    results.pop("sweep", None)
    base = results.get("bf16", {})
    print(
        f"\n{args.model}: format | weights GiB | decode tok/s (x bf16) | roofline | throughput tok/s (x bf16)"
    )
    for label, r in results.items():
        d = r["decode_tok_s"] / base["decode_tok_s"] if base else float("nan")
        t = r.get("throughput_tok_s")
        tb = base.get("throughput_tok_s")
        tp = f"{t:.0f} ({t / tb:.2f}x)" if t and tb else (f"{t:.0f}" if t else "-")
        print(f"{label:5} | {r['weights_gib']:6.2f} | {r['decode_tok_s']:7.1f} ({d:.2f}x) | "
              f"{r['roofline_fraction']:.0%} | {tp}")  # fmt: skip


if __name__ == "__main__":
    main()
