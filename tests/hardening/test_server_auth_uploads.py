"""Unauthenticated uploads cost no memory (issue 48, item 4): with an API key set, 120 connections
stream chunked bodies without the key to the generation routes; each is refused (401) from its
headers, and the server's resident memory does not grow by their bodies.

The figure (RSS growth) is printed and recorded; the assertion allows far less than the bodies sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from engine_server import EngineServer

from hardening.figures import record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NUM_CONNECTIONS = 120
BODY_BYTES_EACH = 4 * 1024 * 1024  # 480 MiB in all, were it kept
CHUNK = b"x" * 65536
ROUTES = ("/v1/chat/completions", "/v1/completions", "/generate")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _upload(port: int, route: str) -> tuple[bytes, int]:
    """(the status line, body bytes sent before the server stopped reading or the body was done)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )
    sent = 0
    chunk = f"{len(CHUNK):x}\r\n".encode() + CHUNK + b"\r\n"
    status = b""
    try:
        while sent < BODY_BYTES_EACH:
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 2)  # a server that stops reading stalls us: stop
            sent += len(CHUNK)
        status = await asyncio.wait_for(reader.readline(), 10)
    except (ConnectionError, TimeoutError):
        with contextlib.suppress(ConnectionError, TimeoutError, asyncio.TimeoutError):
            status = await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return status, sent


def test_unauthenticated_chunked_uploads_cost_no_memory(engine_server: EngineServer) -> None:
    assert engine_server.api_key, "the hardening server runs with an API key"
    pid = engine_server.proc.pid
    before = rss_bytes(pid)

    async def scenario() -> tuple[list[tuple[bytes, int]], int]:
        peak = 0
        tasks = [
            asyncio.create_task(_upload(engine_server.port, ROUTES[i % len(ROUTES)]))
            for i in range(NUM_CONNECTIONS)
        ]
        while not all(t.done() for t in tasks):
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.05)
        return [t.result() for t in tasks], peak

    results, peak = asyncio.run(scenario())
    growth_mib = (peak - before) / 2**20
    sent_mib = sum(sent for _, sent in results) / 2**20
    statuses = sorted({status.decode().strip() for status, _ in results})
    print(
        f"\n{NUM_CONNECTIONS} unauthenticated chunked uploads: {sent_mib:.0f} MiB sent, answers {statuses}; "
        f"server RSS {before / 2**20:.0f} MiB before, peak {peak / 2**20:.0f} MiB (+{growth_mib:.1f} MiB)"
    )
    record("auth: unauthenticated chunked uploads, server RSS growth (MiB)", round(growth_mib))
    record("auth: unauthenticated chunked uploads sent (MiB)", round(sent_mib))
    assert all(status.startswith(b"HTTP/1.1 401") for status, _ in results), statuses
    assert growth_mib < 64, f"the server's memory grew by {growth_mib:.0f} MiB"
