"""Speculative decoding on the default GGUF (CPU, float32): greedy output is token-identical to plain
greedy decoding (n-gram and draft-model proposals, concurrent requests, prefix-cache hits, stops inside
an accepted run), and the rejection sampler reproduces the target distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.runner.model_runner import ModelRunner
from llmdeploy_engine.sampling_params import SamplingParams
from llmdeploy_engine.spec_decode.draft_proposer import MAX_UNIFORM_CATCH_UP, uniform_catch_up
from llmdeploy_engine.spec_decode.rejection_sampler import verify_greedy, verify_sampled

pytestmark = pytest.mark.slow  # the model is loaded: seconds a test on 2 cores

# chi-square critical value for 5 degrees of freedom at significance 0.001
CHI2_DF5_P001 = 20.515
REPETITIVE = "red green blue red green blue red green blue red green blue red green blue red green"
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
SHARED = "You are a careful assistant. Answer briefly and precisely. " * 3


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_rejection_sampler_reproduces_the_target_distribution(with_draft_probs: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab, k, trials = 6, 2, 20_000
    p = torch.softmax(torch.randn(k + 1, vocab, generator=gen) * 1.5, dim=-1).double()
    q = torch.softmax(torch.randn(k, vocab, generator=gen) * 1.5, dim=-1).double()
    first = torch.zeros(vocab, dtype=torch.float64)
    second = torch.zeros(vocab, dtype=torch.float64)
    naive = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(trials):
        if with_draft_probs:
            drafts = [int(torch.multinomial(q[j], 1, generator=gen)) for j in range(k)]
            verdict = verify_sampled(p, drafts, q, gen)
        else:  # n-gram: a fixed proposal, one-hot q
            drafts = [1, 4]
            verdict = verify_sampled(p, drafts, None, gen)
        naive[drafts[0]] += 1
        first[verdict.token_ids[0]] += 1
        if len(verdict.token_ids) > 1:
            second[verdict.token_ids[1]] += 1
    assert _chi2(first, p[0]) < CHI2_DF5_P001
    assert _chi2(second, p[1]) < CHI2_DF5_P001
    # the test has power: accepting every draft would be caught
    assert _chi2(naive, p[0]) > 10 * CHI2_DF5_P001


def test_greedy_verification() -> None:
    assert verify_greedy([3, 5, 9], [3, 5]).token_ids == [3, 5, 9]
    assert verify_greedy([3, 6, 9], [3, 5]).token_ids == [3, 6]
    assert verify_greedy([4], []).token_ids == [4]


# ---- engine level ---------------------------------------------------------------------------------


def make_engine(
    runner: ModelRunner, tokenizer: Tokenizer, gguf: Path, spec: dict[str, Any] | None
) -> LLMEngine:
    config = EngineConfig(model=str(gguf), device="cpu", max_num_batched_tokens=256, speculative_config=spec)
    # the session runner is shared: each engine starts with an empty prefix cache of its own
    return LLMEngine(config, runner=runner, tokenizer=tokenizer)


def run(engine: LLMEngine, prompts: list[str], params: SamplingParams) -> list[RequestOutput]:
    base = engine.get_num_unfinished_requests()
    ids = [f"r{base}-{i}-{id(prompts)}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"
    return [done[rid] for rid in ids]


def tokens(outputs: list[RequestOutput]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


PROMPTS = [REPETITIVE, CODE, "Hello, my name is", SHARED + "What is 2 + 2?"]
ROUND2 = [SHARED + "Name a colour.", REPETITIVE + " red"]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path) -> dict[str, list[list[int]]]:
    engine = make_engine(runner, tokenizer, gguf_path, None)
    return {"round1": tokens(run(engine, PROMPTS, GREEDY)), "round2": tokens(run(engine, ROUND2, GREEDY))}


def check_identical(engine: LLMEngine, reference: dict[str, list[list[int]]]) -> None:
    assert tokens(run(engine, PROMPTS, GREEDY)) == reference["round1"]
    # round 2 hits the prefix cache filled by round 1, including blocks written during speculation
    out2 = run(engine, ROUND2, GREEDY)
    assert tokens(out2) == reference["round2"]
    assert all(o.num_cached_tokens > 0 for o in out2)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_ngram_is_token_identical(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path, reference: dict[str, list[list[int]]], k: int
) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    engine = make_engine(runner, tokenizer, gguf_path, spec)
    check_identical(engine, reference)
    stats = engine.stats()
    assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_accepted_tokens > 0
    assert stats.spec_decode_num_draft_tokens <= k * stats.spec_decode_num_drafts
    assert len(stats.spec_decode_num_accepted_tokens_per_pos) <= k


def test_greedy_with_itself_as_draft_accepts_everything(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path, reference: dict[str, list[list[int]]]
) -> None:
    engine = make_engine(runner, tokenizer, gguf_path, {"model": str(gguf_path), "num_speculative_tokens": 4})
    check_identical(engine, reference)
    stats = engine.stats()
    assert stats.spec_decode_num_accepted_tokens >= 0.9 * stats.spec_decode_num_draft_tokens > 0
    # greedy requests wanting 4 proposals: proposals 2-4 come from one decode window of the draft
    assert engine.speculator is not None and engine.speculator.draft is not None
    assert engine.speculator.draft.num_windows > 0


def test_greedy_with_a_random_draft_is_token_identical(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path, reference: dict[str, list[list[int]]]
) -> None:
    spec = {"model": "random:HuggingFaceTB/SmolLM2-135M", "num_speculative_tokens": 3}
    engine = make_engine(runner, tokenizer, gguf_path, spec)
    check_identical(engine, reference)
    stats = engine.stats()
    assert stats.spec_decode_num_draft_tokens > 0
    assert stats.spec_decode_num_accepted_tokens < 0.5 * stats.spec_decode_num_draft_tokens


def test_draft_with_another_vocabulary_is_refused(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path
) -> None:
    with pytest.raises(ValueError, match="vocabulary of 151936 tokens, the target 49152"):
        make_engine(
            runner, tokenizer, gguf_path, {"model": "random:Qwen/Qwen2.5-0.5B", "num_speculative_tokens": 2}
        )


def test_stops_inside_an_accepted_run(runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path) -> None:
    plain = make_engine(runner, tokenizer, gguf_path, None)
    spec = make_engine(runner, tokenizer, gguf_path, {"model": str(gguf_path), "num_speculative_tokens": 5})
    long = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    [base] = run(plain, [REPETITIVE], long)
    text = base.outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    assert stop.strip()
    for params in (
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]),
        SamplingParams(
            temperature=0, max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
        ),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
        SamplingParams(
            temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[base.outputs[0].token_ids[9]]
        ),
    ):
        [want] = run(plain, [REPETITIVE], params)
        [got] = run(spec, [REPETITIVE], params)
        w, g = want.outputs[0], got.outputs[0]
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (
            w.token_ids,
            w.text,
            w.finish_reason,
            w.stop_reason,
        )
    assert spec.stats().spec_decode_num_accepted_tokens > 0


def test_sampling_with_speculation_is_seed_reproducible_and_reports_logprobs(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path
) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=16, ignore_eos=True, seed=3, logprobs=2)
    runs = [
        tokens(run(make_engine(runner, tokenizer, gguf_path, spec), [REPETITIVE, CODE], params))
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    engine = make_engine(runner, tokenizer, gguf_path, spec)
    outs = run(engine, [REPETITIVE, CODE], params)
    assert tokens(outs) == runs[0]
    for out in outs:
        c = out.outputs[0]
        assert len(c.token_ids) == 16 and c.logprobs is not None and len(c.logprobs) == 16
        assert all(t in lp and len(lp) <= 3 for t, lp in zip(c.token_ids, c.logprobs, strict=True))
    assert engine.stats().spec_decode_num_drafts > 0


def test_sampling_with_itself_as_draft_accepts_almost_everything(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path
) -> None:
    # q (the draft's distribution) equals p up to rounding, so min(1, p/q) accepts nearly every draft;
    # a draft whose q were mishandled (e.g. taken as one-hot) would be accepted only with p(d)
    engine = make_engine(runner, tokenizer, gguf_path, {"model": str(gguf_path), "num_speculative_tokens": 3})
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=5, n=2)
    [out] = run(engine, [CODE], params)
    assert [len(c.token_ids) for c in out.outputs] == [16, 16]
    stats = engine.stats()
    assert stats.spec_decode_num_accepted_tokens >= 0.9 * stats.spec_decode_num_draft_tokens > 0
    greedy_n2 = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=2)
    plain = make_engine(runner, tokenizer, gguf_path, None)
    assert [c.token_ids for c in run(engine, [CODE], greedy_n2)[0].outputs] == [
        c.token_ids for c in run(plain, [CODE], greedy_n2)[0].outputs
    ]


def test_uniform_catch_up_evens_short_pieces_only() -> None:
    """The draft's first pass after verification: short unequal pieces start q tokens before their end
    (q the longest), so every sequence feeds q tokens (a shape the CUDA graphs take); a long piece (a
    prompt) or a sequence shorter than q leaves the pieces as they are."""
    a, b, c = object(), object(), object()
    assert uniform_catch_up([(a, 10, 12), (b, 30, 31), (c, 7, 10)]) == [(a, 9, 12), (b, 28, 31), (c, 7, 10)]
    same = [(a, 10, 12), (b, 30, 32)]
    assert uniform_catch_up(same) == same
    long = [(a, 0, MAX_UNIFORM_CATCH_UP + 1), (b, 30, 31)]
    assert uniform_catch_up(long) == long
    short_seq = [(a, 1, 2), (b, 20, 23)]  # a has 2 tokens: it cannot feed 3
    assert uniform_catch_up(short_seq) == short_seq
    assert uniform_catch_up([]) == []
