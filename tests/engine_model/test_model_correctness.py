"""The default model (SmolLM2 GGUF) against transformers loading the same file, float32 on CPU."""

from __future__ import annotations

import pytest
import torch
from engine_model_helpers import BlockPlan, greedy_generate, hf_greedy, make_batch
from llmdeploy_engine.kernels.attention import build_attention_metadata
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = pytest.mark.slow  # the model is loaded: seconds a test on 2 cores

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


@pytest.mark.parametrize(
    ("sample_indices", "num_logits"),
    [([0, 2], [1, 3]), ([], None), ([1], None)],
    ids=["mixed-with-verification-rows", "samples-nothing", "one-sequence"],
)
def test_last_layer_on_logit_rows_only_matches_the_whole_last_layer(
    runner: ModelRunner, tokenizer: Tokenizer, sample_indices: list[int], num_logits: list[int] | None
) -> None:
    """execute() runs the last layer's output projection and MLP on the logit rows only: the same
    logits as the whole model's hidden states taken at those rows, and every row's K/V stored."""
    ids = tokenizer.encode(PROMPTS[2])
    plan = BlockPlan(runner, 2 * len(ids))
    batch = make_batch(plan, [0, 1, 2], [ids, ids[:7], ids[:4]], [0, 0, 0])
    batch = type(batch)(**{**batch.__dict__, "sample_indices": sample_indices, "num_logits": num_logits})
    rows = batch.logit_rows()
    assert len(rows) < batch.num_tokens
    mlp_rows: list[int] = []
    hook = runner.model.model.layers[-1].mlp.register_forward_pre_hook(
        lambda _m, args: mlp_rows.append(args[0].shape[0])
    )
    try:
        ours = runner.execute(batch)
    finally:
        hook.remove()
    assert mlp_rows == [max(len(rows), 1)]  # a step that samples nothing keeps one row
    k_cache = runner.kv_caches[-1][0].clone()
    runner.kv_caches[-1][0].zero_()
    with torch.inference_mode():
        meta = build_attention_metadata(batch, runner.block_size, runner.device)
        ids_t, pos_t = torch.tensor(batch.input_ids), torch.tensor(batch.positions)
        hidden = runner.model(ids_t, pos_t, meta, runner.kv_caches)
        whole = runner.model.compute_logits(hidden[rows])
    assert ours.shape == whole.shape == (len(rows), whole.shape[1])
    if rows:
        assert rel_err(ours, whole) < 1e-5
    # the last layer stored K for every row, kept or not (the whole model wrote them into a zeroed cache)
    slots = torch.tensor(batch.slot_mapping)
    stored = k_cache.flatten(0, 1)[slots]
    assert torch.equal(stored, runner.kv_caches[-1][0].flatten(0, 1)[slots])
    assert stored.abs().amax(dim=(1, 2)).gt(0).all()
