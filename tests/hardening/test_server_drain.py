"""Queue limits answer 503 with Retry-After; SIGTERM drains in-flight requests, refuses new ones, exits.

The rendered Kubernetes pods give the server more than its drain deadline before SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from engine_server import MODEL_NAME, EngineServer, start
from httpx_sse import EventSource
from llmdeploy_engine.cli import DRAIN_TIMEOUT_S

from hardening.figures import record
from hardening.test_server_bad_input import assert_openai_error

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
MAX_NUM_SEQS = 2
MAX_QUEUE_LEN = 2


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    server = start(
        tmp_path_factory.mktemp("drain"),
        "--max-model-len",
        "256",
        "--kv-cache-memory-bytes",
        "16M",
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-queue-len",
        str(MAX_QUEUE_LEN),
    )
    try:
        yield server
    finally:
        server.stop()


async def _stream(
    client: httpx.AsyncClient, url: str, max_tokens: int, started: asyncio.Event | None = None
) -> str:
    body = {
        "model": MODEL_NAME,
        "prompt": "Count: one two three",
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                if response.status_code in (429, 503):
                    assert response.headers.get("retry-after", "").isdigit()
                    assert_openai_error(httpx.Response(response.status_code, content=response.content))
                return f"HTTP {response.status_code}"
            done = finished = errored = False
            async for event in EventSource(response).aiter_sse():
                if started is not None:
                    started.set()
                if event.data == "[DONE]":
                    done = True
                else:
                    chunk = event.json()
                    errored = errored or "error" in chunk
                    finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", []))
            if errored:
                return "error event" if done else "cut off"
            return "completed" if done and finished else "cut off"
    except httpx.HTTPError as e:
        return type(e).__name__


def test_full_queue_is_503_with_retry_after(small_server: EngineServer) -> None:
    async def burst() -> Counter[str]:
        async with httpx.AsyncClient(timeout=300) as client:
            return Counter(await asyncio.gather(*(_stream(client, small_server.url, 24) for _ in range(12))))

    outcomes = burst_outcomes = asyncio.run(burst())
    print(
        f"\nburst of 12 against max_num_seqs={MAX_NUM_SEQS}, max_queue_len={MAX_QUEUE_LEN}: {dict(outcomes)}"
    )
    record("queue: requests sent past the queue limit", 12)
    record("queue: answered 503 with Retry-After", burst_outcomes["HTTP 503"] + burst_outcomes["HTTP 429"])
    assert outcomes["HTTP 503"] + outcomes["HTTP 429"] > 0
    assert outcomes["completed"] >= MAX_NUM_SEQS
    assert set(outcomes) <= {"completed", "HTTP 503", "HTTP 429"}, outcomes
    assert httpx.get(small_server.url + "/health", timeout=10).status_code == 200


def test_sigterm_drains_in_flight_then_exits(small_server: EngineServer) -> None:
    num_in_flight = MAX_NUM_SEQS + MAX_QUEUE_LEN

    async def scenario() -> tuple[list[str], str, float]:
        async with httpx.AsyncClient(timeout=300) as client:
            # fill the batch first, then the queue (a burst would see the queue full before any is scheduled)
            events = [asyncio.Event() for _ in range(num_in_flight)]
            tasks = [
                asyncio.create_task(_stream(client, small_server.url, 48, ev)) for ev in events[:MAX_NUM_SEQS]
            ]
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in events[:MAX_NUM_SEQS])), 120)
            tasks += [
                asyncio.create_task(_stream(client, small_server.url, 48, ev)) for ev in events[MAX_NUM_SEQS:]
            ]
            await asyncio.sleep(1.0)
            signalled = time.monotonic()
            small_server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            async with httpx.AsyncClient(timeout=10) as fresh:  # a new connection after the signal
                late = await _stream(fresh, small_server.url, 2)
            outcomes = await asyncio.gather(*tasks)
            await asyncio.to_thread(small_server.proc.wait, DRAIN_TIMEOUT_S + 30)
            return list(outcomes), late, time.monotonic() - signalled

    try:
        outcomes, late, exit_s = asyncio.run(scenario())
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit within {DRAIN_TIMEOUT_S + 30} s of SIGTERM")
    print(
        f"\nSIGTERM with {num_in_flight} in flight: {outcomes}; new request after it: {late}; exit after {exit_s:.1f} s"
    )
    record("SIGTERM: in-flight requests", num_in_flight)
    record("SIGTERM: in-flight requests completed", outcomes.count("completed"))
    record("SIGTERM: new requests accepted after the signal", int(late == "completed"))
    assert outcomes == ["completed"] * num_in_flight
    assert late in ("ConnectError", "HTTP 503"), late
    assert small_server.proc.returncode == 0, small_server.proc.returncode  # a clean drain exits 0
    assert exit_s < DRAIN_TIMEOUT_S + 5
    assert "Traceback" not in small_server.log()


async def _sse(client: httpx.AsyncClient, url: str, max_tokens: int, started: asyncio.Event) -> list[str]:
    """A streaming completion's `data:` payloads, or ["HTTP <status>", <body>] when refused."""
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True}
    async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            return [f"HTTP {response.status_code}", (await response.aread()).decode()]
        events = []
        async for event in EventSource(response).aiter_sse():
            started.set()
            events.append(event.data)
        return events


def test_sigterm_past_the_drain_ends_every_request_cleanly(tmp_path: Path) -> None:
    """Work that cannot finish in the drain: queued requests get 503 in OpenAI's shape, a running
    stream a final error event and [DONE]; the process still exits 0."""
    server = start(
        tmp_path, "--max-model-len", "4096", "--kv-cache-memory-bytes", "256M", "--max-num-seqs", "1"
    )

    async def scenario() -> tuple[list[str], httpx.Response, list[str], float]:
        async with httpx.AsyncClient(timeout=DRAIN_TIMEOUT_S + 60) as client:
            running_started, queued_started = asyncio.Event(), asyncio.Event()
            running = asyncio.create_task(_sse(client, server.url, 4000, running_started))
            await asyncio.wait_for(running_started.wait(), 120)
            body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 8}
            queued_plain = asyncio.create_task(client.post(server.url + "/v1/completions", json=body))
            queued_stream = asyncio.create_task(_sse(client, server.url, 8, queued_started))
            await asyncio.sleep(1.0)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(running, queued_plain, queued_stream)
            await asyncio.to_thread(server.proc.wait, DRAIN_TIMEOUT_S + 30)
            return results[0], results[1], results[2], time.monotonic() - signalled

    try:
        streamed, plain, queued, exit_s = asyncio.run(scenario())
    except subprocess.TimeoutExpired:
        server.stop()
        pytest.fail(f"the server did not exit within {DRAIN_TIMEOUT_S + 30} s of SIGTERM")
    print(
        f"\npast the drain: stream ended {streamed[-2:]}, queued: {plain.status_code}, {queued[:1]}; exit {exit_s:.1f} s"
    )
    assert streamed[-1] == "[DONE]", streamed[-3:]
    final = json.loads(streamed[-2])
    assert set(final) == {"error"} and final["error"]["code"] == "server_shutting_down", final
    assert len(streamed) > 3  # it was generating before the deadline
    assert plain.status_code == 503, plain.text
    assert_openai_error(plain)
    assert queued[0] == "HTTP 503", queued
    assert_openai_error(httpx.Response(503, content=queued[1].encode()))
    assert server.proc.returncode == 0, server.proc.returncode
    assert DRAIN_TIMEOUT_S <= exit_s < DRAIN_TIMEOUT_S + 10
    assert "Traceback" not in server.log(), server.log()[-3000:]
    record("SIGTERM past the drain: requests cut off, all answered 503 or an error event", 3)


def test_kubernetes_grace_period_covers_the_drain() -> None:
    from llmdeploy.recipe import load_recipe
    from llmdeploy.targets import render

    checked = 0
    recipes = [load_recipe(path, env={}) for path in sorted((REPO / "recipes").glob("*.yaml"))]
    # the built-in engine on Kubernetes: quickstart with its target switched
    recipes.append(load_recipe(REPO / "recipes" / "quickstart.yaml", ["target.type=kubernetes"], env={}))
    for recipe in recipes:
        if recipe.target.type != "kubernetes":
            continue
        path = Path(recipe.name)
        for doc in render(recipe, None).documents:
            template = doc.get("spec", {}).get("template", {}).get("spec")
            if doc["kind"] not in ("Deployment", "StatefulSet") or template is None:
                continue
            grace_s = template["terminationGracePeriodSeconds"]
            assert grace_s >= DRAIN_TIMEOUT_S + 5, f"{path.name}: {grace_s} s < drain {DRAIN_TIMEOUT_S} s + 5"
            container = template["containers"][0]
            ready = container["readinessProbe"]
            assert ready["periodSeconds"] * ready["failureThreshold"] <= grace_s
            checked += 1
    record("Kubernetes workloads checked for grace period >= drain", checked)
    assert checked > 0
