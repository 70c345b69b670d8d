"""Grammar compilation must not take the server: tool-call and structured-output grammars against a
real engine server (issue 48, items 1 and 2).

- a forced tool call (`tool_choice: "required"` or a named function) whose parameters schema is a
  large nested object compiles in a grammar worker process: another client's /health keeps
  answering while it compiles (/health is probed from a process of its own, health_probe.py);
- tools whose prompt cannot fit max_model_len are a 400 before their grammar compiles;
- six large schemas whose clients hang up after 2 s: their compiles are stopped, and an
  ordinary request and an ordinary constrained request right after are served at once;
- past the time bound (`--grammar-compile-timeout-s`) a constraint is a 400 and its worker stopped;
  past the size bound it is a 400 before anything compiles; a repeated schema is a cache hit.

Figures (worst /health latency, the ordinary requests' latency) are printed and recorded; the
assertions hold generous bounds only.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_server import GGUF, MODEL_NAME, EngineServer, start

from hardening.figures import record
from hardening.health_probe import HealthProbe, idle_probe
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


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0  # gone
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _compiling_workers(server: EngineServer, pids: list[int] | None = None) -> list[int]:
    """Grammar workers (of `pids`, default all) that used CPU in the last half second: workers start
    with the server and wait, idle, between jobs, so a live worker is not necessarily compiling."""
    pids = _grammar_workers(server) if pids is None else pids
    before = {pid: _cpu_s(pid) for pid in pids}
    time.sleep(0.5)
    live = set(_grammar_workers(server))
    return sorted(pid for pid in pids if pid in live and _cpu_s(pid) - before[pid] > 0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    from structured.tool_templates import HERMES_TEMPLATE, tokenizer_folder

    if not GGUF.is_file():
        pytest.skip(f"default model not installed at {GGUF}")
    # the prompt names the tools without their schemas: the grammar compiles from the whole schema,
    # while a prompt of the whole schema would take minutes to prefill on the CPU
    template = HERMES_TEMPLATE.replace("{{ tool | tojson }}", "{{ tool.function.name }}")
    assert template != HERMES_TEMPLATE
    folder = tokenizer_folder(GGUF, tmp_path_factory.mktemp("tokenizer"), template)
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


def _report(what: str, probe: HealthProbe) -> float:
    print(f"\n{what}: /health from another client: {probe.summary()}")
    record(f"grammars: {what}, worst /health latency meanwhile (ms)", round(probe.worst_ms))
    return probe.worst_ms


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup"}}])
def test_a_large_tool_schema_does_not_stall_other_clients(server: EngineServer, choice: Any) -> None:
    seed = 1 if choice == "required" else 2
    tools = [
        {"type": "function", "function": {"name": "lookup", "parameters": heavy_schema(seed, 30_000)}},
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
    ]
    body = _chat(tools=tools, tool_choice=choice)

    _report("nothing else running (for comparison)", idle_probe(server.url))
    with HealthProbe(server.url) as probe:
        t0 = time.monotonic()
        r = httpx.post(server.url + CHAT, json=body, timeout=120)
        took_s = time.monotonic() - t0
    size_kb = len(json.dumps(tools)) // 1000
    print(
        f"\n{size_kb} KB tool schema (tool_choice {json.dumps(choice)}): HTTP {r.status_code} in {took_s:.2f} s"
    )
    worst_ms = _report(f"{size_kb} KB tool schema, tool_choice {'required' if seed == 1 else 'named'}", probe)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:  # past the time bound (the tools fit the context: they compiled)
        assert_openai_error(r)
        assert r.json()["error"]["param"] == "tools", r.text
    assert worst_ms < 1000, f"/health took {worst_ms:.0f} ms while a tool grammar compiled"


def test_tools_past_the_context_are_refused_before_compiling(server: EngineServer) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": heavy_schema(3, 30_000)}}]
    body = _chat(tools=tools, tool_choice="required")
    body["messages"][0]["content"] = "word " * 1_000  # past --max-model-len 512
    t0 = time.monotonic()
    r = httpx.post(server.url + CHAT, json=body, timeout=120)
    took_s = time.monotonic() - t0
    assert_openai_error(r)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    print(f"\n40 KB tool schema, prompt past max_model_len: HTTP 400 in {took_s:.2f} s (nothing compiled)")
    record(
        "grammars: 40 KB tool schema with a prompt past max_model_len, 400 after (ms)", round(took_s * 1000)
    )


def test_clients_that_leave_stop_their_compiles(server: EngineServer) -> None:
    schemas = [heavy_schema(100 + i) for i in range(6)]

    async def leaving(client: httpx.AsyncClient, schema: dict[str, Any]) -> None:
        task = asyncio.create_task(
            client.post(server.url + CHAT, json=_chat(response_format=_json_schema(schema)))
        )
        await asyncio.sleep(2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def scenario() -> tuple[float, float, float, list[int], list[int]]:
        async with httpx.AsyncClient(timeout=120) as client:
            t0 = time.monotonic()
            assert (await client.post(server.url + CHAT, json=_chat())).status_code == 200
            baseline_s = time.monotonic() - t0
            leaving_all = asyncio.gather(*(leaving(client, s) for s in schemas))
            await asyncio.sleep(1.0)
            compiling = await asyncio.to_thread(_compiling_workers, server)
            await leaving_all
            deadline = time.monotonic() + 10  # the server notices a hang-up within a moment
            still = compiling
            while still and time.monotonic() < deadline:
                still = await asyncio.to_thread(_compiling_workers, server, still)
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
            return baseline_s, plain_s, constrained_s, compiling, still

    _report("nothing else running (for comparison)", idle_probe(server.url, 2000))
    with HealthProbe(server.url) as probe:
        baseline_s, plain_s, constrained_s, compiling, still = asyncio.run(scenario())
    print(
        f"\nsix 25 KB schemas left after 2 s: then an ordinary request took {plain_s:.2f} s (before them: "
        f"{baseline_s:.2f} s), an ordinary json_schema request {constrained_s:.2f} s; grammar workers "
        f"compiling at 1-1.5 s: {len(compiling)}, still compiling after the hang-ups: {len(still)}"
    )
    record("grammars: ordinary request after six abandoned 25 KB schemas (ms)", round(plain_s * 1000))
    record("grammars: ordinary request before them (ms)", round(baseline_s * 1000))
    record(
        "grammars: json_schema request after six abandoned 25 KB schemas (ms)", round(constrained_s * 1000)
    )
    worst_ms = _report("six abandoned 25 KB schemas", probe)
    assert compiling, "no grammar worker was compiling the abandoned schemas"
    assert not still, "grammar workers of clients that left kept running"
    assert plain_s < 60 and constrained_s < 60
    assert worst_ms < 1000, f"/health took {worst_ms:.0f} ms while abandoned grammars compiled"


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
