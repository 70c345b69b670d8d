"""The `llmdeploy-engine` argument parser, with vLLM's flag names.

Kept free of torch (and of every engine module that imports it) so `llmdeploy-engine flags --json`
and the toolkit's flag catalogue can read the flags cheaply.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from llmdeploy_engine.cli_values import (
    context_len_or_auto,
    fraction,
    non_negative_int,
    port_number,
    positive_int,
    positive_seconds,
    speculative_config_arg,
    steps_or_auto,
)
from llmdeploy_engine.config import ALLREDUCE_CHOICES, EngineConfig
from llmdeploy_engine.facts import KV_CACHE_DTYPES, MAX_DEFAULT_BATCHED_TOKENS, MIN_DEFAULT_BATCHED_TOKENS

API_KEY_ENV_VARS = ("LLMDEPLOY_API_KEY", "VLLM_API_KEY")
DTYPES = ("auto", "float16", "bfloat16", "float32", "half", "float", "fp16", "bf16")
DEVICES = ("auto", "cuda", "cpu")
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32"}


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    d = EngineConfig(model="")
    model = p.add_argument_group("model")
    model.add_argument(
        "model_tag", nargs="?", default=None, metavar="MODEL", help="model to serve (same as --model)"
    )
    model.add_argument(
        "--model",
        default=None,
        help="GGUF file, checkpoint folder, or 'random:<catalog id>' for random weights",
    )
    model.add_argument("--tokenizer", default=None, help="tokenizer folder or file (default: from the model)")
    model.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="model name(s) the API accepts; the first is reported (default: --model)",
    )
    model.add_argument(
        "--dtype",
        default=d.dtype,
        choices=DTYPES,
        help="weight and activation dtype (auto: bfloat16 on CUDA, float32 on CPU)",
    )
    model.add_argument(
        "--quantization",
        "-q",
        default=None,
        help="weight format the checkpoint must have: awq, gptq, fp8 / compressed-tensors (kept quantized), "
        "gguf (dequantized at load); unset or auto: read from the checkpoint's quantization_config",
    )
    model.add_argument(
        "--cpu-weights",
        default=d.cpu_weights,
        choices=("auto", "quantized", "float32"),
        help="GGUF weights on --device cpu: quantized keeps 4-bit types (Q4_0/Q4_1/Q4_K) as 4-bit codes and "
        "Q8_0 as int8, multiplied by the engine's integer dot-product kernels (compiled at first start with "
        "the C compiler CC, else cc; LLMDEPLOY_CPU_DOT=0 turns them off, =avx2 leaves VNNI out), or by torch's CPU kernels where "
        "those cannot build (Q8_0 and others then as float16); float32 dequantizes at load; auto: quantized "
        "where the CPU has AVX2 or AVX-512 and tensor_parallel_size is 1",
    )
    model.add_argument(
        "--max-model-len",
        type=context_len_or_auto,
        default=None,
        help="context length in tokens; accepts 32k / 4K (default: the model's; start-up fails when the "
        "KV cache cannot hold it, as in vLLM), or auto: the longest context the KV cache holds",
    )
    model.add_argument(
        "--seed", type=int, default=d.seed, help="random seed for sampling without a per-request seed"
    )
    model.add_argument("--device", default=d.device, choices=DEVICES, help="where to run")
    model.add_argument("--enforce-eager", action="store_true", help="never capture CUDA graphs")

    cache = p.add_argument_group("KV cache")
    cache.add_argument(
        "--gpu-memory-utilization",
        type=fraction,
        default=d.gpu_memory_utilization,
        help="fraction of GPU memory for weights, activations and the KV cache",
    )
    cache.add_argument(
        "--kv-cache-memory-bytes",
        type=positive_int,
        default=None,
        help="explicit KV cache size (bytes; accepts 512M / 2G); overrides --gpu-memory-utilization; "
        "needed on CPU",
    )
    cache.add_argument(
        "--kv-cache-dtype",
        default=d.kv_cache_dtype,
        choices=KV_CACHE_DTYPES,
        help="KV cache dtype (auto: the model dtype; fp8 = fp8_e4m3, 1 byte per element with per-layer scales)",
    )
    cache.add_argument(
        "--calculate-kv-scales",
        action=argparse.BooleanOptionalAction,
        default=d.calculate_kv_scales,
        help="fp8 KV cache: per-layer K/V scales from a start-up calibration pass (else 1.0)",
    )
    cache.add_argument("--block-size", type=positive_int, default=d.block_size, help="tokens per KV block")
    cache.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=d.enable_prefix_caching,
        help="reuse KV blocks of shared prompt prefixes",
    )

    sched = p.add_argument_group("scheduler")
    sched.add_argument(
        "--max-num-seqs", type=positive_int, default=d.max_num_seqs, help="most sequences in one batch"
    )
    sched.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        help=f"most tokens in one step (default: max(max_model_len, {MIN_DEFAULT_BATCHED_TOKENS}) capped at "
        f"{MAX_DEFAULT_BATCHED_TOKENS})",
    )
    sched.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=d.enable_chunked_prefill,
        help="split long prompts across steps",
    )
    sched.add_argument(
        "--num-scheduler-steps",
        type=steps_or_auto,
        default=d.num_scheduler_steps,
        metavar="N|auto",
        help="decode steps run back to back per scheduler call, with one host sync at the end (pure "
        "decode batches of greedy or unseeded sampled requests; new requests wait up to N steps and "
        "streams arrive in chunks of up to N tokens); 1 = off. Default auto: on a CUDA GPU with "
        "asynchronous scheduling the engine chooses 1-8 steps a window, more while its host work a "
        "step exceeds the GPU's (small models at large batches), at most 2 within 1 s of a request "
        "arriving while others decode, else 1",
    )
    sched.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=d.async_scheduling,
        help="launch the next decode step (or window of --num-scheduler-steps steps) before the last "
        "one's tokens are processed, so the host's work between steps overlaps the GPU (a new request "
        "waits up to two windows). Default: on on a CUDA GPU or with --num-scheduler-steps > 1, off "
        "on the CPU",
    )
    sched.add_argument(
        "--admission-interval",
        type=positive_int,
        default=d.admission_interval,
        metavar="N",
        help="while sequences decode, waiting requests join at most every N decode steps, so their "
        "prompts share one prefill step and the steps between run as decode windows (more throughput "
        "when requests arrive faster than prefills can be batched, up to N - 1 steps more before a new "
        "request's first token); 1 = every step",
    )
    sched.add_argument(
        "--max-queue-len",
        type=positive_int,
        default=d.max_queue_len,
        help="waiting requests beyond this are refused with HTTP 503",
    )
    sched.add_argument(
        "--max-num-seqs-per-request",
        type=positive_int,
        default=256,
        metavar="N",
        help="most sequences one HTTP request may ask for (prompts x n of a completion request, n of a "
        "chat request); more is refused with HTTP 400. A request is admitted to the waiting queue whole "
        "or not at all (HTTP 503 when it does not fit), so at most --max-queue-len prompts per request",
    )
    sched.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        default=d.tensor_parallel_size,
        help="number of GPUs to shard the model over",
    )
    sched.add_argument(
        "--tp-all-reduce",
        choices=ALLREDUCE_CHOICES,
        default=d.tp_all_reduce,
        help="all-reduce of decode-sized tensors with --tensor-parallel-size > 1, over NVLink between "
        "buffers every rank maps: push (the engine's Triton kernel, which also gathers the logits inside "
        "CUDA graphs), p2p (a one-barrier Triton kernel), symm_mem (torch's one-shot all-reduce), nccl "
        "(NCCL only: decode steps then run without CUDA graphs); auto: the first of push, p2p, "
        "symm_mem that sets up, else nccl. Prefill-sized tensors always go through NCCL",
    )
    sched.add_argument(
        "--gc-gen0-threshold",
        type=non_negative_int,
        default=d.gc_gen0_threshold,
        metavar="N",
        help="raise Python's young-generation garbage-collection threshold to N objects for the "
        "process (never lowered; the default 700 made collections a third of a decode window's host "
        "time); 0 leaves Python's setting",
    )

    spec = p.add_argument_group("speculative decoding")
    spec.add_argument(
        "--speculative-config",
        type=speculative_config_arg,
        default=None,
        metavar="JSON",
        help='vLLM\'s speculative config, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4, "prompt_lookup_min": 1}\' or \'{"model": DRAFT, "num_speculative_tokens": 4}\'',
    )

    server = p.add_argument_group("HTTP server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=port_number, default=8000, help="port to listen on")
    server.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: env LLMDEPLOY_API_KEY or VLLM_API_KEY)",
    )
    server.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="log level of the HTTP server",
    )
    server.add_argument("--disable-log-requests", action="store_true", help="do not log each request")
    server.add_argument(
        "--grammar-compile-timeout-s",
        type=positive_seconds,
        default=10.0,
        metavar="S",
        help="a structured-output or forced tool-call grammar that takes longer to compile is refused "
        "with HTTP 400 (it compiles in a worker process, which is then stopped)",
    )
    server.add_argument(
        "--cpu-threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="torch threads of the model's steps on --device cpu (default: torch's own, OMP_NUM_THREADS or "
        "the cores)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmdeploy-engine",
        description="llmdeploy's built-in inference engine (OpenAI- and TGI-compatible HTTP server).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="serve a model over HTTP",
        description="Serve a model over an OpenAI- and TGI-compatible HTTP API.",
    )
    _add_serve_flags(serve)
    flags = sub.add_parser("flags", help="list the serve flags", description="List the flags of `serve`.")
    flags.add_argument("--json", action="store_true", help="print them as JSON")
    return parser


def serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    assert isinstance(serve, argparse.ArgumentParser)
    return serve


def flag_catalogue() -> list[dict[str, Any]]:
    """Every serve flag: names, destination, kind, default, choices and help."""
    rows = []
    for action in serve_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "bool_optional"
        elif isinstance(action, argparse._StoreTrueAction):
            kind = "flag"
        else:
            kind = "value"
        type_name = getattr(action.type, "__name__", None) if action.type else "str"
        rows.append(
            {
                "flag": next(o for o in action.option_strings if o.startswith("--")),
                "option_strings": list(action.option_strings),
                "dest": action.dest,
                "kind": kind,
                "type": {
                    "positive_int": "int",
                    "port_number": "int",
                    "fraction": "float",
                    "speculative_config_arg": "json",
                }.get(str(type_name), type_name),
                "nargs": action.nargs,
                "default": action.default,
                "choices": list(action.choices) if action.choices else None,
                "help": action.help,
            }
        )
    return rows


def flags_json() -> str:
    return json.dumps(flag_catalogue(), indent=2)


def resolve_api_key(args: argparse.Namespace, env: dict[str, str] | None = None) -> str | None:
    env = dict(os.environ) if env is None else env
    if args.api_key:
        return str(args.api_key)
    return next((env[k] for k in API_KEY_ENV_VARS if env.get(k)), None)


def model_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if args.model and args.model_tag and args.model != args.model_tag:
        parser.error(f"two different models given: {args.model_tag!r} and --model {args.model!r}")
    model = args.model or args.model_tag
    if not model:
        parser.error("no model given: pass --model PATH (a GGUF file, a checkpoint folder or random:<id>)")
    return str(model)


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> EngineConfig:
    names = args.served_model_name
    return EngineConfig(
        model=model_of(args, parser),
        tokenizer=args.tokenizer,
        served_model_name=names[0] if names else None,
        dtype=_DTYPE_ALIASES.get(args.dtype, args.dtype),
        device=args.device,
        quantization=args.quantization,
        cpu_weights=args.cpu_weights,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        kv_cache_dtype=args.kv_cache_dtype,
        calculate_kv_scales=args.calculate_kv_scales,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        tensor_parallel_size=args.tensor_parallel_size,
        seed=args.seed,
        max_queue_len=args.max_queue_len,
        enforce_eager=args.enforce_eager,
        num_scheduler_steps=args.num_scheduler_steps,
        admission_interval=args.admission_interval,
        async_scheduling=args.async_scheduling,
        speculative_config=args.speculative_config,
        gc_gen0_threshold=args.gc_gen0_threshold,
        tp_all_reduce=args.tp_all_reduce,
        cpu_threads=args.cpu_threads,
    )
