"""On a CUDA GPU: speculative decoding (n-gram and a draft model) gives the same greedy tokens as plain
decoding (CUDA graphs for plain decode steps, eager verification steps; the draft model's steps
replay its own graphs, except those that feed a prompt), and frees every KV block."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MODEL = "random:Qwen/Qwen2.5-0.5B"


def config(spec: dict[str, Any] | None) -> EngineConfig:
    # float32 so verification (several tokens per sequence) and decode agree to the last bit that matters
    return EngineConfig(
        model=MODEL, device="cuda", dtype="float32", max_model_len=1024, gpu_memory_utilization=0.25,
        speculative_config=spec,
    )  # fmt: skip


def generate(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [done[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def base() -> LLMEngine:
    return LLMEngine(config(None))


@pytest.fixture(scope="module")
def prompts(base: LLMEngine) -> list[list[int]]:
    vocab = base.tokenizer.vocab_size
    unit = [(37 * i + 11) % (vocab - 10) + 5 for i in range(7)]
    return [(unit * 20)[:120], [(13 * i) % (vocab - 10) + 5 for i in range(50)], (unit * 3)[:20]]


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1},
        {"model": MODEL, "num_speculative_tokens": 3},
    ],
)
def test_speculative_greedy_matches_plain_greedy(
    base: LLMEngine, prompts: list[list[int]], spec: dict[str, Any]
) -> None:
    want = generate(base, prompts, 64)
    engine = LLMEngine(config(spec), runner=base.runner, tokenizer=base.tokenizer)
    assert generate(engine, prompts, 64) == want
    stats = engine.stats()
    assert stats.spec_decode_num_draft_tokens > 0
    if "model" in spec:  # the same random weights as the target: it proposes the target's own tokens
        assert stats.spec_decode_num_accepted_tokens >= 0.9 * stats.spec_decode_num_draft_tokens
        # the draft's steps replay its own CUDA graphs, the catch-up after each verification included
        # (evened out to the same tokens per sequence): only passes that feed a prompt run eagerly
        assert engine.speculator is not None and engine.speculator.draft is not None
        draft = engine.speculator.draft
        assert draft.runner.num_replays > 0
        assert draft.num_passes - draft.runner.num_replays <= len(prompts)
        assert draft.num_windows > 0  # proposals 2..k as one decode window of the draft's graphs
