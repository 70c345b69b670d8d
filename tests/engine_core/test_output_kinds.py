"""RequestOutputKind: CUMULATIVE / DELTA / FINAL_ONLY outputs, and deferred detokenization."""

from __future__ import annotations

import pytest
from core_fakes import FakeRunner, FakeSampler, FakeTokenizer, mixing_rule, successor_rule
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.stop_checker import StopChecker
from llmdeploy_engine.llm import LLM
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams

CUM, DELTA, FINAL = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


def engine(rule=successor_rule) -> LLMEngine:  # type: ignore[no-untyped-def]
    return LLMEngine(
        EngineConfig(model="fake"),
        runner=FakeRunner(rule=rule),
        tokenizer=FakeTokenizer(),
        sampler=FakeSampler(),
    )


def run(eng: LLMEngine, requests: dict[str, tuple[str, SamplingParams]]) -> dict[str, list[RequestOutput]]:
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    seen: dict[str, list[RequestOutput]] = {rid: [] for rid in requests}
    for _ in range(1000):
        if not eng.has_unfinished_requests():
            break
        for out in eng.step():
            seen[out.request_id].append(out)
    assert not eng.has_unfinished_requests()
    return seen


CASES = [
    ("x", dict(max_tokens=20)),  # EOS
    ("x", dict(max_tokens=8, ignore_eos=True)),  # length
    ("x", dict(max_tokens=20, include_stop_str_in_output=True)),  # EOS text kept
    ("a", dict(max_tokens=20, stop_token_ids=[5])),
    ("a", dict(max_tokens=20, stop=["de"])),  # stop strings keep per-token detokenization
    ("a", dict(max_tokens=20, stop=["de"], include_stop_str_in_output=True)),
    ("a", dict(max_tokens=6, n=2, logprobs=1)),
    ("x", dict(max_tokens=8, min_tokens=7)),
]


@pytest.mark.parametrize(("prompt", "kw"), CASES)
def test_final_only_and_delta_match_cumulative(prompt: str, kw: dict[str, object]) -> None:
    runs = {
        kind: run(engine(), {"r": (prompt, SamplingParams(temperature=0, output_kind=kind, **kw))})["r"]
        for kind in (CUM, DELTA, FINAL)
    }
    cum_final = runs[CUM][-1]
    # FINAL_ONLY: exactly one output, the finished one, equal to the cumulative stream's last
    assert len(runs[FINAL]) == 1 and runs[FINAL][0].finished
    assert runs[FINAL][0].outputs == cum_final.outputs
    # DELTA: one output per step like CUMULATIVE; concatenating the deltas gives the final output
    assert len(runs[DELTA]) == len(runs[CUM])
    for i, c in enumerate(cum_final.outputs):
        deltas = [o.outputs[i] for o in runs[DELTA]]
        assert "".join(d.text for d in deltas) == c.text
        assert [t for d in deltas for t in d.token_ids] == c.token_ids
        if c.logprobs is not None:
            assert [lp for d in deltas for lp in d.logprobs or []] == c.logprobs
        assert deltas[-1].finish_reason == c.finish_reason and deltas[-1].stop_reason == c.stop_reason
    # and each cumulative output is the concatenation of the deltas so far
    for k, (cum, _) in enumerate(zip(runs[CUM], runs[DELTA], strict=True)):
        text = "".join(o.outputs[0].text for o in runs[DELTA][: k + 1])
        assert cum.outputs[0].text == text


def test_final_only_builds_no_intermediate_outputs_in_a_mixed_batch() -> None:
    seen = run(
        engine(mixing_rule),
        {
            "f": ("abc", SamplingParams(temperature=0, max_tokens=12, output_kind=FINAL)),
            "c": ("abc", SamplingParams(temperature=0, max_tokens=12)),
        },
    )
    assert len(seen["f"]) == 1 and len(seen["c"]) == 12
    assert seen["f"][0].outputs == seen["c"][-1].outputs


def test_abort_of_a_deferred_request_has_its_text() -> None:
    eng = engine()
    eng.add_request("r", "a", SamplingParams(temperature=0, max_tokens=20, output_kind=FINAL))
    for _ in range(4):
        assert eng.step() == []  # nothing is built for an unfinished FINAL_ONLY request
    out = eng.abort_request("r")
    assert out is not None and out.finished
    assert out.outputs[0].text == "bcde" and out.outputs[0].finish_reason == "abort"


def test_llm_generate_asks_for_final_only_and_keeps_the_callers_params() -> None:
    eng = engine()
    params = SamplingParams(temperature=0, max_tokens=5)
    outs = LLM.from_engine(eng).generate(["a", "b"], params, use_tqdm=False)
    assert [o.outputs[0].text for o in outs] == ["bcdef", "cdefg"]
    assert params.output_kind is CUM


def test_output_kind_is_validated() -> None:
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="final")  # type: ignore[arg-type]


class _ByteDecoder:
    """UTF-8 bytes as tokens (id = byte value), decoded like a byte-level tokenizer's incremental decoder."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def _text(self, start: int, end: int | None = None) -> str:
        return bytes(self.ids[start:end]).decode("utf-8", errors="replace")

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        before, full = self._text(self.prefix, self.read), self._text(self.prefix)
        if len(full) > len(before) and not full.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return full[len(before) :]
        return ""

    def flush(self) -> str:
        delta = self._text(self.prefix)[len(self._text(self.prefix, self.read)) :]
        self.prefix = self.read = len(self.ids)
        return delta


@pytest.mark.parametrize("text", ["héllo wörld", "日本語のテキスト", "a€b😀c"])
@pytest.mark.parametrize("cut", [0, 1, 2, 3])
@pytest.mark.parametrize("eos_end", [False, True])
def test_deferred_text_equals_per_token_text(text: str, cut: int, eos_end: bool) -> None:
    """Multi-byte characters split over tokens, ending on a length stop or on EOS mid-character."""
    ids = list(text.encode())
    ids = ids[: len(ids) - cut]
    eos = 255  # never a UTF-8 byte
    stream = [*ids, eos] if eos_end else ids
    texts = {}
    for kind in (CUM, FINAL):
        params = SamplingParams(max_tokens=len(ids) if not eos_end else 10_000, output_kind=kind)
        checker = StopChecker(params, _ByteDecoder(), {eos}, params.max_tokens or 0, 100_000)
        assert checker.deferred == (kind is FINAL)
        status = None
        for k, t in enumerate(stream, start=1):
            status = checker.on_token(t, k, k)
            if status is not None:
                break
        assert status is not None and k == len(stream)
        texts[kind] = checker.visible_text(True)
    assert texts[FINAL] == texts[CUM]


def test_async_delta_stream_hands_over_every_delta() -> None:
    import asyncio

    from llmdeploy_engine.async_engine import AsyncLLMEngine

    eng = AsyncLLMEngine(engine())

    async def main() -> tuple[list[RequestOutput], list[RequestOutput], list[RequestOutput]]:
        async def collect(kind: RequestOutputKind, rid: str) -> list[RequestOutput]:
            outs = []
            async for out in eng.generate(
                "a", SamplingParams(temperature=0, max_tokens=8, output_kind=kind), rid
            ):
                outs.append(out)
                await asyncio.sleep(0.01)  # slow consumer: the engine runs ahead
            return outs

        return await asyncio.gather(collect(DELTA, "d"), collect(CUM, "c"), collect(FINAL, "f"))

    deltas, cumulative, final = asyncio.run(main())
    eng.shutdown()
    assert "".join(o.outputs[0].text for o in deltas) == "bcdefghi"
    assert [t for o in deltas for t in o.outputs[0].token_ids] == list(range(2, 10))
    assert cumulative[-1].outputs[0].text == "bcdefghi"
    assert len(final) == 1 and final[0].outputs[0].text == "bcdefghi"


def test_window_tokens_at_once_match_token_by_token() -> None:
    """StopChecker.on_window_tokens (a decode window's tokens for one sequence in one call) against
    on_token on each: the tokens kept, the status, stop_reason and the final text, over random
    windows with EOS, stop token ids (with and without include_stop_str_in_output), ignore_eos,
    max_tokens and max_model_len."""
    import random

    rng = random.Random(0)
    eos = 10
    for case in range(400):
        window = [rng.choice([10, 11, 12, 65, 66, 0xC3, 0xA9]) for _ in range(rng.randint(1, 8))]
        params = SamplingParams(
            max_tokens=rng.randint(1, 12),
            ignore_eos=rng.random() < 0.3,
            stop_token_ids=rng.choice([[], [11], [11, 12]]),
            include_stop_str_in_output=rng.random() < 0.5,
            output_kind=FINAL,
        )
        max_model_len = rng.randint(4, 16)
        done_out = rng.randint(0, min(params.max_tokens or 0, max_model_len) - 1) if case % 2 else 0
        num_prompt = rng.randint(1, max(1, max_model_len - done_out - 1))
        checkers = [
            StopChecker(params, _ByteDecoder(), {eos}, params.max_tokens or 0, max_model_len) for _ in "ab"
        ]
        assert checkers[0].deferred
        # token by token, as the per-token path calls it (counts after each append)
        kept_a, status_a = 0, None
        for k, t in enumerate(window, start=1):
            kept_a = k
            status_a = checkers[0].on_token(t, done_out + k, num_prompt + done_out + k)
            if status_a is not None:
                break
        kept_b, status_b = checkers[1].on_window_tokens(window, done_out, num_prompt + done_out)
        assert (kept_b, status_b) == (kept_a, status_a), (case, window, params, max_model_len)
        assert checkers[1].stop_reason == checkers[0].stop_reason
        if status_a is not None:
            assert checkers[1].visible_text(True) == checkers[0].visible_text(True)
