"""The engine's Python APIs on the real default model (SmolLM2-135M-Instruct GGUF), CPU.

One model load for the module: the offline `LLM`; its `llm_engine` serves the LLMEngine checks and,
wrapped in AsyncLLMEngine, the streaming checks. Greedy output is compared with Hugging Face
transformers' `generate` on the same GGUF.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from default_model import DEFAULT_MODEL_GGUF, needs_default_model

torch = pytest.importorskip("torch")

from llmdeploy_engine.async_engine import AsyncLLMEngine  # noqa: E402
from llmdeploy_engine.llm import LLM  # noqa: E402
from llmdeploy_engine.llm_engine import LLMEngine  # noqa: E402
from llmdeploy_engine.outputs import RequestOutput  # noqa: E402
from llmdeploy_engine.sampling_params import SamplingParams  # noqa: E402

GGUF = DEFAULT_MODEL_GGUF
pytestmark = [pytest.mark.slow, needs_default_model]

VLLM_EXAMPLE_PROMPTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    torch.set_num_threads(2)
    # a small token budget so 16 concurrent prompts are prefilled in chunks over several steps
    return LLM(
        model=str(GGUF),
        kv_cache_memory_bytes=128 * 2**20,
        max_model_len=1024,
        max_num_batched_tokens=128,
        device="cpu",
        cpu_weights="float32",  # compared with transformers on the same float32 weights
    )


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, RequestOutput]:
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params)
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def test_offline_example_one_prompt_and_a_batch_of_four(llm: LLM) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12, seed=1)
    outputs = llm.generate(VLLM_EXAMPLE_PROMPTS, params, use_tqdm=False)
    assert [o.prompt for o in outputs] == VLLM_EXAMPLE_PROMPTS
    for out in outputs:
        c = out.outputs[0]
        assert c.text and 1 <= len(c.token_ids) <= 12 and c.finish_reason in ("stop", "length")
        assert out.metrics is not None and out.metrics.finished_time is not None
        print(f"{out.prompt!r} -> {c.text!r}")
    # the same seeded request alone gives the same text as inside the batch
    one = llm.generate(VLLM_EXAMPLE_PROMPTS[2], params, use_tqdm=False)
    assert one[0].outputs[0].text == outputs[2].outputs[0].text
    chat = llm.chat(
        [{"role": "user", "content": "What is 2 + 2?"}], SamplingParams(temperature=0, max_tokens=8)
    )
    assert chat[0].outputs[0].text
    assert llm.llm_engine.stats().kv_cache_usage == 0.0


def test_sixteen_concurrent_requests_match_their_solo_runs(llm: LLM) -> None:
    engine = llm.llm_engine
    tok = llm.get_tokenizer()
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "a",
        "river",
        "runs",
        "to",
        "the",
        "sea",
    ]
    prompts = [tok.encode(" ".join(words[: 1 + i % len(words)] * (1 + i // 4))) for i in range(16)]
    assert len({len(p) for p in prompts}) >= 10
    engine.block_manager.reset_prefix_cache()
    solo = {}
    for i, p in enumerate(prompts):
        solo[str(i)] = run(engine, {"solo": (p, GREEDY)})["solo"].outputs[0].token_ids
        engine.block_manager.reset_prefix_cache()  # every solo run computes its whole prompt
    together = run(engine, {str(i): (p, GREEDY) for i, p in enumerate(prompts)})
    assert {rid: out.outputs[0].token_ids for rid, out in together.items()} == solo
    assert engine.stats().kv_cache_usage == 0.0


def test_prefix_cache_hits_give_the_same_tokens(llm: LLM) -> None:
    engine = llm.llm_engine
    tok = llm.get_tokenizer()
    system = "You are a careful assistant. Answer in one short sentence, and never invent facts. " * 3
    first, second = tok.encode(system + "Name a color."), tok.encode(system + "Name a fruit.")
    engine.block_manager.reset_prefix_cache()
    miss = run(engine, {"miss": (second, GREEDY)})["miss"]
    assert miss.num_cached_tokens == 0
    engine.block_manager.reset_prefix_cache()
    before = engine.stats().prefix_cache_hits_tokens
    run(engine, {"warm": (first, GREEDY)})
    hit = run(engine, {"hit": (second, GREEDY)})["hit"]
    gained = engine.stats().prefix_cache_hits_tokens - before
    assert hit.num_cached_tokens >= 32 and gained == hit.num_cached_tokens
    assert hit.outputs[0].token_ids == miss.outputs[0].token_ids


def test_greedy_matches_transformers_generate(llm: LLM, hf_model: Any) -> None:
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in (*VLLM_EXAMPLE_PROMPTS[:3], "def fibonacci(n):\n    ")]
    # min_tokens masks EOS the way transformers' min_new_tokens does
    params = SamplingParams(temperature=0, max_tokens=10, min_tokens=10)
    ours = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for p, out in zip(prompts, ours, strict=True):
        with torch.inference_mode():
            ref = hf_model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=10,
                min_new_tokens=10,
                do_sample=False,
                pad_token_id=0,
            )
        assert out.outputs[0].token_ids == [int(t) for t in ref[0, len(p) :]]


def test_stop_string_and_n_and_logprobs(llm: LLM) -> None:
    base = llm.generate(
        "The capital of France is", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False
    )
    text = base[0].outputs[0].text
    stop = text[3:7]  # spans token boundaries in general
    cut = llm.generate(
        "The capital of France is", SamplingParams(temperature=0, max_tokens=12, stop=stop), use_tqdm=False
    )[0].outputs[0]
    assert cut.text == text[: text.index(stop)] and cut.stop_reason == stop and cut.finish_reason == "stop"
    multi = llm.generate(
        "Once upon a time",
        SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=5, logprobs=2),
        use_tqdm=False,
    )[0]
    assert [c.index for c in multi.outputs] == [0, 1, 2]
    for c in multi.outputs:
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        assert all(t in lp and len(lp) >= 2 for t, lp in zip(c.token_ids, c.logprobs, strict=True))
        assert c.cumulative_logprob is not None and c.cumulative_logprob < 0
    assert llm.llm_engine.stats().kv_cache_usage == 0.0


def test_async_streaming_example_and_cancelled_stream(llm: LLM) -> None:
    engine = AsyncLLMEngine(llm.llm_engine)

    async def main() -> None:
        params = SamplingParams(temperature=0, max_tokens=10)
        deltas, last_text = [], ""
        async for out in engine.generate("The future of AI is", params, "stream-1"):
            text = out.outputs[0].text
            deltas.append(text[len(last_text) :])
            last_text = text
        assert out.finished and "".join(deltas) == out.outputs[0].text

        long = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
        gen = engine.generate("Write a very long story about the sea.", long, "stream-2")
        seen = 0
        async for _ in gen:
            seen += 1
            if seen == 2:
                break  # the consumer goes away mid-stream
        await gen.aclose()
        assert engine.stats().kv_cache_usage > 0 or engine.stats().num_requests_running == 0
        deadline = time.time() + 60
        while time.time() < deadline and engine.stats().kv_cache_usage != 0.0:
            await asyncio.sleep(0.05)
        assert engine.stats().kv_cache_usage == 0.0

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.fixture(scope="module")
def hf_model() -> Iterator[Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32)
    yield model.eval()
