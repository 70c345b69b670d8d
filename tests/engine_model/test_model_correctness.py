"""The default model (SmolLM2 GGUF) against transformers loading the same file, float32 on CPU."""

from __future__ import annotations

import pytest
import torch
from engine_model_helpers import BlockPlan, greedy_generate, hf_greedy, make_batch
from llmdeploy_engine.model_runner import ModelRunner
from llmdeploy_engine.tokenizer import Tokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 4,",
]
MAX_REL_ERR = 1e-4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_prefill_logits_match_transformers(
    runner: ModelRunner, hf_model: torch.nn.Module, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(PROMPTS[2])
    plan = BlockPlan(runner, len(ids))
    batch = make_batch(plan, [0], [ids], [0])
    batch = type(batch)(**{**batch.__dict__, "sample_indices": [0]})
    ours = runner.execute(batch)[0]
    with torch.inference_mode():
        ref = hf_model(torch.tensor([ids])).logits[0, -1].float()
    assert rel_err(ours, ref) < MAX_REL_ERR


def test_every_position_matches_transformers(
    runner: ModelRunner, hf_model: torch.nn.Module, tokenizer: Tokenizer
) -> None:
    """Feed the prompt one chunk of 3 tokens at a time, sampling every chunk's last token."""
    ids = tokenizer.encode(PROMPTS[2])
    plan = BlockPlan(runner, len(ids))
    with torch.inference_mode():
        ref = hf_model(torch.tensor([ids])).logits[0].float()
    for start in range(0, len(ids), 3):
        chunk = ids[start : start + 3]
        ours = runner.execute(make_batch(plan, [0], [chunk], [start]))[0]
        assert rel_err(ours, ref[start + len(chunk) - 1]) < MAX_REL_ERR, f"chunk at {start}"


def test_greedy_matches_transformers_generate(
    runner: ModelRunner, hf_model: torch.nn.Module, tokenizer: Tokenizer
) -> None:
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    eos = {2}
    ours = greedy_generate(runner, prompts, max_tokens=24, eos_token_ids=eos)
    for prompt, got in zip(prompts, ours, strict=True):
        assert got == hf_greedy(hf_model, prompt, 24), tokenizer.decode(prompt)


def test_chunked_prefill_and_batching_do_not_change_tokens(runner: ModelRunner, tokenizer: Tokenizer) -> None:
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    solo = [greedy_generate(runner, [p], max_tokens=12, eos_token_ids={2})[0] for p in prompts]
    batched = greedy_generate(runner, prompts, max_tokens=12, eos_token_ids={2})
    chunked = greedy_generate(runner, prompts, max_tokens=12, eos_token_ids={2}, prefill_chunk=5)
    assert batched == solo
    assert chunked == solo


def test_prefix_from_cache_gives_same_logits(runner: ModelRunner, tokenizer: Tokenizer) -> None:
    """Sequence B shares A's first two blocks (block table reuse, as prefix caching does)."""
    prefix = tokenizer.encode(" ".join(["alpha beta gamma delta"] * 8))[:32]
    suffix = tokenizer.encode(" and then the story continued")
    assert len(prefix) == 32 and runner.block_size == 16
    plan = BlockPlan(runner, 64)
    full = prefix + suffix
    cold = runner.execute(make_batch(plan, [0], [full], [0]))[0]
    # B: its table starts with A's two prefix blocks, then its own; only the suffix is computed
    b_table = plan.table(0)[:2] + plan.table(1)[2:]
    slots = [b_table[p // 16] * 16 + p % 16 for p in range(32, len(full))]
    batch = make_batch(plan, [1], [suffix], [32])
    batch = type(batch)(**{**batch.__dict__, "block_tables": [b_table], "slot_mapping": slots})
    warm = runner.execute(batch)[0]
    assert rel_err(warm, cold) < 1e-5


@pytest.mark.slow
def test_sixteen_concurrent_requests_match_their_solo_runs(runner: ModelRunner, tokenizer: Tokenizer) -> None:
    base = tokenizer.encode(PROMPTS[2] + " " + PROMPTS[0] + " " + PROMPTS[1])
    prompts = [base[: 4 + 2 * i] for i in range(16)]
    batched = greedy_generate(runner, prompts, max_tokens=8, eos_token_ids={2})
    for p, got in zip(prompts, batched, strict=True):
        assert got == greedy_generate(runner, [p], max_tokens=8, eos_token_ids={2})[0]
