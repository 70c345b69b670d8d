"""The load generator: one concurrency level (optionally with Poisson arrivals) over a fixed request list."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from llmdeploy.bench.options import BenchOptions
from llmdeploy.bench.progress import ProgressBar
from llmdeploy.bench.request import RequestResult, RequestSpec, send_request


@dataclass(frozen=True)
class LevelRun:
    concurrency: int
    request_rate: float | None
    duration_s: float
    results: tuple[RequestResult, ...]


def make_client(options: BenchOptions, max_connections: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    return httpx.AsyncClient(
        headers=headers,
        timeout=httpx.Timeout(options.request_timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
    )


async def run_level(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    specs: Sequence[RequestSpec],
    concurrency: int,
    options: BenchOptions,
    progress: ProgressBar,
) -> LevelRun:
    """At most `concurrency` requests in flight; with a request rate, arrivals are a seeded Poisson process."""
    gate = asyncio.Semaphore(concurrency)
    arrivals = random.Random(options.seed)

    async def one(spec: RequestSpec) -> RequestResult:
        async with gate:
            result = await send_request(client, base_url, model, spec, options.endpoint, options.ignore_eos)
        progress.advance(failed=not result.ok)
        return result

    start = time.perf_counter()
    tasks: list[asyncio.Task[RequestResult]] = []
    for i, spec in enumerate(specs):
        if options.request_rate is not None and i > 0:
            await asyncio.sleep(arrivals.expovariate(options.request_rate))
        tasks.append(asyncio.create_task(one(spec)))
    results = await asyncio.gather(*tasks)
    duration_s = time.perf_counter() - start
    progress.close()
    return LevelRun(concurrency, options.request_rate, duration_s, tuple(results))


async def warm_up(
    client: httpx.AsyncClient, base_url: str, model: str, specs: Sequence[RequestSpec], options: BenchOptions
) -> tuple[RequestResult, ...]:
    """Sequential requests whose results are thrown away (first-request compile, caches, connections)."""
    return tuple(
        [
            await send_request(client, base_url, model, spec, options.endpoint, options.ignore_eos)
            for spec in specs
        ]
    )
