"""GPU check of the built-in engine's model side: our runner vs transformers on the same random weights.

Builds `random:Qwen/Qwen2.5-0.5B` (architecture from the catalog, no hub) with ModelRunner on CUDA,
loads the very same weights into transformers' Qwen2ForCausalLM, and prints for each dtype:
the start-up report lines, the max relative logit error (prefill and every decode step, the batch
decoding together through the paged KV cache), how many greedy tokens agree, and decode tokens/s at
batch 32. Run from the repository root:

    python3 benchmarks/gpu_check.py [--dtypes float32,bfloat16] [--tokens 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


from engine_path import import_engine  # noqa: E402

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.config import EngineConfig, ModelConfig  # noqa: E402
from llmdeploy_engine.core.forward_batch import ForwardBatch  # noqa: E402
from llmdeploy_engine.runner.model_runner import ModelRunner  # noqa: E402


def hf_model_for(
    config: ModelConfig, dtype: torch.dtype, state: dict[str, torch.Tensor], device: str
) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(
        config.architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_word_embeddings,
    )
    hf_config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_theta}
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation="sdpa")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.eval()


def batch_for(
    tokens: list[list[int]], starts: list[int], tables: list[list[int]], block_size: int
) -> ForwardBatch:
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    qstart: list[int] = []
    for toks, start, table in zip(tokens, starts, tables, strict=True):
        qstart.append(len(ids))
        ids += toks
        pos += list(range(start, start + len(toks)))
        slots += [
            table[p // block_size] * block_size + p % block_size for p in range(start, start + len(toks))
        ]
    return ForwardBatch(
        input_ids=ids,
        positions=pos,
        slot_mapping=slots,
        query_start=qstart,
        query_len=[len(t) for t in tokens],
        context_len=[s + len(t) for s, t in zip(starts, tokens, strict=True)],
        block_tables=tables,
        sample_indices=list(range(len(tokens))),
    )


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def check(model: str, dtype_name: str, num_tokens: int, device: str) -> None:
    kv_bytes = 2**30 if device == "cpu" else None  # a local dry run on CPU
    config = EngineConfig(
        model=model,
        device=device,
        dtype=dtype_name,
        max_model_len=4096,
        gpu_memory_utilization=0.5,
        kv_cache_memory_bytes=kv_bytes,
    )
    runner = ModelRunner(config)
    print(f"== {model} {dtype_name}")
    for line in runner.startup_report.log_lines():
        print("  " + line)
    hf = hf_model_for(runner.model_config, runner.dtype, runner.model.hf_state_dict(), device)
    gen = torch.Generator().manual_seed(0)
    lengths = [7, 33, 64, 129]
    prompts = [
        torch.randint(0, runner.model_config.vocab_size, (n,), generator=gen).tolist() for n in lengths
    ]
    bs = runner.block_size
    per_seq = -(-(max(lengths) + num_tokens) // bs)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts))]

    # ours: all prompts in one prefill step, then decode together; greedy
    ours_tokens: list[list[int]] = [[] for _ in prompts]
    our_logits: list[list[torch.Tensor]] = [[] for _ in prompts]
    logits = runner.execute(batch_for(prompts, [0] * len(prompts), tables, bs))
    for step in range(num_tokens):
        for i in range(len(prompts)):
            our_logits[i].append(logits[i])
            ours_tokens[i].append(int(logits[i].argmax()))
        if step + 1 == num_tokens:
            break
        starts = [len(p) + len(o) - 1 for p, o in zip(prompts, ours_tokens, strict=True)]
        logits = runner.execute(batch_for([[o[-1]] for o in ours_tokens], starts, tables, bs))

    # transformers: each prompt alone, teacher-forced on our tokens (logit error), then its own greedy.
    # In bf16 both implementations are also measured against a float32 copy of the same weights, so
    # our error can be told apart from bf16's own rounding.
    hf32 = (
        hf
        if runner.dtype == torch.float32
        else hf_model_for(runner.model_config, torch.float32, runner.model.hf_state_dict(), device)
    )
    err_ours = err_ours32 = err_hf32 = 0.0
    agree = 0
    for i, prompt in enumerate(prompts):
        seq = torch.tensor([prompt + ours_tokens[i][:-1]], device=device)
        with torch.inference_mode():
            ref = hf(seq).logits[0, len(prompt) - 1 :]
            ref32 = hf32(seq).logits[0, len(prompt) - 1 :]
            own = hf.generate(
                torch.tensor([prompt], device=device),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                max_new_tokens=num_tokens,
                min_new_tokens=num_tokens,
                do_sample=False,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        for step in range(num_tokens):
            err_ours = max(err_ours, rel_err(our_logits[i][step], ref[step]))
            err_ours32 = max(err_ours32, rel_err(our_logits[i][step], ref32[step]))
            err_hf32 = max(err_hf32, rel_err(ref[step], ref32[step]))
        same = next((k for k in range(num_tokens) if own[k] != ours_tokens[i][k]), num_tokens)
        agree += same
        print(f"  prompt len {len(prompt):4d}: greedy tokens identical for {same}/{num_tokens}")
    steps = f"{len(prompts)} prompts x {num_tokens} steps"
    print(f"  max relative logit error, ours vs transformers ({dtype_name}), {steps}: {err_ours:.2e}")
    if hf32 is not hf:
        print(
            f"  max relative logit error vs a float32 reference: ours {err_ours32:.2e}, transformers {err_hf32:.2e}"
        )
    print(f"  greedy agreement (tokens before the first difference): {agree}/{len(prompts) * num_tokens}")
    if device == "cuda":
        decode_throughput(runner)
        del hf, hf32, runner
        torch.cuda.empty_cache()


def decode_throughput(runner: ModelRunner, batch: int = 32, context: int = 512, steps: int = 32) -> None:
    bs = runner.block_size
    per_seq = -(-(context + steps) // bs)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    prompts = [[1] * context for _ in range(batch)]
    runner.execute(batch_for(prompts, [0] * batch, tables, bs))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for s in range(steps):
        runner.execute(batch_for([[1]] * batch, [context + s] * batch, tables, bs))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(
        f"  decode, batch {batch}, context {context}: {batch * steps / elapsed:.0f} tok/s ({elapsed / steps * 1e3:.1f} ms/step, eager)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:Qwen/Qwen2.5-0.5B")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--device", default="cuda", help="cpu only for a dry run of the script itself")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA GPU")
    import transformers

    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {name}")
    for dtype in args.dtypes.split(","):
        check(args.model, dtype, args.tokens, args.device)


if __name__ == "__main__":
    main()
