"""Grammar compilation must not take the server: tool-call and structured-output grammars against a
real engine server (issue 48, items 1 and 2).

- a forced tool call (`tool_choice: "required"` or a named function) whose parameters schema is a
  large nested object compiles in a grammar worker process: another client's /health keeps
  answering while it compiles;
- six large schemas whose clients hang up after 2 s: their worker processes are stopped, and an
  ordinary request and an ordinary constrained request right after are served at once;
- past the time bound (`--grammar-compile-timeout-s`) a constraint is a 400 and its worker stopped;
  past the size bound it is a 400 before anything compiles; a repeated schema is a cache hit.

Figures (worst /health latency, the ordinary requests' latency) are printed and recorded; the
assertions hold generous bounds only.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_server import GGUF, MODEL_NAME, EngineServer, start

from hardening.figures import record
from hardening.test_server_bad_input import assert_openai_error

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
pytest.importorskip("xgrammar")

COMPILE_TIMEOUT_S = 6
CHAT = "/v1/chat/completions"


def heavy_schema(seed: int, target_bytes: int = 25_000) -> dict[str, Any]:
    """A nested object schema of about `target_bytes` of JSON whose grammar takes seconds to compile:
    objects four levels deep, each with optional properties of several kinds (`seed` makes it unique,
    so no two requests share a cache entry)."""

    def leaf(i: int) -> dict[str, Any]:
        kinds: list[dict[str, Any]] = [
            {"type": "string", "maxLength": 20 + i % 7},
            {"type": "integer", "minimum": -(i % 50), "maximum": 1000 + i},
            {"type": "array", "items": {"type": "string", "pattern": f"^[a-z]{{1,{2 + i % 5}}}$"}},
            {"anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "null"}]},
        ]
        return kinds[i % len(kinds)]

    counter = iter(range(10**9))

    def level(depth: int) -> dict[str, Any]:
        props: dict[str, Any] = {}
        for _ in range(6):
            i = next(counter)
            props[f"p{seed}_{i}"] = level(depth - 1) if depth > 0 and i % 3 == 0 else leaf(i)
        return {"type": "object", "properties": props, "required": list(props)[:2]}

    schema = {"type": "object", "properties": {}, "required": []}
    while len(json.dumps(schema)) < target_bytes:
        i = next(counter)
        schema["properties"][f"top{seed}_{i}"] = level(4)
    return schema


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live (not zombie) processes whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out.append((int(entry.name), cmd))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _grammar_workers(server: EngineServer) -> list[int]:
    return [pid for pid, cmd in _children(server.proc.pid) if "grammar_worker" in cmd]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    from structured.tool_templates import HERMES_TEMPLATE, tokenizer_folder

    if not GGUF.is_file():
        pytest.skip(f"default model not installed at {GGUF}")
    folder = tokenizer_folder(GGUF, tmp_path_factory.mktemp("tokenizer"), HERMES_TEMPLATE)
    srv = start(
        tmp_path_factory.mktemp("grammars"),
        "--tokenizer", str(folder), "--max-model-len", "512", "--kv-cache-memory-bytes", "48M",
        "--max-num-seqs", "8", "--grammar-compile-timeout-s", str(COMPILE_TIMEOUT_S),
    )  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **fields}


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}


async def _probe_health(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, at_least: int = 1
) -> list[float]:
    latencies: list[float] = []
    while not stop.is_set() or len(latencies) < at_least:
        t0 = time.monotonic()
        r = await client.get(url + "/health")
        latencies.append(time.monotonic() - t0)
        assert r.status_code == 200
        await asyncio.sleep(0.01)
    return latencies


def _report(what: str, latencies: list[float]) -> float:
    worst_ms = max(latencies) * 1000
    print(
        f"\n{what}: /health from another client: {len(latencies)} probes, median "
        f"{statistics.median(latencies) * 1000:.1f} ms, worst {worst_ms:.1f} ms"
    )
    record(f"grammars: {what}, worst /health latency meanwhile (ms)", round(worst_ms))
    return worst_ms


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup"}}])
def test_a_large_tool_schema_does_not_stall_other_clients(server: EngineServer, choice: Any) -> None:
    seed = 1 if choice == "required" else 2
    tools = [
        {"type": "function", "function": {"name": "lookup", "parameters": heavy_schema(seed, 30_000)}},
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
    ]
    body = _chat(tools=tools, tool_choice=choice)

    async def scenario() -> tuple[httpx.Response, list[float], float]:
        async with httpx.AsyncClient(timeout=120) as client:
            idle = asyncio.Event()
            idle.set()
            _report(
                "nothing else running (for comparison)", await _probe_health(client, server.url, idle, 50)
            )
            stop = asyncio.Event()
            probe = asyncio.create_task(_probe_health(client, server.url, stop))
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            r = await client.post(server.url + CHAT, json=body)
            took_s = time.monotonic() - t0
            stop.set()
            return r, await probe, took_s

    r, latencies, took_s = asyncio.run(scenario())
    print(f"\n30 KB tool schema (tool_choice {json.dumps(choice)}): HTTP {r.status_code} in {took_s:.2f} s")
    worst_ms = _report(f"30 KB tool schema, tool_choice {'required' if seed == 1 else 'named'}", latencies)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:  # past the time bound, or the tools do not fit the context
        assert_openai_error(r)
        assert r.json()["error"]["param"] in ("tools", "messages"), r.text
    assert worst_ms < 1000, f"/health took {worst_ms:.0f} ms while a tool grammar compiled"


def test_clients_that_leave_stop_their_compiles(server: EngineServer) -> None:
    schemas = [heavy_schema(100 + i) for i in range(6)]

    async def leaving(client: httpx.AsyncClient, schema: dict[str, Any]) -> None:
        task = asyncio.create_task(
            client.post(server.url + CHAT, json=_chat(response_format=_json_schema(schema)))
        )
        await asyncio.sleep(2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def scenario() -> tuple[float, float, float, list[float], list[int], list[int]]:
        async with httpx.AsyncClient(timeout=120) as client:
            t0 = time.monotonic()
            assert (await client.post(server.url + CHAT, json=_chat())).status_code == 200
            baseline_s = time.monotonic() - t0
            stop = asyncio.Event()
            probe = asyncio.create_task(_probe_health(client, server.url, stop))
            leaving_all = asyncio.gather(*(leaving(client, s) for s in schemas))
            await asyncio.sleep(1.5)
            compiling = _grammar_workers(server)
            await leaving_all
            deadline = time.monotonic() + 10  # the server notices a hang-up within a moment
            while set(compiling) & set(_grammar_workers(server)) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            still = sorted(set(compiling) & set(_grammar_workers(server)))
            t0 = time.monotonic()
            plain = await client.post(server.url + CHAT, json=_chat())
            plain_s = time.monotonic() - t0
            assert plain.status_code == 200, plain.text
            small = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
            t0 = time.monotonic()
            constrained = await client.post(
                server.url + CHAT, json=_chat(response_format=_json_schema(small), max_tokens=64)
            )
            constrained_s = time.monotonic() - t0
            assert constrained.status_code == 200, constrained.text
            json.loads(constrained.json()["choices"][0]["message"]["content"])
            stop.set()
            return baseline_s, plain_s, constrained_s, await probe, compiling, still

    baseline_s, plain_s, constrained_s, latencies, compiling, still = asyncio.run(scenario())
    print(
        f"\nsix 25 KB schemas left after 2 s: then an ordinary request took {plain_s:.2f} s (before them: "
        f"{baseline_s:.2f} s), an ordinary json_schema request {constrained_s:.2f} s; grammar workers "
        f"compiling at 1.5 s: {len(compiling)}, still running after the hang-ups: {len(still)}"
    )
    record("grammars: ordinary request after six abandoned 25 KB schemas (ms)", round(plain_s * 1000))
    record("grammars: ordinary request before them (ms)", round(baseline_s * 1000))
    record(
        "grammars: json_schema request after six abandoned 25 KB schemas (ms)", round(constrained_s * 1000)
    )
    worst_ms = _report("six abandoned 25 KB schemas", latencies)
    assert compiling, "no grammar worker was compiling the abandoned schemas"
    assert not still, "grammar workers of clients that left kept running"
    assert plain_s < 60 and constrained_s < 60
    # looser than the 1 s elsewhere: starting and stopping a dozen worker processes from the server
    # (each a fork of the whole server) is seen in /health's worst case (~1 s on a loaded 2-core host)
    assert worst_ms < 3000


def test_past_the_bounds_is_400_and_a_repeat_is_cached(server: EngineServer) -> None:
    huge = heavy_schema(7, 70_000)
    r = httpx.post(server.url + CHAT, json=_chat(response_format=_json_schema(huge)), timeout=60)
    assert r.status_code == 400 and "at most" in r.json()["error"]["message"], r.text
    assert_openai_error(r)
    record("grammars: constraints past the size bound answered 400", 1)

    slow = heavy_schema(8, 50_000)
    t0 = time.monotonic()
    r = httpx.post(server.url + CHAT, json=_chat(guided_json=slow), timeout=120)
    took_s = time.monotonic() - t0
    print(f"\n50 KB schema with a {COMPILE_TIMEOUT_S} s bound: HTTP {r.status_code} in {took_s:.2f} s")
    if r.status_code == 400:
        assert "did not compile within" in r.json()["error"]["message"], r.text
        assert took_s < COMPILE_TIMEOUT_S + 10
        record("grammars: constraints past the time bound answered 400", 1)
    else:
        assert r.status_code == 200, r.text

    schema = heavy_schema(9, 8_000)
    times = []
    for _ in range(2):
        t0 = time.monotonic()
        r = httpx.post(server.url + CHAT, json=_chat(response_format=_json_schema(schema)), timeout=120)
        times.append(time.monotonic() - t0)
        assert r.status_code == 200, r.text
    print(f"\nthe same 8 KB schema twice: {times[0]:.2f} s, then {times[1]:.2f} s (a cache hit)")
    record("grammars: 8 KB schema, first request (ms)", round(times[0] * 1000))
    record("grammars: 8 KB schema, repeated (ms)", round(times[1] * 1000))
