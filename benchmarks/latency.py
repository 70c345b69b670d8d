"""Single-request decode speed of the built-in engine against the HBM roofline.

Per model (random weights from the catalog architecture, bf16, no checkpoint needed) and weight
format: one greedy request of a 128-token prompt and 256 output tokens (ignore_eos), alone on the
engine, timed `--repeats` times with a new prompt each time (no prefix-cache hit); medians.

- end to end tok/s: output tokens over request time; decode tok/s: tokens after the first over the
  time after the first engine step (the prefill);
- bytes per token: what one decode step must read, every weight (the startup report's count)
  except the input embedding table unless it is tied (one row is read), plus the KV cache of the
  mean context;
- roofline = measured copy bandwidth (bytes read + written) / bytes per token; "% roofline" is
  decode tok/s over it and "achieved GB/s" is decode tok/s x bytes per token.

`--quantization awq,fp8` adds quantized copies of each model: a dense random checkpoint written
through transformers, converted by the engine's own `python -m llmdeploy_engine.loading.quant_checkpoint`.

    python benchmarks/latency.py                                   # both reference models, bf16
    python benchmarks/latency.py --models llama-3.1-8b --quantization none,awq,fp8
    python benchmarks/latency.py --models llama-3.1-8b --tensor-parallel-size 2   # a 2-GPU machine
    python benchmarks/latency.py --quick                           # CPU, tiny, seconds
"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common

COLUMNS = common.columns(
    "model quantization gpus e2e_tok_s decode_tok_s decode_spread first_step_ms gb_per_token roofline_tok_s roofline_pct achieved_gb_s activation_gib"
)


def quantized_checkpoint(hf_id: str, method: str, workdir: Path, device: str, group_size: int) -> str:
    """A `method` checkpoint of random weights of hf_id, built once under workdir."""
    import torch
    from transformers import AutoModelForCausalLM

    name = hf_id.replace("/", "--")
    dense, dest = workdir / f"{name}-dense", workdir / f"{name}-{method}-g{group_size}"
    if not (dense / "config.json").is_file():
        common.log(f"  writing a dense random checkpoint of {hf_id} to {dense}")
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                common.hf_config(common.model_spec(hf_id)), dtype=common.torch_dtype(device)
            )
        model.save_pretrained(dense)
        del model
    if not (dest / "config.json").is_file():
        common.log(f"  quantizing it ({method}) to {dest}")
        cmd = [
            sys.executable,
            "-m",
            "llmdeploy_engine.loading.quant_checkpoint",
            str(dense),
            str(dest),
            "--method",
            method,
            "--group-size",
            str(group_size),
        ]
        subprocess.run(cmd, check=True)
    return str(dest)


def single_stream(
    engine: Any, request_id: str, prompt: list[int], out_len: int, device: str
) -> tuple[float, float]:
    """(seconds to the end of the first engine step, seconds to the last token) of one request alone."""
    engine.add_request(request_id, prompt, common.greedy(out_len))
    common.sync(device)
    t0 = time.perf_counter()
    first = None
    while engine.has_unfinished_requests():
        engine.step()
        if first is None:
            common.sync(device)
            first = time.perf_counter() - t0
    common.sync(device)
    assert first is not None
    return first, time.perf_counter() - t0


def bytes_per_token(spec: Any, report: Any, context: float) -> float:
    import torch

    element = torch.finfo(getattr(torch, str(report.dtype).removeprefix("torch."))).bits // 8
    embedding = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size * element
    return report.weights_bytes - embedding + report.kv_bytes_per_token * context


def measure(hf_id: str, model: str, quantization: str, args: Any, bandwidth: float) -> dict[str, Any]:
    import torch

    spec = common.model_spec(hf_id)
    engine = common.make_engine(
        model,
        args.device,
        enforce_eager=args.eager or None,
        tensor_parallel_size=args.tensor_parallel_size,
        # a written checkpoint has no tokenizer files: the random model's byte-level one (token ids only)
        tokenizer=None if quantization == "none" else f"random:{hf_id}",
    )
    prompt_len, out_len = args.prompt_len, args.output_len
    prompts = common.random_prompts([prompt_len] * (args.repeats + 1), seed=1)
    single_stream(engine, "warm-up", prompts[0], out_len, args.device)  # compiles, allocator, graphs
    runs = [single_stream(engine, f"r{i}", p, out_len, args.device) for i, p in enumerate(prompts[1:])]
    report = engine.stats().startup_report
    engine.close()
    del engine
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    decode = sorted((out_len - 1) / (end - first) for first, end in runs)
    e2e = sorted(out_len / end for _, end in runs)
    per_token = bytes_per_token(spec, report, prompt_len + out_len / 2)
    mid = decode[len(decode) // 2]
    roofline = bandwidth / per_token
    return {
        "model": hf_id,
        "quantization": quantization,
        "gpus": f"tp {args.tensor_parallel_size}",
        "prompt_len": prompt_len,
        "output_len": out_len,
        "e2e_tok_s": e2e[len(e2e) // 2],
        "decode_tok_s": mid,
        "decode_spread": f"{decode[0]:,.0f}-{decode[-1]:,.0f}",
        "first_step_ms": 1e3 * sorted(first for first, _ in runs)[len(runs) // 2],
        "gb_per_token": per_token / 1e9,
        "roofline_tok_s": roofline,
        "roofline_pct": 100 * mid / roofline,
        "achieved_gb_s": mid * per_token / 1e9,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "activation_gib": report.peak_activation_bytes / 2**30,  # the start-up profile's peak
    }


def main() -> None:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument(
        "--models", default=common.DEFAULT_MODELS, help="comma-separated short names or catalog ids"
    )
    p.add_argument("--quantization", default="none", help="comma-separated: none, awq, gptq, fp8")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/llmdeploy-bench-checkpoints"))
    p.add_argument("--group-size", type=int, default=128, help="AWQ / GPTQ quantization group")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (enforce_eager)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs the model is split over")
    args = p.parse_args()
    device = common.resolve_device(args)
    if args.quick:
        args.prompt_len, args.output_len, args.repeats, args.group_size = 16, 8, 1, 32
    formats = [q.strip() for q in args.quantization.split(",") if q.strip()]
    unknown = sorted(set(formats) - {"none", "awq", "gptq", "fp8"})
    if unknown:
        p.error(f"--quantization: unknown {', '.join(unknown)}")
    head = common.header(device)
    bandwidth = common.copy_bandwidth(device, 2**22 if args.quick else 2**32)
    head["copy_bandwidth_gb_s"] = round(bandwidth / 1e9, 1)
    rows = []
    for hf_id in common.model_ids(args.models, args.quick):
        for q in formats:
            model = (
                f"random:{hf_id}"
                if q == "none"
                else quantized_checkpoint(hf_id, q, args.workdir, device, args.group_size)
            )
            common.log(f"{hf_id} ({q}) ...")
            rows.append(measure(hf_id, model, q, args, bandwidth))
            common.log(
                f"  {rows[-1]['decode_tok_s']:,.0f} tok/s decode, {rows[-1]['roofline_pct']:.1f} % roofline"
            )
    common.report("latency", head, rows, COLUMNS, args)


if __name__ == "__main__":
    main()
