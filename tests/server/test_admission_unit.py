"""A multi-prompt request is one unit: a failing part aborts every other part (fake engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fastapi.testclient import TestClient
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import SamplingParams
from llmdeploy_engine.server.app import build_app
from llmdeploy_engine.server.state import ServerSettings

from tests.server.fake_engine import FakeEngine, QueueFull


class OnePartFails(FakeEngine):
    """Every request runs slowly, except the one whose prompt is "bad": it fails after one token."""

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        assert isinstance(prompt, list)
        async for out in super().generate(prompt, params, request_id):
            yield out
            if prompt[-3:] == [ord("b"), ord("a"), ord("d")]:
                raise ValueError("this part failed")


def _client(engine: FakeEngine, **settings: int) -> TestClient:
    config = ServerSettings(
        served_model_names=("fake",), model_path="/m", queue_full_errors=(QueueFull,), **settings
    )
    return TestClient(build_app(config, engine=engine), raise_server_exceptions=False)


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_part_aborts_every_other_part(stream: bool) -> None:
    engine = OnePartFails(token_delay_s=0.01)
    with _client(engine) as c:
        r = c.post(
            "/v1/completions",
            json={"prompt": ["slow one", "bad", "slow two"], "max_tokens": 200, "stream": stream},
        )
        if stream:
            assert r.status_code == 200
            assert '"error"' in r.text and r.text.endswith("data: [DONE]\n\n")
        else:
            assert r.status_code == 500, r.text
        # checked while the server still runs (closing the client would cancel everything anyway)
        assert engine.running == set(), f"parts still running after one failed: {engine.running}"
        aborted = {rid.rsplit("-", 1)[1] for rid in engine.aborted}
        assert {"0", "2"} <= aborted, engine.aborted


def test_too_many_sequences_is_400_before_anything_runs() -> None:
    engine = FakeEngine()
    with _client(engine, max_num_seqs_per_request=6) as c:
        r = c.post("/v1/completions", json={"prompt": ["a", "b", "c", "d"], "n": 2, "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "n"
        assert "--max-num-seqs-per-request" in r.json()["error"]["message"]
        ok = c.post("/v1/completions", json={"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 6
    assert len(engine.seen) == 3


def test_more_prompts_than_the_queue_holds_is_400() -> None:
    with _client(FakeEngine(), max_queue_len=2) as c:
        r = c.post("/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 2})
        assert r.status_code == 400 and "--max-queue-len" in r.json()["error"]["message"], r.text
