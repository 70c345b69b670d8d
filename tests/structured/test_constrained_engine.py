"""LLMEngine with constrained and unconstrained requests in one batch: the real sampler, the real
grammar library and the byte-level tokenizer over a fake runner whose logits are random, with
multi-step windows and with n-gram speculation (constrained sequences run one step, unspeculated)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine_core"))
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.model.sampler import Sampler
from llmdeploy_engine.sampling_params import SamplingParams, StructuredOutputsParams
from test_multi_step_core import MultiStepFakeRunner

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "tag": {"enum": ["a", "b", "c"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "word": {"type": "string", "pattern": "^[a-z]{0,4}$"},
    },
    "required": ["ok", "tag", "n", "word"],
}


class RandomLogitsRunner(MultiStepFakeRunner):
    """The fake runner's checked KV bookkeeping and decode windows; logits are random over the
    byte-level vocabulary (a window's steps take their argmax)."""

    def __init__(self, vocab: int, **kw):  # type: ignore[no-untyped-def]
        super().__init__(num_kv_blocks=512, block_size=4, max_model_len=512, **kw)
        self.vocab = vocab
        self.gen = torch.Generator().manual_seed(0)
        self.window_rows: list[int] = []

    def execute(self, batch):  # type: ignore[no-untyped-def]
        super().execute(batch)  # its checks of the KV reads
        # speculative verification: one row per draft token too (logit_rows)
        return torch.randn(len(batch.logit_rows()), self.vocab, generator=self.gen)


def make_engine(**cfg) -> tuple[LLMEngine, RandomLogitsRunner]:  # type: ignore[no-untyped-def]
    tok = Tokenizer.byte_level()
    runner = RandomLogitsRunner(tok.vocab_size)
    eng = LLMEngine(
        EngineConfig(model="fake", **cfg),
        runner=runner,
        tokenizer=tok,
        sampler=Sampler(set(tok.eos_token_ids)),
    )
    return eng, runner


def run(eng: LLMEngine, requests: dict[str, tuple[str, SamplingParams]]) -> dict[str, list[str]]:
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    texts: dict[str, list[str]] = {}
    for _ in range(10_000):
        if not eng.has_unfinished_requests():
            return texts
        for out in eng.step():
            if out.finished:
                texts[out.request_id] = [c.text for c in out.outputs]
                assert all(c.finish_reason == "stop" for c in out.outputs if rid_constrained(out.request_id))
    raise AssertionError("the engine made no progress")


def rid_constrained(request_id: str) -> bool:
    return request_id.startswith("c")


def mixed_requests() -> dict[str, tuple[str, SamplingParams]]:
    json_spec = StructuredOutputsParams.from_json_schema(SCHEMA)
    reqs: dict[str, tuple[str, SamplingParams]] = {}
    for i in range(4):
        reqs[f"c-json-{i}"] = (
            "abab abab",
            SamplingParams(temperature=1.0, max_tokens=200, structured_outputs=json_spec, n=2),
        )
        reqs[f"free-{i}"] = (
            "abab abab abab",
            SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True),
        )
    # greedy: a window could choose its tokens on the device, were it not constrained
    reqs["c-greedy"] = ("ab", SamplingParams(temperature=0.0, max_tokens=200, structured_outputs=json_spec))
    reqs["c-regex"] = (
        "x",
        SamplingParams(
            temperature=1.0,
            max_tokens=50,
            structured_outputs=StructuredOutputsParams(regex=r"[0-9]{2}-[xyz]{1,3}"),
        ),
    )
    reqs["c-choice"] = (
        "x",
        SamplingParams(
            temperature=1.0,
            max_tokens=50,
            structured_outputs=StructuredOutputsParams(choice=("left", "right")),
        ),
    )
    # ignore_eos: the sequence still ends where its grammar does
    reqs["c-noeos"] = (
        "x",
        SamplingParams(
            temperature=1.0,
            max_tokens=50,
            ignore_eos=True,
            structured_outputs=StructuredOutputsParams(choice=("yes", "no")),
        ),
    )
    return reqs


def check(texts: dict[str, list[str]]) -> None:
    for i in range(4):
        for text in texts[f"c-json-{i}"]:
            jsonschema.validate(json.loads(text), SCHEMA)
    jsonschema.validate(json.loads(texts["c-greedy"][0]), SCHEMA)
    assert re.fullmatch(r"[0-9]{2}-[xyz]{1,3}", texts["c-regex"][0])
    assert texts["c-choice"][0] in ("left", "right")
    assert texts["c-noeos"][0] in ("yes", "no")


def test_constrained_and_free_requests_share_batches_with_multi_step_windows() -> None:
    eng, runner = make_engine(num_scheduler_steps=4)
    assert eng.num_scheduler_steps == 4
    launched: list[int] = []
    original = runner.execute

    def spy(batch):  # type: ignore[no-untyped-def]
        launched.append(len(batch.sample_indices))
        return original(batch)

    runner.execute = spy  # type: ignore[method-assign]
    check(run(eng, mixed_requests()))
    assert max(launched) > 1, "constrained and free rows never shared a step"
    assert runner.windows, "the free requests never ran a multi-step window once alone"


def test_constrained_requests_are_not_speculated() -> None:
    eng, _ = make_engine(
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 1,
            "prompt_lookup_min": 1,
        }
    )
    assert eng.speculator is not None
    check(run(eng, mixed_requests()))
    assert eng.stats().spec_decode_num_drafts > 0, "the free requests were never speculated"
