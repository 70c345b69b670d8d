"""The real server process on the default model (CPU): SDK clients, TGI shapes, metrics, errors, abort.

One server start for the module, through `llmdeploy serve --model ...`; it runs with an API key, so the
401 checks share it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from engine_server import metric_values, start
from httpx_sse import EventSource

pytestmark = pytest.mark.slow

MODEL_NAME = "smollm2"
API_KEY = "test-key"
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = start(
        tmp_path_factory.mktemp("server"),
        *("--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", "64M"),
        *("--max-num-seqs", "2", "--max-queue-len", "1", "--api-key", API_KEY),
        through_toolkit=True,
    )
    try:
        yield engine.url
    finally:
        engine.stop(timeout_s=30)
    assert "KV cache size" in engine.log(), "the start-up report is logged"


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def test_openai_sdk_chat_and_completions(server: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key=API_KEY)
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=12, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens <= 12
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "What is 2+2?"}],
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content, "greedy stream and plain answers agree"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == chat.usage.total_tokens
    comp = client.completions.create(
        model=MODEL_NAME, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2
    )
    assert comp.choices[0].text and len(comp.choices[0].logprobs.tokens) == comp.usage.completion_tokens
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL_NAME, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    ]
    assert "".join(pieces) == comp.choices[0].text


def test_huggingface_inference_client(server: str) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=server, api_key=API_KEY)
    out = client.chat_completion(
        messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0.0
    )
    assert out.choices[0].message.content
    tgi = InferenceClient(model=server, token=API_KEY)
    text = tgi.text_generation("Once upon a time", max_new_tokens=8)
    assert isinstance(text, str) and text
    streamed = list(tgi.text_generation("Once upon a time", max_new_tokens=8, stream=True))
    assert "".join(streamed) == text, "greedy TGI stream and plain answers agree"
    detailed = tgi.text_generation("Once upon a time", max_new_tokens=8, details=True)
    assert detailed.details is not None and detailed.details.generated_tokens == len(detailed.details.tokens)
    events = list(tgi.text_generation("Once upon a time", max_new_tokens=4, stream=True, details=True))
    assert events[-1].generated_text is not None and events[-1].details.finish_reason in (
        "length",
        "eos_token",
    )


def test_tgi_raw_shapes(server: str) -> None:
    info = httpx.get(server + "/info", timeout=10).json()
    assert info["model_id"] == MODEL_NAME and info["max_total_tokens"] == MAX_MODEL_LEN
    body = httpx.post(
        server + "/generate",
        headers=auth(),
        timeout=120,
        json={
            "inputs": "Hello",
            "parameters": {"max_new_tokens": 4, "details": True, "return_full_text": True},
        },
    ).json()
    assert body["generated_text"].startswith("Hello") and body["details"]["generated_tokens"] <= 4
    with httpx.stream(
        "POST",
        server + "/generate_stream",
        headers=auth(),
        timeout=120,
        json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}},
    ) as r:
        events = [event.json() for event in EventSource(r).iter_sse()]
    assert all(set(e["token"]) == {"id", "text", "logprob", "special"} for e in events)
    assert events[-1]["generated_text"] is not None


def test_errors(server: str) -> None:
    no_key = httpx.post(server + "/v1/completions", json={"model": MODEL_NAME, "prompt": "x"}, timeout=30)
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server + "/health", timeout=10).status_code == 200
    unknown = httpx.post(
        server + "/v1/completions", headers=auth(), json={"model": "other", "prompt": "x"}, timeout=30
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    long = httpx.post(
        server + "/v1/completions",
        headers=auth(),
        timeout=30,
        json={"model": MODEL_NAME, "prompt": "word " * (MAX_MODEL_LEN + 10), "max_tokens": 4},
    )
    assert long.status_code == 400 and "maximum context length" in long.json()["error"]["message"]
    bad = httpx.post(
        server + "/v1/chat/completions",
        headers=auth(),
        timeout=30,
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "top_p": 7},
    )
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_queue_full_is_503(server: str) -> None:
    async def burst() -> list[int]:
        async with httpx.AsyncClient(headers=auth(), timeout=300) as client:
            body = {"model": MODEL_NAME, "prompt": "Count: 1 2 3", "max_tokens": 24, "ignore_eos": True}
            replies = await asyncio.gather(
                *(client.post(server + "/v1/completions", json=body) for _ in range(6))
            )
        return [r.status_code for r in replies]

    codes = asyncio.run(burst())
    assert 503 in codes and 200 in codes, codes


def test_metrics_count_and_disconnect_aborts(server: str) -> None:
    before = metric_values(server)
    lab = f'model_name="{MODEL_NAME}"'
    with httpx.stream(
        "POST",
        server + "/v1/completions",
        headers=auth(),
        timeout=120,
        json={
            "model": MODEL_NAME,
            "prompt": "Tell me a long story",
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        },
    ) as r:
        for seen, _event in enumerate(EventSource(r).iter_sse(), 1):
            if seen >= 3:
                break
    deadline = time.monotonic() + 30
    while True:
        after = metric_values(server)
        idle = (
            after[f"vllm:num_requests_running{{{lab}}}"] == 0
            and after[f"vllm:kv_cache_usage_perc{{{lab}}}"] == 0
        )
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert idle, "the disconnected request was aborted and its KV blocks freed"
    aborted = f'vllm:request_success_total{{finished_reason="abort",{lab}}}'
    assert after[aborted] >= before.get(aborted, 0) + 1
    assert after[f"vllm:generation_tokens_total{{{lab}}}"] > before.get(
        f"vllm:generation_tokens_total{{{lab}}}", 0
    )
    assert after[f"vllm:time_to_first_token_seconds_count{{{lab}}}"] >= 1
    # a non-streaming client that gives up is aborted too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server + "/v1/completions",
            headers=auth(),
            timeout=2.0,
            json={
                "model": MODEL_NAME,
                "prompt": "Tell me a long story",
                "max_tokens": 400,
                "ignore_eos": True,
            },
        )
    deadline = time.monotonic() + 30
    while True:
        later = metric_values(server)
        freed = (
            later[f"vllm:num_requests_running{{{lab}}}"] == 0
            and later[f"vllm:kv_cache_usage_perc{{{lab}}}"] == 0
        )
        if (freed and later[aborted] >= after[aborted] + 1) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert later[aborted] >= after[aborted] + 1
    assert freed, "the abandoned non-streaming request was aborted and its KV blocks freed"
    for name in (
        "llmdeploy:weights_gib",
        "llmdeploy:available_kv_cache_gib",
        "llmdeploy:kv_cache_tokens",
        "llmdeploy:num_kv_blocks",
        "llmdeploy:max_concurrency",
    ):
        assert after[f"{name}{{{lab}}}"] > 0, name
