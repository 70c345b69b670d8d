"""What every suite script shares: the header, the table, the JSON file, the models and the engine.

A script builds its rows (one dict per measured case), then calls `report(...)`, which prints the
header and one table and writes `{"script", "header", "rows"}` to `--json PATH` when asked.
`compare.py` reads two such files.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the toolkit's catalog, when the scripts run from a plain checkout
    sys.path.insert(0, str(REPO))

from engine_path import import_engine  # noqa: E402

import_engine()  # the checkout's engine/ as llmdeploy_engine where it is not installed

from llmdeploy_engine.facts import ARCHITECTURES  # noqa: E402

# short names for the reference models; any catalog id (`llmdeploy models`) works too
MODELS = {"qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B", "llama-3.1-8b": "meta-llama/Llama-3.1-8B"}
DEFAULT_MODELS = "qwen2.5-0.5b,llama-3.1-8b"
QUICK_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # --quick: the smallest catalog architecture
# transformers class -> model_type, for the architectures the built-in engine runs
MODEL_TYPES = ARCHITECTURES

# transformers config field -> the catalog ModelSpec's
HF_FIELDS = dict(
    vocab_size="vocab_size",
    hidden_size="hidden_size",
    intermediate_size="intermediate_size",
    num_hidden_layers="num_layers",
    num_attention_heads="num_attention_heads",
    num_key_value_heads="num_kv_heads",
    head_dim="head_dim",
    max_position_embeddings="max_position_embeddings",
    tie_word_embeddings="tie_word_embeddings",
)
# row key -> (table heading, format spec), for every suite script
HEADINGS = {
    "model": ("model", ""),
    "quantization": ("weights", ""),
    "gpus": ("parallel", ""),
    "e2e_tok_s": ("end to end tok/s", ",.0f"),
    "decode_tok_s": ("decode tok/s", ",.0f"),
    "decode_spread": ("decode min-max", ""),
    "first_step_ms": ("first step ms", ".1f"),
    "gb_per_token": ("GB/token", ".3f"),
    "roofline_tok_s": ("roofline tok/s", ",.0f"),
    "roofline_pct": ("% roofline", ".1f"),
    "achieved_gb_s": ("achieved GB/s", ",.0f"),
    "activation_gib": ("activation GiB", ".2f"),
    "requests": ("requests", "d"),
    "kv_cache_dtype": ("KV cache", ""),
    "seconds": ("engine s", ".2f"),
    "tok_s": ("output tok/s", ",.1f"),
    "peer_requests": ("peer requests", "d"),
    "peer_useful_tok_s": ("transformers tok/s", ",.0f"),
    "x_peer": ("x peer", ".1f"),
    "kernel": ("kernel", ""),
    "shape": ("shape", ""),
    "us": ("us", ".2f"),
    "gb_s": ("GB/s", ",.0f"),
    "copy_pct": ("% copy bandwidth", ".1f"),
    "tflop_s": ("TFLOP/s", ".1f"),
    "system": ("server", ""),
    "phase": ("workload", ""),
    "start_s": ("start s", ".1f"),
    "ttft_ms": ("TTFT p50 ms", ".0f"),
    "tpot_ms": ("TPOT p50 ms", ".1f"),
    "out_tokens": ("out tokens", ".0f"),
    "failed": ("failed", "d"),
}


def columns(keys: str) -> list[str]:
    """A table's row keys, space-separated; each needs its heading in HEADINGS."""
    out = keys.split()
    missing = [k for k in out if k not in HEADINGS]
    if missing:
        raise KeyError(f"no heading for {missing}: add them to common.HEADINGS")
    return out


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", type=Path, metavar="PATH", help="write the header and rows as JSON")
    p.add_argument("--quick", action="store_true", help="tiny sizes on the CPU: checks the script in seconds")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    return p


def resolve_device(args: argparse.Namespace) -> str:
    import torch

    if args.device == "auto":
        args.device = "cpu" if args.quick or not torch.cuda.is_available() else "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA GPU")
    return str(args.device)


def model_ids(names: str, quick: bool) -> list[str]:
    if quick:
        return [QUICK_MODEL]
    return [MODELS.get(n.strip().lower(), n.strip()) for n in names.split(",") if n.strip()]


def model_spec(hf_id: str) -> Any:
    from llmdeploy.catalog.models import resolve_model

    return resolve_model(hf_id)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def commit() -> str:
    """The checkout's commit; LLMDEPLOY_COMMIT where the copy has no .git (the device launcher)."""
    if os.environ.get("LLMDEPLOY_COMMIT"):
        return os.environ["LLMDEPLOY_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True
        )
        return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def header(device: str) -> dict[str, Any]:
    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    head: dict[str, Any] = {
        "commit": commit(),
        "cpu": cpu,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if device == "cuda":
        import torch

        head["gpu"] = (
            f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
        )
    head.update({name: _version(name) for name in ("torch", "triton", "transformers")})
    return head


def _cell(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec and isinstance(value, int | float) else str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(HEADINGS[k][0] for k in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(k), HEADINGS[k][1]) for k in columns) + " |" for r in rows]
    return "\n".join(lines)


def report(
    script: str, head: dict[str, Any], rows: list[dict[str, Any]], columns: Sequence[str], args: Any
) -> None:
    print("\n" + "  ".join(f"{k}: {v}" for k, v in head.items()))
    print(table(rows, columns), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"script": script, "header": head, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def median_time(fn: Callable[[], Any], device: str, reps: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() (synchronized), for host timing where triton.testing.do_bench cannot run."""
    times = []
    for i in range(warmup + reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device: str, size_bytes: int) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (the HBM roofline's rate)."""
    import torch

    src = torch.randint(0, 255, (size_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_time(lambda: dst.copy_(src), device)
    return 2 * size_bytes / seconds


def make_engine(model: str, device: str, **overrides: Any) -> Any:
    """The built-in engine as the reference figures ran it: bf16 (float32 on the CPU, where bf16 matmuls
    are slow), 2048-token context, 8192-token steps."""
    from llmdeploy_engine import EngineConfig, LLMEngine

    settings: dict[str, Any] = {
        "model": model,
        "device": device,
        "dtype": "float32" if device == "cpu" else "bfloat16",
        "max_model_len": 2048,
        "max_num_batched_tokens": 8192,
        "kv_cache_memory_bytes": 2**30 if device == "cpu" else None,
        "gpu_memory_utilization": 0.9,
        "seed": 0,
    }
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return LLMEngine(EngineConfig(**settings))


def greedy(max_tokens: int, final_only: bool = True) -> Any:
    from llmdeploy_engine import RequestOutputKind, SamplingParams

    kind = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, output_kind=kind)


def random_prompts(lengths: Sequence[int], seed: int, vocab: int = 256) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def uniform_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    import torch

    return [int(x) for x in torch.randint(low, high + 1, (n,), generator=torch.Generator().manual_seed(seed))]


def torch_dtype(device: str) -> Any:
    """The peer's dtype, the engine's (make_engine)."""
    import torch

    return torch.float32 if device == "cpu" else torch.bfloat16


def hf_config(spec: Any) -> Any:
    """A transformers config of a catalog architecture (the peer, and dense checkpoints to quantize)."""
    from transformers import AutoConfig

    model_type = MODEL_TYPES.get(spec.architecture)
    if model_type is None:
        raise ValueError(f"{spec.hf_id}: {spec.architecture} is not one of {sorted(MODEL_TYPES)}")
    rope: dict[str, Any] = {"rope_type": "default", **dict(spec.rope_scaling or {})}
    rope["rope_theta"] = spec.rope_theta or 10000.0
    shape = {hf: getattr(spec, ours) for hf, ours in HF_FIELDS.items()}
    scaling = None if rope["rope_type"] == "default" else rope
    config = AutoConfig.for_model(
        model_type,
        **shape,
        rms_norm_eps=spec.rms_norm_eps or 1e-6,
        rope_theta=rope["rope_theta"],
        rope_scaling=scaling,
    )
    config.rope_parameters = rope
    return config
