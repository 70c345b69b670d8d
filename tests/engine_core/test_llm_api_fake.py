"""LLM (offline) and AsyncLLMEngine over the fake paged runner: order, batching, streaming, cancel."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import pytest
from core_fakes import FakeRunner, FakeSampler, FakeTokenizer, successor_rule
from llmdeploy_engine.async_engine import AsyncLLMEngine, EngineDeadError, QueueFullError
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm import LLM
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import SamplingParams


def fake_engine(runner: FakeRunner | None = None, **cfg: object) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model="fake", **cfg),  # type: ignore[arg-type]
        runner=runner or FakeRunner(rule=successor_rule),
        tokenizer=FakeTokenizer(),
        sampler=FakeSampler(),
    )


class CountingRunner(FakeRunner):
    def __init__(self) -> None:
        super().__init__(rule=successor_rule)
        self.batch_sizes: list[int] = []

    def execute(self, batch):  # type: ignore[no-untyped-def]
        self.batch_sizes.append(batch.num_seqs)
        return super().execute(batch)


def test_generate_returns_one_output_per_prompt_in_order_batched() -> None:
    runner = CountingRunner()
    llm = LLM.from_engine(fake_engine(runner))
    prompts = ["a", "bc", "def", "x"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    assert [o.outputs[0].text for o in outs] == ["bcd", "def", "ghi", "yz "]
    assert max(runner.batch_sizes) == 4  # all prompts ran together, not one by one
    one = llm.generate("a", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(one) == 1 and one[0].outputs[0].text == "bc"


def test_generate_accepts_token_prompts_and_per_prompt_params() -> None:
    llm = LLM.from_engine(fake_engine())
    outs = llm.generate(
        [{"prompt_token_ids": [1]}, {"prompt": "b"}],
        [SamplingParams(temperature=0, max_tokens=1), SamplingParams(temperature=0, max_tokens=2)],
        use_tqdm=False,
    )
    assert [o.outputs[0].text for o in outs] == ["b", "cd"]
    with pytest.raises(ValueError, match="2 prompts"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)


def test_a_bad_prompt_leaves_nothing_behind() -> None:
    llm = LLM.from_engine(fake_engine())
    with pytest.raises(ValueError, match="empty"):
        llm.generate(["a", ""], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_chat_uses_the_template() -> None:
    llm = LLM.from_engine(fake_engine())
    outs = llm.chat(
        [{"role": "user", "content": "x"}], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False
    )
    assert outs[0].prompt_token_ids == [24, 27] and outs[0].outputs[0].text == "ab\n"
    many = llm.chat([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], use_tqdm=False)
    assert len(many) == 2


def test_unknown_llm_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="unknown engine arguments"):
        LLM("model.gguf", not_a_knob=1)


async def collect(agen) -> list[RequestOutput]:  # type: ignore[no-untyped-def]
    return [o async for o in agen]


def test_async_streams_cumulative_outputs() -> None:
    eng = AsyncLLMEngine(fake_engine())

    async def main() -> None:
        a, b = await asyncio.gather(
            collect(eng.generate("a", SamplingParams(temperature=0, max_tokens=5), "a")),
            collect(eng.generate("x", SamplingParams(temperature=0, max_tokens=10), "b")),
        )
        assert a[-1].finished and a[-1].outputs[0].text == "bcdef"
        assert all(o.outputs[0].text.startswith(p.outputs[0].text) for p, o in itertools.pairwise(a))
        assert b[-1].outputs[0].finish_reason == "stop"

    asyncio.run(main())
    assert eng.stats().kv_cache_usage == 0.0
    eng.shutdown()
    assert not eng.is_running


def test_async_cancelled_consumer_frees_its_blocks() -> None:
    eng = AsyncLLMEngine(fake_engine(SlowRunner(rule=successor_rule, delay_s=0.02), max_num_seqs=4))

    async def wait_until(cond: Callable[[], bool], timeout_s: float = 20.0) -> bool:
        """Polls cond (a loaded CI machine can starve the event loop: the bound is generous)."""
        deadline = time.monotonic() + timeout_s
        while not cond() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return cond()

    def idle() -> bool:
        return eng.stats().kv_cache_usage == 0.0 and eng.stats().num_requests_running == 0

    async def main() -> None:
        # 80 tokens at >= 20 ms a step: seconds of work, so the request is still running when the
        # client goes away however slowly this machine schedules the test
        params = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
        gen = eng.generate("a" * 5, params, "long")
        first = await gen.__anext__()
        assert not first.finished
        assert eng.stats().kv_cache_usage > 0
        await gen.aclose()  # the client went away
        assert await wait_until(idle)

        task = asyncio.create_task(collect(eng.generate("b", params, "t")))
        assert await wait_until(lambda: eng.stats().num_requests_running == 1)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wait_until(idle)
        assert not eng.engine.has_unfinished_requests()

    asyncio.run(main())
    eng.shutdown()


def test_async_abort_ends_the_stream_with_abort() -> None:
    eng = AsyncLLMEngine(fake_engine(SlowRunner(rule=successor_rule)))

    async def main() -> None:
        params = SamplingParams(temperature=0, max_tokens=90, ignore_eos=True)
        outs = []
        async for out in eng.generate("a", params, "r"):
            outs.append(out)
            if len(outs) == 2:
                await eng.abort("r")
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"

    asyncio.run(main())
    eng.shutdown()


def test_async_bad_prompt_raises_value_error() -> None:
    eng = AsyncLLMEngine(fake_engine())

    async def main() -> None:
        with pytest.raises(ValueError, match="maximum context length"):
            await collect(eng.generate([1] * 200, SamplingParams(), "r"))

    asyncio.run(main())
    assert eng.is_running
    eng.shutdown()


def test_async_queue_full() -> None:
    eng = AsyncLLMEngine(fake_engine(max_num_seqs=1, max_queue_len=2))

    async def main() -> None:
        params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
        gens = [eng.generate("a", params, f"r{i}") for i in range(3)]
        firsts = [asyncio.create_task(g.__anext__()) for g in gens]
        done = await asyncio.gather(*firsts, return_exceptions=True)
        assert sum(isinstance(d, QueueFullError) for d in done) >= 1
        for g in gens:
            await g.aclose()

    asyncio.run(main())
    eng.shutdown()


class SlowRunner(FakeRunner):
    def __init__(self, *args, delay_s: float = 0.002, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.delay_s = delay_s

    def execute(self, batch):  # type: ignore[no-untyped-def]
        time.sleep(self.delay_s)
        return super().execute(batch)


class ExplodingRunner(FakeRunner):
    def execute(self, batch):  # type: ignore[no-untyped-def]
        raise RuntimeError("kernel exploded")


def test_async_loop_errors_reach_every_request() -> None:
    eng = AsyncLLMEngine(fake_engine(ExplodingRunner()))

    async def main() -> None:
        with pytest.raises(EngineDeadError, match="kernel exploded"):
            await collect(eng.generate("a", SamplingParams(), "r"))
        with pytest.raises(EngineDeadError):
            await collect(eng.generate("a", SamplingParams(), "r2"))

    asyncio.run(main())
    assert not eng.is_running and isinstance(eng.dead_error, RuntimeError)


def test_from_config_builds_the_engine_on_the_loop_thread_and_raises_its_errors(monkeypatch) -> None:
    """All torch work of a served engine starts from one thread (async_engine.from_config)."""
    import threading

    from llmdeploy_engine import async_engine

    built_on: list[str] = []

    def build(config: EngineConfig) -> LLMEngine:
        built_on.append(threading.current_thread().name)
        if config.model == "broken":
            raise ValueError("no such model")
        return fake_engine()

    monkeypatch.setattr(async_engine, "LLMEngine", build)
    eng = AsyncLLMEngine.from_config(EngineConfig(model="fake"))
    try:
        assert built_on == [async_engine.LOOP_THREAD_NAME] and eng.is_running

        async def main() -> list[RequestOutput]:
            return await collect(eng.generate("a", SamplingParams(max_tokens=2), "r"))

        assert asyncio.run(main())[-1].finished
    finally:
        eng.shutdown()
    with pytest.raises(ValueError, match="no such model"):
        AsyncLLMEngine.from_config(EngineConfig(model="broken"))
