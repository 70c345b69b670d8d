"""Batched offline throughput of the built-in engine, with the transformers peer in the same run.

Per model (random weights from the catalog architecture, bf16): `--num-requests` requests (default
256) whose prompt and output lengths are uniform in [100, 1024] (seeds 0 and 1, random token ids),
all added at once, greedy with ignore_eos, stepped to the end; output tok/s over the wall time.

The peer is transformers `generate` on the same device in the same process, with random weights of
the same architecture (the speed of a fixed-length greedy run does not depend on the values): the
first `--peer-requests` requests in static batches of `--peer-batch` (left padding, each batch
generating its longest output); its "useful" tok/s counts each request's own output length only, and
"x peer" is the engine's tok/s over it. `--no-peer` leaves it out.

    python benchmarks/throughput.py                                  # both reference models
    python benchmarks/throughput.py --models qwen2.5-0.5b --peer-requests 256 --peer-batch 256
    python benchmarks/throughput.py --models llama-3.1-8b --quantization none,awq --no-peer
    python benchmarks/throughput.py --quick                          # CPU, tiny, seconds
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import common

COLUMNS = common.columns(
    "model quantization requests kv_cache_dtype seconds tok_s peer_requests peer_useful_tok_s x_peer"
)


def run_engine(engine: Any, prompts: list[list[int]], out_lens: list[int], device: str) -> float:
    """Seconds to run every request to its exact output length, all added at once."""
    for i, (ids, n) in enumerate(zip(prompts, out_lens, strict=True)):
        engine.add_request(f"r{i}", ids, common.greedy(n))
    finished: dict[str, int] = {}
    common.sync(device)
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = len(out.outputs[0].token_ids)
    common.sync(device)
    seconds = time.perf_counter() - t0
    want = {f"r{i}": n for i, n in enumerate(out_lens)}
    if finished != want:
        raise RuntimeError("the engine did not produce every request's output length exactly")
    return seconds


def run_peer(hf_id: str, prompts: list[list[int]], out_lens: list[int], batch: int, device: str) -> float:
    """Useful output tok/s of transformers generate over the requests in static batches."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            common.hf_config(common.model_spec(hf_id)),
            dtype=common.torch_dtype(device),
            attn_implementation="sdpa",
        ).eval()

    def generate(ps: list[list[int]], ns: list[int]) -> None:
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
        if out.shape[1] != width + max(ns):
            raise RuntimeError(f"transformers generated {out.shape[1] - width} tokens, not {max(ns)}")

    generate(prompts[:2], [4, 4])  # warm-up: kernels and allocator
    common.sync(device)
    t0 = time.perf_counter()
    for b in range(0, len(prompts), batch):
        generate(prompts[b : b + batch], out_lens[b : b + batch])
    common.sync(device)
    return sum(out_lens) / (time.perf_counter() - t0)  # the model is freed with this frame


def measure(hf_id: str, quantization: str, args: Any) -> dict[str, Any]:
    import torch
    from latency import quantized_checkpoint

    n, device = args.num_requests, args.device
    in_lens = common.uniform_lengths(n, args.min_len, args.max_len, seed=0)
    out_lens = common.uniform_lengths(n, args.min_len, args.max_len, seed=1)
    prompts = common.random_prompts(in_lens, seed=2)
    dense = quantization == "none"
    engine = common.make_engine(
        f"random:{hf_id}"
        if dense
        else quantized_checkpoint(hf_id, quantization, args.workdir, device, args.group_size),
        device,
        kv_cache_dtype=args.kv_cache_dtype,
        # a written checkpoint has no tokenizer files: the random model's byte-level one (token ids only)
        tokenizer=None if dense else f"random:{hf_id}",
    )
    # warm-up on other prompts: the kernels' variants of mixed prefill + decode steps, CUDA graphs
    warm_lens = common.uniform_lengths(16, args.min_len, args.max_len, seed=3)
    run_engine(engine, common.random_prompts(warm_lens, seed=4), [min(16, args.max_len)] * 16, device)
    seconds = run_engine(engine, prompts, out_lens, device)
    engine.close()
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    row: dict[str, Any] = {
        "model": hf_id,
        "quantization": quantization,
        "requests": n,
        "kv_cache_dtype": args.kv_cache_dtype,
        "seconds": seconds,
        "tok_s": sum(out_lens) / seconds,
        "output_tokens": sum(out_lens),
    }
    if not args.no_peer and dense:
        k = min(args.peer_requests or n, n)
        common.log(f"  transformers peer on {k} requests, batches of {args.peer_batch} ...")
        peer = run_peer(hf_id, prompts[:k], out_lens[:k], args.peer_batch, device)
        gc.collect()
        if device == "cuda":  # the next model's engine sizes its KV cache from the free memory
            torch.cuda.empty_cache()
        row.update(
            peer_requests=k, peer_batch=args.peer_batch, peer_useful_tok_s=peer, x_peer=row["tok_s"] / peer
        )
    return row


def main() -> None:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument(
        "--models", default=common.DEFAULT_MODELS, help="comma-separated short names or catalog ids"
    )
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100, help="shortest prompt and output")
    p.add_argument("--max-len", type=int, default=1024, help="longest prompt and output")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the model dtype) or fp8")
    p.add_argument("--peer-requests", type=int, default=128, help="requests the peer runs (0: all)")
    p.add_argument("--peer-batch", type=int, default=128, help="the peer's static batch size")
    p.add_argument("--no-peer", action="store_true", help="leave the transformers peer out")
    p.add_argument(
        "--quantization", default="none", help="comma-separated: none, awq, gptq, fp8 (peer: none only)"
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/llmdeploy-bench-checkpoints"))
    p.add_argument("--group-size", type=int, default=128, help="AWQ / GPTQ quantization group")
    args = p.parse_args()
    device = common.resolve_device(args)
    if args.quick:
        args.num_requests, args.min_len, args.max_len = 4, 4, 12
        args.peer_requests, args.peer_batch, args.group_size = 4, 2, 32
    head = common.header(device)
    rows = []
    for hf_id in common.model_ids(args.models, args.quick):
        for quantization in [q.strip() for q in args.quantization.split(",") if q.strip()]:
            common.log(f"{hf_id} ({quantization}): {args.num_requests} requests ...")
            rows.append(measure(hf_id, quantization, args))
            common.log(f"  {rows[-1]['tok_s']:,.0f} tok/s")
    common.report("throughput", head, rows, COLUMNS, args)


if __name__ == "__main__":
    main()
