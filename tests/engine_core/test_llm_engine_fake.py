"""LLMEngine over a fake paged runner: stops, detokenization, n > 1, abort, prefix cache, preemption."""

from __future__ import annotations

import itertools

import pytest
from core_fakes import FakeRunner, FakeSampler, FakeTokenizer, mixing_rule, successor_rule
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import SamplingParams


def engine(rule=successor_rule, **kw) -> LLMEngine:  # type: ignore[no-untyped-def]
    runner_kw = ("num_kv_blocks", "block_size", "max_model_len")  # the runner decides these
    cfg_kw = {k: kw.pop(k) for k in list(kw) if k in EngineConfig.__dataclass_fields__ and k not in runner_kw}
    cfg = EngineConfig(model="fake", **cfg_kw)
    return LLMEngine(
        cfg, runner=FakeRunner(rule=rule, **kw), tokenizer=FakeTokenizer(), sampler=FakeSampler()
    )


def run_all(eng: LLMEngine) -> tuple[dict[str, RequestOutput], dict[str, list[RequestOutput]]]:
    final: dict[str, RequestOutput] = {}
    stream: dict[str, list[RequestOutput]] = {}
    for _ in range(10_000):
        if not eng.has_unfinished_requests():
            break
        for out in eng.step():
            stream.setdefault(out.request_id, []).append(out)
            if out.finished:
                final[out.request_id] = out
    assert not eng.has_unfinished_requests()
    return final, stream


def generate(eng: LLMEngine, prompt: str | list[int], **params) -> RequestOutput:  # type: ignore[no-untyped-def]
    eng.add_request("r", prompt, SamplingParams(temperature=0, **params))
    return run_all(eng)[0]["r"]


def test_max_tokens_gives_length() -> None:
    out = generate(engine(), "a", max_tokens=5)
    c = out.outputs[0]
    assert c.text == "bcdef" and c.token_ids == [2, 3, 4, 5, 6]
    assert c.finish_reason == "length" and out.finished
    assert out.prompt == "a" and out.prompt_token_ids == [1]


def test_eos_stops_unless_ignored() -> None:
    c = generate(engine(), "x", max_tokens=20).outputs[0]
    assert c.text == "yz ab\n" and c.token_ids[-1] == 0
    assert c.finish_reason == "stop" and c.stop_reason is None
    c = generate(engine(), "x", max_tokens=8, ignore_eos=True).outputs[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 8 and c.text == "yz ab\nab"


def test_min_tokens_defers_eos() -> None:
    c = generate(engine(), "x", max_tokens=8, min_tokens=8).outputs[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 8


def test_stop_token_ids_report_the_id() -> None:
    c = generate(engine(), "a", max_tokens=20, stop_token_ids=[4]).outputs[0]
    assert c.text == "bc" and c.token_ids == [2, 3, 4]
    assert c.finish_reason == "stop" and c.stop_reason == 4
    c = generate(engine(), "a", max_tokens=20, stop_token_ids=[4], include_stop_str_in_output=True).outputs[0]
    assert c.text == "bcd"


def test_stop_string_across_tokens_is_trimmed() -> None:
    c = generate(engine(), "a", max_tokens=20, stop=["xyz", "def"]).outputs[0]
    assert c.text == "bc" and c.finish_reason == "stop" and c.stop_reason == "def"
    assert c.token_ids == [2, 3, 4, 5, 6]  # the tokens that formed the stop string are still reported
    c = generate(engine(), "a", max_tokens=20, stop="def", include_stop_str_in_output=True).outputs[0]
    assert c.text == "bcdef"


def test_stop_string_inside_a_multi_char_token() -> None:
    c = generate(engine(), "y", max_tokens=20, stop=" a").outputs[0]
    assert c.text == "z" and c.stop_reason == " a"


def test_stream_never_shows_a_stop_string_prefix() -> None:
    eng = engine()
    eng.add_request("r", "a", SamplingParams(temperature=0, max_tokens=20, stop="fgz"))
    _, stream = run_all(eng)
    texts = [o.outputs[0].text for o in stream["r"]]
    assert texts[0] == "" and texts[1] == "" and texts[2] == "b"  # "fg" may start "fgz": held back
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == "bcdefghijklmnopqrstu"


def test_prompt_longer_than_the_context_is_refused() -> None:
    eng = engine(max_model_len=16)
    with pytest.raises(ValueError, match="maximum context length is 16"):
        eng.add_request("a", [1] * 16, SamplingParams())
    with pytest.raises(ValueError, match=r"12 in the prompt, 5 for the completion"):
        eng.add_request("b", [1] * 12, SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match="empty"):
        eng.add_request("c", [], SamplingParams())
    eng.add_request("d", [1] * 12, SamplingParams(max_tokens=None, ignore_eos=True))
    assert len(run_all(eng)[0]["d"].outputs[0].token_ids) == 4
    assert not eng.has_unfinished_requests()


def test_duplicate_request_id_is_refused() -> None:
    eng = engine()
    eng.add_request("a", "a", SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("a", "a", SamplingParams())


def test_many_concurrent_requests_match_their_solo_runs() -> None:
    prompts = [[(7 * i + j) % 29 + 1 for j in range(3 + 4 * i)] for i in range(16)]
    solo = {}
    for i, p in enumerate(prompts):
        solo[i] = generate(engine(mixing_rule), p, max_tokens=4 + i).outputs[0].token_ids
    eng = engine(mixing_rule, max_num_batched_tokens=40, num_kv_blocks=48)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=4 + i))
    final, _ = run_all(eng)
    assert {int(k): v.outputs[0].token_ids for k, v in final.items()} == solo
    assert eng.stats().kv_cache_usage == 0.0


def test_preemption_under_a_tiny_pool_keeps_outputs() -> None:
    prompts = [[(3 * i + j) % 29 + 1 for j in range(10)] for i in range(4)]
    solo = [generate(engine(mixing_rule), p, max_tokens=20).outputs[0].token_ids for p in prompts]
    eng = engine(mixing_rule, num_kv_blocks=16, block_size=4, max_model_len=32)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=20))
    final, _ = run_all(eng)
    assert [final[str(i)].outputs[0].token_ids for i in range(4)] == solo
    assert eng.stats().num_preemptions > 0


def test_prefix_cache_hits_are_counted_and_change_nothing() -> None:
    eng = engine(mixing_rule)
    prompt = [(5 * j) % 29 + 1 for j in range(23)]
    first = generate(eng, prompt, max_tokens=6)
    eng.runner.num_forward_tokens = 0  # type: ignore[attr-defined]
    eng.add_request("again", prompt, SamplingParams(temperature=0, max_tokens=6))
    second = run_all(eng)[0]["again"]
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert second.num_cached_tokens == 20 and first.num_cached_tokens == 0
    assert eng.runner.num_forward_tokens == 3 + 5  # type: ignore[attr-defined]
    stats = eng.stats()
    assert stats.prefix_cache_hits_tokens == 20 and stats.prefix_cache_queries_tokens == 46
    off = engine(mixing_rule, enable_prefix_caching=False)
    generate(off, prompt, max_tokens=6)
    assert generate(off, prompt, max_tokens=6).num_cached_tokens == 0


def test_n_outputs_share_the_prompt() -> None:
    eng = engine(mixing_rule)
    prompt = [(5 * j) % 29 + 1 for j in range(10)]
    out = generate(eng, prompt, max_tokens=5, n=3, seed=7)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1  # greedy: all the same
    assert all(c.finish_reason == "length" for c in out.outputs)
    assert eng.stats().kv_cache_usage == 0.0


def test_abort_running_and_waiting() -> None:
    eng = engine(max_num_seqs=1)
    eng.add_request("a", "a", SamplingParams(max_tokens=20))
    eng.add_request("b", "b", SamplingParams(max_tokens=20))
    eng.step()
    assert eng.stats().num_requests_running == 1 and eng.stats().num_requests_waiting == 1
    out = eng.abort_request("a")
    assert out is not None and out.finished and out.outputs[0].finish_reason == "abort"
    assert eng.abort_request("b") is not None
    assert eng.abort_request("a") is None
    assert not eng.has_unfinished_requests() and eng.stats().kv_cache_usage == 0.0


def test_logprobs_and_metrics_are_filled() -> None:
    out = generate(engine(), "a", max_tokens=3, logprobs=1)
    c = out.outputs[0]
    assert c.logprobs is not None and len(c.logprobs) == 3
    assert c.logprobs[0][2].decoded_token == "b" and c.cumulative_logprob == 0.0
    m = out.metrics
    assert m is not None and m.first_token_time is not None and m.finished_time is not None
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time  # type: ignore[operator]


def test_stats_count_tokens() -> None:
    eng = engine()
    generate(eng, "abc", max_tokens=4)
    s = eng.stats()
    assert s.prompt_tokens_total == 3 and s.generation_tokens_total == 4 and s.num_requests_finished == 1
    assert s.startup_report == {"num_kv_blocks": 64}


@pytest.fixture
def gc_threshold():  # type: ignore[no-untyped-def]
    import gc

    saved = gc.get_threshold()
    gc.set_threshold(700, *saved[1:])
    yield
    gc.set_threshold(*saved)


def test_engine_raises_the_collectors_young_threshold(gc_threshold) -> None:  # type: ignore[no-untyped-def]
    """Building an engine raises Python's young-generation GC threshold (the step loop's passes cost a
    third of a decode window's host time); gc_gen0_threshold sets it, 0 leaves it, never lower."""
    import gc

    from llmdeploy_engine.core.gc_tuning import GC_GEN0_THRESHOLD, raise_gc_threshold

    engine()
    assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD
    # lower than now: left as it is
    assert raise_gc_threshold(1000) == GC_GEN0_THRESHOLD
    gc.set_threshold(700, *gc.get_threshold()[1:])
    assert raise_gc_threshold(0) == 700
    with pytest.raises(ValueError, match="gc_gen0_threshold"):
        engine(gc_gen0_threshold=-1)
