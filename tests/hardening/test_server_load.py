"""Hundreds of concurrent streaming requests with random client disconnects, on loopback.

The server stays healthy, every request not aborted completes, and afterwards the running/waiting
counts and KV usage on /metrics return to 0 (no leaked blocks).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter

import httpx
import pytest
from engine_server import MODEL_NAME, EngineServer, metric, metric_values
from httpx_sse import EventSource

from hardening.figures import record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NUM_REQUESTS = 300
DISCONNECT_FRACTION = 0.25
SETTLE_TIMEOUT_S = 60


async def _one(client: httpx.AsyncClient, server: EngineServer, index: int, rng: random.Random) -> str:
    """Outcome of one streaming request: 'completed', 'aborted' (we hung up) or 'failed: ...'."""
    chat = index % 2 == 0
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, object] = {
        "model": MODEL_NAME,
        "max_tokens": rng.randint(1, 6),
        "stream": True,
        "temperature": rng.choice([0, 0.7, 1.0]),
    }
    words = " ".join(
        rng.choice(["apple", "river", "stone", "cloud", "seven"]) for _ in range(rng.randint(1, 30))
    )
    if chat:
        body["messages"] = [{"role": "user", "content": words}]
    else:
        body["prompt"] = words
    hang_up_after = rng.randint(0, 3) if rng.random() < DISCONNECT_FRACTION else None
    try:
        async with client.stream("POST", server.url + path, json=body, headers=server.headers()) as response:
            if response.status_code != 200:
                return f"failed: HTTP {response.status_code} {(await response.aread())[:200]!r}"
            if hang_up_after == 0:
                return "aborted"  # closing the stream before reading anything
            events, done, finished = 0, False, False
            async for event in EventSource(response).aiter_sse():
                data = event.data
                if data == "[DONE]":
                    done = True
                    break
                events += 1
                chunk = json.loads(data)
                finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", []))
                if hang_up_after is not None and events >= hang_up_after:
                    return "aborted"
            return "completed" if done and finished else f"failed: stream ended early (done={done})"
    except httpx.HTTPError as e:
        return f"failed: {type(e).__name__}"


async def _load(server: EngineServer) -> Counter[str]:
    rng = random.Random(7)
    limits = httpx.Limits(max_connections=NUM_REQUESTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300, connect=30)) as client:
        outcomes = await asyncio.gather(*(_one(client, server, i, rng) for i in range(NUM_REQUESTS)))
    return Counter(outcomes)


def _settled(url: str) -> dict[str, float]:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        values = metric_values(url)
        busy = (
            metric(values, "vllm:num_requests_running")
            + metric(values, "vllm:num_requests_waiting")
            + metric(values, "vllm:kv_cache_usage_perc")
        )
        if busy == 0 or time.monotonic() > deadline:
            return values
        time.sleep(0.5)


def test_streaming_load_with_disconnects_leaks_nothing(engine_server: EngineServer) -> None:
    start = time.monotonic()
    outcomes = asyncio.run(_load(engine_server))
    elapsed_s = time.monotonic() - start
    print(f"\n{NUM_REQUESTS} streaming requests in {elapsed_s:.1f} s: {dict(outcomes)}")
    record("load: streaming requests sent", NUM_REQUESTS)
    record("load: client disconnects injected", outcomes["aborted"])
    record("load: requests completed", outcomes["completed"])
    failed = {k: v for k, v in outcomes.items() if k.startswith("failed")}
    record("load: requests failed (not aborted)", sum(failed.values()))
    assert not failed, failed
    assert outcomes["completed"] + outcomes["aborted"] == NUM_REQUESTS
    assert outcomes["aborted"] > 0 and outcomes["completed"] > NUM_REQUESTS / 2

    values = _settled(engine_server.url)
    info = next(k for k in values if k.startswith("vllm:cache_config_info"))
    num_blocks = int(re.search(r'num_gpu_blocks="(\d+)"', info).group(1))  # type: ignore[union-attr]
    leaked_blocks = round(metric(values, "vllm:kv_cache_usage_perc") * num_blocks)
    record("load: KV blocks leaked after the load", leaked_blocks)
    assert metric(values, "vllm:num_requests_running") == 0
    assert metric(values, "vllm:num_requests_waiting") == 0
    assert leaked_blocks == 0
    assert httpx.get(engine_server.url + "/health", timeout=10).status_code == 200
    success = metric(values, "vllm:request_success_total")
    assert success >= outcomes["completed"], "every completed request is counted on /metrics"
