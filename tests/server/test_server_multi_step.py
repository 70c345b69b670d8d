"""The real server process on the default model (CPU) with multi-step decoding (`--num-scheduler-steps
4`), with asynchronous scheduling (the default) and without, and with one-step asynchronous windows
(`--async-scheduling` at one step, the GPU's default): greedy streamed and plain answers agree and are
the same in every mode, concurrent streams finish with every token, and a client that goes away
mid-stream, with its window in flight, is aborted and its KV blocks freed while the others go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from engine_server import MODEL_NAME, metric_values, start
from httpx_sse import EventSource

pytestmark = pytest.mark.slow

PROMPT = "The three most useful kitchen tools are"
GREEDY_TEXT: dict[str, str] = {}  # mode -> the greedy completion of PROMPT


# mode -> (scheduler steps, flag, the start-up log line that names the mode)
MODES = {
    "async-scheduling": (
        "4",
        "--async-scheduling",
        "up to 4 decode steps a window, asynchronous scheduling on",
    ),
    "no-async-scheduling": (
        "4",
        "--no-async-scheduling",
        "up to 4 decode steps a window, asynchronous scheduling off",
    ),
    "one-step-async": (
        "1",
        "--async-scheduling",
        "Asynchronous scheduling: on (decode steps launched one ahead",
    ),
}


@pytest.fixture(scope="module", params=list(MODES))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    steps, flag, log_line = MODES[request.param]
    flags = ["--max-model-len", "512", "--kv-cache-memory-bytes", "64M", "--max-num-seqs", "4"]
    engine = start(tmp_path_factory.mktemp("server"), *flags, "--num-scheduler-steps", steps, flag)
    try:
        yield engine.url
    finally:
        engine.stop()
    assert log_line in engine.log()


def completion(max_tokens: int, prompt: str = PROMPT, **kw: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **kw,
    }


def running_and_kv(url: str) -> tuple[float, float]:
    values = metric_values(url)
    lab = f'model_name="{MODEL_NAME}"'
    return values[f"vllm:num_requests_running{{{lab}}}"], values[f"vllm:kv_cache_usage_perc{{{lab}}}"]


def wait_idle(url: str) -> None:
    deadline = time.monotonic() + 60
    while running_and_kv(url) != (0.0, 0.0):
        assert time.monotonic() < deadline, "requests still running or KV blocks held 60 s after"
        time.sleep(0.2)


def test_greedy_stream_and_plain_agree_in_both_modes(server: str, request: pytest.FixtureRequest) -> None:
    # 37 tokens: the prefill's token, then windows of 4 and a shorter last one
    plain = httpx.post(server + "/v1/completions", json=completion(37), timeout=120).json()
    assert plain["usage"]["completion_tokens"] == 37 and plain["choices"][0]["finish_reason"] == "length"
    text = plain["choices"][0]["text"]
    pieces = []
    with httpx.stream("POST", server + "/v1/completions", json=completion(37, stream=True), timeout=120) as r:
        for event in EventSource(r).iter_sse():
            if event.data != "[DONE]":
                pieces += [c["text"] for c in event.json()["choices"]]
    assert "".join(pieces) == text
    mode = request.node.callspec.params["server"]
    GREEDY_TEXT[mode] = text
    assert len(set(GREEDY_TEXT.values())) == 1, f"the modes disagree: {GREEDY_TEXT}"


def test_concurrent_streams_and_a_disconnect_mid_window(server: str) -> None:
    async def stream(client: httpx.AsyncClient, prompt: str, max_tokens: int, leave_after: int = 0) -> int:
        tokens = 0
        body = completion(max_tokens, prompt, stream=True, stream_options={"include_usage": True})
        async with client.stream("POST", server + "/v1/completions", json=body) as r:
            async for event in EventSource(r).aiter_sse():
                if event.data == "[DONE]":
                    continue
                chunk = event.json()
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if leave_after and chunk["choices"]:
                    leave_after -= 1
                    if not leave_after:
                        return -1  # the client goes away mid-stream
        return tokens

    async def main() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(
                stream(client, "Once upon a time", 61),
                stream(client, "def fibonacci(n):", 45),
                stream(client, "Tell me a long story", 400, leave_after=3),
            )

    assert asyncio.run(main()) == [61, 45, -1]
    wait_idle(server)
    after = httpx.post(server + "/v1/completions", json=completion(9), timeout=120).json()
    assert after["usage"]["completion_tokens"] == 9
