"""Speculative decoding speed of the built-in engine (issue 6 item 5): n-gram speculation, single stream.

Per model (random weights from llmdeploy's catalog, bf16 on CUDA): one request with a repetitive
prompt (a short random token sequence repeated to --prompt-len tokens), --output-len tokens greedy with
ignore_eos, speculation off and n-gram (prompt lookup) with k in --ks. Reported per run: end-to-end
tok/s, decode tok/s (after the first token), target forward steps, mean tokens emitted per decode
step, acceptance rate (accepted / proposed), whether the output equals the spec-off output (it must:
greedy speculation is exact), CUDA graph replays used, and the speed-up over spec off.

Random weights: whether the greedy output repeats (and so how much an n-gram proposal can match) is a
property of the random model, not of the engine; the acceptance columns say how much was matched.
A random 8B never continues the prompt (acceptance 0), so `--continuing-model` adds a stated
substitution for a trained model that continues a repetitive prompt: after loading, every layer's
o_proj and down_proj weights are scaled by --branch-scale (the residual stream stays close to the
input token's embedding) and the LM head's row of each prompt-unit token's successor is set to that
token's embedding (other rows: the embedding itself), so the greedy output continues the prompt's
cycle. Only weight values change: shapes, bytes read and kernels per step are those of the model,
so the speed-up is what the engine's speculation gives at the acceptance such a prompt produces. Its
rows are reported under the model name + "cont" next to the plain random model's.
Spec off runs on an engine built without speculation (its CUDA graphs fuse RoPE and the KV store into
the decode kernel); the n-gram rows on one built with a speculative_config, as a deployment with
speculation is (its graphs replay verification steps: RoPE and the KV store stay separate launches),
same seed and weights. (Before v7 the n-gram rows shared the spec-off engine's runner: after v6's
fused decode its graphs no longer replayed verification, which then ran eagerly.)

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_spec.py --out $OUT/spec.json           # GPU
    python benchmarks/gpu_spec.py --quick --device cpu                                # CPU dry run
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


from engine_path import import_engine  # noqa: E402

import_engine()

import torch  # noqa: E402
from llmdeploy_engine.config import EngineConfig  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.sampling_params import SamplingParams  # noqa: E402

MODELS = {
    "llama": "random:meta-llama/Llama-3.1-8B",
    "qwen": "random:Qwen/Qwen2.5-0.5B",
    "smollm2": "random:HuggingFaceTB/SmolLM2-135M",
}
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def config_for(
    model: str, device: str, args: argparse.Namespace, spec: dict[str, Any] | None
) -> EngineConfig:
    # a draft model gets as many KV blocks as the target: with --draft-self every speculative engine
    # (the draft rows share the n-gram rows' runner) has a fixed cache that leaves the draft room
    draft = spec is not None and getattr(args, "draft_self", False)
    return EngineConfig(
        model=model,
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=2**28 if device == "cpu" else (2**32 if draft else None),
        gpu_memory_utilization=0.85,
        seed=0,
        speculative_config=spec,
        # multi-step windows serve spec off only (the engine runs speculative steps one at a time)
        num_scheduler_steps=args.num_scheduler_steps if spec is None else 1,
    )


def repetitive_prompt(vocab: int, length: int, period: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    unit = [rng.randrange(vocab // 4, vocab) for _ in range(period)]
    return (unit * (length // period + 1))[:length]


def run_once(engine: LLMEngine, prompt: list[int], output_len: int, device: str, rid: str) -> dict[str, Any]:
    before = engine.stats()
    replays0 = getattr(engine.runner, "num_replays", None)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    engine.add_request(rid, prompt, params)
    steps = 0
    first_token_s = None
    final = None
    sync(device)
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        outs = engine.step()
        steps += 1
        for out in outs:
            if first_token_s is None and out.outputs[0].token_ids:
                sync(device)
                first_token_s = time.perf_counter() - t0
            if out.finished:
                final = out
    sync(device)
    elapsed = time.perf_counter() - t0
    assert final is not None and first_token_s is not None
    token_ids = final.outputs[0].token_ids
    if len(token_ids) != output_len:
        raise RuntimeError(f"expected {output_len} output tokens, got {len(token_ids)}")
    after = engine.stats()
    proposed = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    decode_steps = max(1, steps - 1)  # the first step prefills and samples the first token
    replays1 = getattr(engine.runner, "num_replays", None)
    return {
        "tok_s": output_len / elapsed,
        "decode_tok_s": (output_len - 1) / max(elapsed - first_token_s, 1e-9),
        "elapsed_s": elapsed,
        "steps": steps,
        "tokens_per_decode_step": (output_len - 1) / decode_steps,
        "proposed_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "cuda_graph_replays": None if replays0 is None or replays1 is None else replays1 - replays0,
        "token_ids": token_ids,
    }


def make_continuing(base: LLMEngine, unit: list[int], branch_scale: float) -> None:
    """Weights-only change (see the module doc): residual branches scaled down, LM head = embedding
    with each unit token's successor row set to that token's embedding."""
    inner = getattr(base.runner, "runner", base.runner)
    m = inner.model
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.mul_(branch_scale)
            layer.mlp.down_proj.weight.mul_(branch_scale)
        embed = m.model.embed_tokens.weight
        head = m.lm_head.weight
        if head.data_ptr() == embed.data_ptr():
            raise ValueError("--continuing-model needs an untied LM head (the embedding must stay as is)")
        head.copy_(embed)
        successor: dict[int, int] = {}
        for i, t in enumerate(unit):
            successor.setdefault(t, unit[(i + 1) % len(unit)])
        for t, nxt in successor.items():
            head[nxt] = embed[t]


def load(
    name: str, model: str, device: str, args: argparse.Namespace, spec: dict[str, Any] | None
) -> LLMEngine:
    """An engine as deployed with `spec` (its CUDA graphs follow its speculative_config), weights seeded
    as every other load of the model, then the stated weight changes of --echo-lm-head or
    --continuing-model."""
    engine = LLMEngine(config_for(model, device, args, spec))
    if args.echo_lm_head:
        # weights-only change: the LM head becomes a copy of the input embedding (the architecture stays
        # untied), so the random model tends to continue the token it reads, as a tied one does
        inner = getattr(engine.runner, "runner", engine.runner)
        with torch.no_grad():
            inner.model.lm_head.weight.copy_(inner.model.model.embed_tokens.weight)
    if args.continuing_model:
        make_continuing(engine, prompt_for(engine, args)[: args.period], args.branch_scale)
    return engine


def prompt_for(engine: LLMEngine, args: argparse.Namespace) -> list[int]:
    # prompt ids must be valid for the tokenizer (a random model gets a small byte-level one)
    vocab = int(getattr(engine.tokenizer, "vocab_size", None) or engine.runner.model_config.vocab_size)
    return repetitive_prompt(vocab, args.prompt_len, args.period)


def bench_model(name: str, model: str, device: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.echo_lm_head:
        name = f"{name}+echo"
        log(f"{name}: lm_head weights set to a copy of embed_tokens (--echo-lm-head)")
    if args.continuing_model:
        name = f"{name}+cont"
        log(
            f"{name}: o_proj / down_proj x {args.branch_scale}, LM head continues the prompt's "
            f"{args.period}-token cycle (--continuing-model)"
        )
    configs: list[tuple[str, dict[str, Any] | None]] = [("off", None)]
    for k in args.ks:
        spec = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 1,
        }
        configs.append((f"ngram k={k}", spec))
    if args.draft_self:
        # the model drafts for itself (same seed, so the same random weights): every proposal matches,
        # and the row shows what the draft's steps cost (`draft_ms_per_pass`)
        configs += [(f"draft k={k}", {"model": model, "num_speculative_tokens": k}) for k in args.ks]
    rows = []
    reference = None
    base: LLMEngine | None = None
    engine: LLMEngine | None = None
    for label, spec in configs:
        if base is None or (spec is None) != (base.config.speculative_config is None):
            # spec off: an engine built without speculation (its graphs fuse RoPE and the KV store into
            # the decode kernel); speculation: one built with it (graphs that replay verification),
            # whose runner the other k share
            if base is not None:
                del base, engine
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
            log(f"{name}: loading {model} ({'speculative graphs' if spec else 'no speculation'})")
            base = engine = load(name, model, device, args, spec)
        else:  # same weights, KV cache and CUDA graphs; a fresh scheduler and speculator
            engine = LLMEngine(
                config_for(model, device, args, spec), runner=base.runner, tokenizer=base.tokenizer
            )
        assert engine is not None
        draft_timer = DraftTimer(engine, device)
        prompt = prompt_for(base, args)
        run_once(engine, prompt[: args.prompt_len // 2], min(16, args.output_len), device, f"{label}-warm")
        draft_timer.reset()
        results = [
            run_once(engine, prompt, args.output_len, device, f"{label}-{i}") for i in range(args.repeats)
        ]
        best = max(results, key=lambda r: r["tok_s"])
        best["draft_ms_per_pass"] = draft_timer.ms_per_pass()
        if reference is None:
            reference = best["token_ids"]
        row = {k: v for k, v in best.items() if k != "token_ids"}
        row.update(model=name, config=label, same_output_as_off=best["token_ids"] == reference)
        row["output_repeats_prompt_unit"] = _repeats(best["token_ids"])
        rows.append(row)
        log(
            f"{name} {label}: {row['tok_s']:.1f} tok/s, {row['tokens_per_decode_step']:.2f} tok/step, "
            f"acceptance {row['acceptance_rate']}, same output {row['same_output_as_off']}, "
            f"graph replays {row['cuda_graph_replays']}, draft ms a forward pass {row['draft_ms_per_pass']}"
        )
    off = rows[0]["tok_s"]
    for row in rows:
        row["speedup_vs_off"] = row["tok_s"] / off
    del base, engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


class DraftTimer:
    """Wall time of a draft model's proposals (synchronised), per draft forward pass, over the timed
    runs (all repeats); None without a draft model."""

    def __init__(self, engine: LLMEngine, device: str) -> None:
        self.seconds = 0.0
        self.passes = 0
        self.proposer = getattr(getattr(engine, "speculator", None), "draft", None)
        if self.proposer is None:
            return
        propose = self.proposer.propose

        def timed(requests: Any) -> Any:
            sync(device)
            t0 = time.perf_counter()
            out = propose(requests)
            sync(device)
            self.seconds += time.perf_counter() - t0
            self.passes += max((r.k for r in requests), default=0)
            return out

        self.proposer.propose = timed

    def reset(self) -> None:
        self.seconds, self.passes = 0.0, 0

    def ms_per_pass(self) -> float | None:
        return self.seconds / self.passes * 1e3 if self.passes else None


def _repeats(token_ids: list[int]) -> float:
    """Fraction of output tokens that continue an earlier 2-gram of the output (how repetitive it is)."""
    seen: dict[tuple[int, int], int] = {}
    hits = 0
    for i in range(2, len(token_ids)):
        key = (token_ids[i - 2], token_ids[i - 1])
        hits += seen.get(key) == token_ids[i]
        seen[key] = token_ids[i]
    return hits / max(1, len(token_ids) - 2)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'model':13} {'config':11} {'tok/s':>8} {'decode':>8} {'x off':>6} {'tok/step':>8} "
        f"{'accept':>7} {'same':>5} {'replays':>7} {'draft ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        lines.append(
            f"{r['model']:13} {r['config']:11} {r['tok_s']:8.1f} {r['decode_tok_s']:8.1f} {r['speedup_vs_off']:6.2f} "
            f"{r['tokens_per_decode_step']:8.2f} {acc:>7} {r['same_output_as_off']!s:>5} {r['cuda_graph_replays']!s:>7} "
            + ("       -" if r.get("draft_ms_per_pass") is None else f"{r['draft_ms_per_pass']:8.2f}")
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--models", nargs="+", default=None, choices=sorted(MODELS))
    parser.add_argument("--ks", nargs="+", type=int, default=[2, 4, 6])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--period", type=int, default=8, help="length of the repeated token unit")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per config (best is reported)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=1,
        help="spec off's multi-step decoding (decode steps per scheduler call); speculation runs one step at a time",
    )
    parser.add_argument(
        "--echo-lm-head",
        action="store_true",
        help="copy the input embedding into the LM head after loading (random weights that tend to repeat "
        "their input; a stated substitution for a trained model, reported under the model name +echo)",
    )
    parser.add_argument(
        "--continuing-model",
        action="store_true",
        help="after loading, set weights so that the greedy output continues the prompt's cycle (a stated "
        "substitution for a trained model on a repetitive prompt; rows under the model name +cont)",
    )
    parser.add_argument(
        "--branch-scale", type=float, default=1e-3, help="--continuing-model: o_proj / down_proj weight scale"
    )
    parser.add_argument(
        "--draft-self",
        action="store_true",
        help="also run a draft model for each k: the model itself (same weights; what the draft costs)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a dry run of the script)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.models = args.models or ["smollm2"]
        args.ks, args.prompt_len, args.output_len, args.repeats, args.max_model_len = [2, 4], 48, 24, 1, 256
    models = args.models or ["llama", "qwen"]
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device; use --device cpu --quick for a dry run", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(2)
    rows: list[dict[str, Any]] = []
    for name in models:
        rows += bench_model(name, MODELS[name], args.device, args)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result = {"device": device_name, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
    if args.out is not None:
        path = args.out if args.out.suffix == ".json" else args.out / "gpu_spec.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        log(f"wrote {path}")
    print(
        f"\nspeculative decoding, single stream, {args.prompt_len}-token repetitive prompt, "
        f"{args.output_len} greedy tokens, {device_name}"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
