"""Another client's /health next to hostile bodies (issue 48): deeply nested JSON, slow uploads with
the key, unauthenticated uploads. /health is probed from a process of its own (health_probe.py); the
same probe with nothing else running is printed next to each figure. (Large bodies:
test_server_overload.py; grammars and tools: test_server_grammars.py.)

Figures are printed and recorded; the assertions hold generous bounds only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
from engine_server import MODEL_NAME, EngineServer

from hardening.figures import record
from hardening.health_probe import HealthProbe, idle_probe
from hardening.test_server_auth_uploads import ROUTES, _upload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUN_S = 6.0


def _report(what: str, server: EngineServer, probe: HealthProbe) -> float:
    idle = idle_probe(server.url, len(probe.latencies_s))
    print(
        f"\n{what}: /health from another client: {probe.summary()}\n  nothing else running: {idle.summary()}"
    )
    record(f"health next to {what}: worst (ms)", round(probe.worst_ms))
    record(f"health next to {what}: worst with nothing else running (ms)", round(idle.worst_ms))
    return probe.worst_ms


def _body(route: str, tail: str = "") -> bytes:
    base: dict[str, object]
    if route == "/generate":
        base = {"inputs": "hi", "parameters": {"max_new_tokens": 1}}
    elif route == "/v1/completions":
        base = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1}
    else:
        base = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return (json.dumps(base)[:-1] + tail + "}").encode()


async def _request(port: int, head: bytes, chunks: list[bytes], pause_s: float) -> bytes:
    """Send `head`, then each chunk after `pause_s`; the status line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for chunk in chunks:
            await asyncio.sleep(pause_s)
            writer.write(chunk)
            await writer.drain()
        return await asyncio.wait_for(reader.readline(), 60)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _head(server: EngineServer, route: str, length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {server.api_key}\r\n{framing}\r\n\r\n"
    ).encode()


def test_deep_bodies(engine_server: EngineServer) -> None:
    server = engine_server
    bodies = [
        (route, _body(route, ', "extra": ' + "[" * depth + "]" * depth))
        for route in ROUTES
        for depth in (65, 990, 20_000)
    ]

    async def client(i: int, statuses: list[bytes]) -> None:
        end = time.monotonic() + RUN_S
        while time.monotonic() < end:
            route, body = bodies[i % len(bodies)]
            statuses.append(await _request(server.port, _head(server, route, len(body)) + body, [], 0))
            i += 1

    statuses: list[bytes] = []
    with HealthProbe(server.url) as probe:
        asyncio.run(_gather(*(client(i, statuses) for i in range(8))))
    print(f"\n{len(statuses)} deeply nested bodies (65, 990, 20,000 levels), answers {sorted(set(statuses))}")
    worst_ms = _report("deeply nested bodies", server, probe)
    assert statuses and all(s.startswith(b"HTTP/1.1 400") for s in statuses), sorted(set(statuses))
    assert worst_ms < 1000


def test_slow_uploads(engine_server: EngineServer) -> None:
    """40 clients with the key each trickle a body in 64-byte chunks, one every 100 ms."""
    server = engine_server

    async def client(i: int) -> bytes:
        route = ROUTES[i % len(ROUTES)]
        body = _body(route, " " * 4096)  # whitespace is valid JSON: the body is a real request
        pieces = [body[k : k + 64] for k in range(0, len(body), 64)]
        chunks = [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces] + [b"0\r\n\r\n"]
        return await _request(server.port, _head(server, route, None), chunks, RUN_S / len(chunks))

    with HealthProbe(server.url) as probe:
        statuses = asyncio.run(_gather(*(client(i) for i in range(40))))
    print(f"\n40 slow uploads with the key, answers {sorted(set(statuses))}")
    worst_ms = _report("slow uploads", server, probe)
    assert all(s.startswith(b"HTTP/1.1 200") for s in statuses), sorted(set(statuses))
    assert worst_ms < 1000


def test_unauthenticated_uploads(engine_server: EngineServer) -> None:
    server = engine_server
    with HealthProbe(server.url) as probe:
        results = asyncio.run(_gather(*(_upload(server.port, ROUTES[i % len(ROUTES)]) for i in range(120))))
    statuses = sorted({status for status, _ in results})
    print(f"\n120 unauthenticated chunked uploads, answers {statuses}")
    worst_ms = _report("unauthenticated uploads", server, probe)
    assert all(s.startswith(b"HTTP/1.1 401") for s in statuses), statuses
    assert worst_ms < 1000


async def _gather(*coroutines: object) -> list[bytes]:
    return list(await asyncio.gather(*coroutines))  # type: ignore[call-overload]
