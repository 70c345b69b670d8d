"""HTTP layer against a fake engine: request parsing, response and stream shapes, errors, metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from llmdeploy_engine.server.app import build_app
from llmdeploy_engine.server.state import ServerSettings

from tests.server.fake_engine import REPLY, FakeEngine, QueueFull

MODEL = "fake-model"


def make_client(engine: FakeEngine, api_key: str | None = None) -> TestClient:
    settings = ServerSettings(
        served_model_names=(MODEL, "alias"),
        model_path="/models/fake.gguf",
        api_key=api_key,
        queue_full_errors=(QueueFull,),
        max_num_seqs=8,
    )
    return TestClient(build_app(settings, engine=engine), raise_server_exceptions=False)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with make_client(engine) as c:
        yield c


def sse_events(client: TestClient, path: str, body: dict[str, object]) -> list[str]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert text.endswith("\n\n")
    return [block for block in text.split("\n\n") if block]


def openai_chunks(events: list[str]) -> list[dict[str, object]]:
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def test_health_and_models(client: TestClient) -> None:
    assert client.get("/health").status_code == 200
    data = client.get("/v1/models").json()
    assert [m["id"] for m in data["data"]] == [MODEL, "alias"]
    assert data["data"][0]["max_model_len"] == 256


def test_completion_plain(client: TestClient, engine: FakeEngine) -> None:
    r = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 5, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == REPLY[:5]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    prompt, params = engine.seen[0]
    assert prompt == [1, ord("h"), ord("i")] and params.greedy and params.max_tokens == 5


def test_completion_many_prompts_n_and_echo(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": [[5, 6], [7]], "max_tokens": 2, "n": 2, "echo": True})
    body = r.json()
    assert r.status_code == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["choices"][1]["text"] == "\x05\x06" + REPLY[1:3]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 8


def test_completion_logprobs_shape(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "logprobs": 2})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == list(REPLY[:3])
    assert len(lp["token_logprobs"]) == 3 and lp["text_offset"] == [0, 1, 2]
    assert all(len(t) == 2 for t in lp["top_logprobs"])


def test_completion_stream_with_usage(client: TestClient) -> None:
    chunks = openai_chunks(
        sse_events(
            client,
            "/v1/completions",
            {"prompt": "hi", "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}},
        )
    )
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == REPLY[:6]
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all(c["object"] == "text_completion" for c in chunks)


def test_chat_plain_and_stop(client: TestClient, engine: FakeEngine) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": "alias",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_completion_tokens": 30,
            "stop": [","],
        },
    )
    body = r.json()
    assert r.status_code == 200, body
    msg = body["choices"][0]
    assert msg["message"] == {
        "role": "assistant",
        "content": "hello world",
        "refusal": None,
        "tool_calls": [],
    }
    assert msg["finish_reason"] == "stop" and msg["stop_reason"] == ","
    assert body["object"] == "chat.completion" and body["model"] == "alias"
    prompt, _ = engine.seen[0]
    assert prompt[0] != 1, "a rendered chat template is encoded without adding special tokens again"


def test_chat_stream_shape(client: TestClient) -> None:
    chunks = openai_chunks(
        sse_events(
            client,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "stream": True,
                "logprobs": True,
                "top_logprobs": 2,
                "stream_options": {"include_usage": True},
            },
        )
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks[1:] if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == REPLY[:4]
    assert len(content[0]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    final = chunks[-2]
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 4
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def assert_openai_error(r: object, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text  # type: ignore[attr-defined]
    err = r.json()["error"]  # type: ignore[attr-defined]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_bad_requests_are_400(client: TestClient) -> None:
    assert_openai_error(client.post("/v1/chat/completions", json={"model": MODEL}), 400)
    assert_openai_error(client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 1}), 400)
    err = assert_openai_error(client.post("/v1/completions", json={"prompt": "x", "temperature": -1}), 400)
    assert err["param"] == "temperature"
    assert_openai_error(client.post("/v1/completions", json={"prompt": "x", "logit_bias": {"1": 2}}), 400)
    assert_openai_error(client.post("/v1/completions", json={"prompt": [99999]}), 400)
    assert_openai_error(
        client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}),
        400,
    )
    assert_openai_error(client.post("/generate", json={"inputs": "x", "parameters": {"top_k": 0}}), 400)
    assert_openai_error(client.post("/v1/completions", json={"prompt": "x", "seed": 2**64}), 400)
    err = assert_openai_error(client.post("/v1/completions", json={"prompt": "x", "n": 128}), 400)
    assert err["param"] == "n"
    tools = {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}
    assert_openai_error(client.post("/v1/chat/completions", json=tools), 400)
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert_openai_error(client.post("/v1/chat/completions", json=image), 400)


def test_too_long_prompt_is_400(client: TestClient) -> None:
    err = assert_openai_error(
        client.post("/v1/completions", json={"prompt": "x" * 300, "max_tokens": 1}), 400
    )
    assert "maximum context length is 256" in str(err["message"])
    assert_openai_error(client.post("/v1/completions", json={"prompt": "x" * 200, "max_tokens": 100}), 400)


def test_unknown_model_and_route_are_404(client: TestClient) -> None:
    err = assert_openai_error(client.post("/v1/completions", json={"model": "nope", "prompt": "x"}), 404)
    assert err["code"] == "model_not_found"
    assert_openai_error(client.get("/v1/nothing"), 404)


def test_queue_full_is_503() -> None:
    with make_client(FakeEngine(queue_full=True)) as c:
        r = c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True}
        )
        assert_openai_error(r, 503)
        assert r.headers["retry-after"]
        assert_openai_error(c.post("/generate", json={"inputs": "x"}), 503)


def test_engine_failure_is_500_in_openai_shape() -> None:
    class Broken(FakeEngine):
        async def generate(self, prompt, params, request_id):  # type: ignore[no-untyped-def, override]
            raise RuntimeError("boom")
            yield  # pragma: no cover

    with make_client(Broken()) as c:
        err = assert_openai_error(c.post("/v1/completions", json={"prompt": "x"}), 500)
        assert err["type"] == "server_error"
        assert c.get("/health").status_code == 200


def test_api_key() -> None:
    with make_client(FakeEngine(), api_key="s3cret") as c:
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert_openai_error(c.get("/v1/models"), 401)
        assert_openai_error(c.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
        assert_openai_error(c.post("/generate", json={"inputs": "x"}), 401)
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_tgi_generate_and_root(client: TestClient, engine: FakeEngine) -> None:
    r = client.post(
        "/generate",
        json={"inputs": "hi", "parameters": {"max_new_tokens": 3, "details": True, "top_n_tokens": 2}},
    )
    body = r.json()
    assert r.status_code == 200, body
    assert body["generated_text"] == REPLY[:3]
    d = body["details"]
    assert d["finish_reason"] == "length" and d["generated_tokens"] == 3
    assert [t["text"] for t in d["tokens"]] == list(REPLY[:3]) and d["tokens"][0]["special"] is False
    assert len(d["top_tokens"][0]) == 2
    assert engine.seen[0][1].greedy
    root = client.post(
        "/",
        json={
            "inputs": "hi",
            "parameters": {"max_new_tokens": 2, "return_full_text": True, "do_sample": True},
        },
    )
    assert root.json() == [{"generated_text": "hi" + REPLY[:2]}]
    assert not engine.seen[1][1].greedy


def test_tgi_stream(client: TestClient) -> None:
    events = sse_events(
        client,
        "/generate_stream",
        {"inputs": "hi", "parameters": {"max_new_tokens": 4, "details": True, "stop": ["l"]}},
    )
    assert all(e.startswith("data:") for e in events)
    payloads = [json.loads(e[len("data:") :]) for e in events]
    assert [p["token"]["text"] for p in payloads] == ["h", "e", ""]
    assert payloads[-1]["generated_text"] == "he"
    assert payloads[-1]["details"]["finish_reason"] == "stop_sequence"
    assert all(p["generated_text"] is None for p in payloads[:-1])


def test_tgi_info(client: TestClient) -> None:
    info = client.get("/info").json()
    assert info["model_id"] == MODEL and info["max_total_tokens"] == 256 and info["max_input_tokens"] == 255


def test_metrics_names_and_counts(client: TestClient) -> None:
    client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
    client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stop": "e"},
    )
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:time_per_output_token_seconds_sum",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:cache_config_info",
        "llmdeploy:weights_gib",
        "llmdeploy:available_kv_cache_gib",
        "llmdeploy:kv_cache_tokens",
        "llmdeploy:num_kv_blocks",
        "llmdeploy:max_concurrency",
        "vllm:num_preemptions_total",
    ):
        assert name in text, name
    # prometheus_client writes values as float64 (6 as 6.0) and labels sorted by name, as vLLM's /metrics reads
    lines = {
        k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if not ln.startswith("#"))
    }
    lab = f'model_name="{MODEL}"'
    assert lines[f"vllm:prompt_tokens_total{{{lab}}}"] == 3 + len(engine_prompt_chat())
    assert lines[f"vllm:generation_tokens_total{{{lab}}}"] == 6
    assert lines[f'vllm:request_success_total{{finished_reason="length",{lab}}}'] == 1
    assert lines[f'vllm:request_success_total{{finished_reason="stop",{lab}}}'] == 1
    assert lines[f"vllm:e2e_request_latency_seconds_count{{{lab}}}"] == 2
    assert lines[f"vllm:time_to_first_token_seconds_count{{{lab}}}"] == 2
    assert lines[f"vllm:inter_token_latency_seconds_count{{{lab}}}"] == (4 - 1) + (2 - 1)
    assert lines[f"vllm:time_per_output_token_seconds_count{{{lab}}}"] == 2
    assert lines[f"llmdeploy:num_kv_blocks{{{lab}}}"] == 256
    assert 'num_gpu_blocks="256"' in text and 'block_size="16"' in text


def engine_prompt_chat() -> str:
    return "<user>x\n<assistant>"


def test_tgi_stream_closes_when_finish_comes_without_a_token() -> None:
    import dataclasses

    class LateFinish(FakeEngine):
        async def generate(self, prompt, params, request_id):  # type: ignore[no-untyped-def, override]
            async for out in super().generate(prompt, params, request_id):
                if out.finished:
                    open_outs = [dataclasses.replace(c, finish_reason=None) for c in out.outputs]
                    yield dataclasses.replace(out, outputs=open_outs, finished=False)
                yield out

    with make_client(LateFinish()) as c:
        events = sse_events(c, "/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 3}})
    payloads = [json.loads(e[len("data:") :]) for e in events]
    assert payloads[-1]["generated_text"] == REPLY[:3]
    assert [p["token"]["text"] for p in payloads] == [*REPLY[:3], ""]
