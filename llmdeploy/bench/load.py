"""The load generator: one sweep point (a concurrency cap, optionally Poisson arrivals) over a fixed request list.

A multi-turn session is one unit of work: it holds one concurrency slot while its turns go out one
after another, each resending the session's earlier user turns and the replies the server gave.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from llmdeploy.bench.options import BenchOptions
from llmdeploy.bench.progress import ProgressBar
from llmdeploy.bench.request import Message, RequestResult, RequestSpec, send_request


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


def work_units(specs: Sequence[RequestSpec]) -> list[list[RequestSpec]]:
    """Single requests stay alone; the turns of one session become one unit, in turn order."""
    units: list[list[RequestSpec]] = []
    sessions: dict[int, list[RequestSpec]] = {}
    for spec in specs:
        if spec.session is None:
            units.append([spec])
        elif spec.session in sessions:
            sessions[spec.session].append(spec)
        else:
            sessions[spec.session] = [spec]
            units.append(sessions[spec.session])
    return [sorted(unit, key=lambda s: s.turn) for unit in units]


async def run_level(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    specs: Sequence[RequestSpec],
    concurrency: int,
    request_rate: float | None,
    options: BenchOptions,
    progress: ProgressBar,
) -> LevelRun:
    """At most `concurrency` units in flight; with a request rate, arrivals are a seeded Poisson process."""
    gate = asyncio.Semaphore(concurrency)
    arrivals = random.Random(options.seed)

    async def one(unit: list[RequestSpec]) -> list[RequestResult]:
        results: list[RequestResult] = []
        history: tuple[Message, ...] = ()
        async with gate:
            for spec in unit:
                result = await send_request(
                    client, base_url, model, spec, options.endpoint, options.ignore_eos, history
                )
                progress.advance(failed=not result.ok)
                results.append(result)
                history = (*history, ("user", spec.prompt), ("assistant", result.generated_text))
        return results

    start = time.perf_counter()
    tasks: list[asyncio.Task[list[RequestResult]]] = []
    for i, unit in enumerate(work_units(specs)):
        if request_rate is not None and i > 0:
            await asyncio.sleep(arrivals.expovariate(request_rate))
        tasks.append(asyncio.create_task(one(unit)))
    results = [r for unit_results in await asyncio.gather(*tasks) for r in unit_results]
    duration_s = time.perf_counter() - start
    progress.close()
    return LevelRun(concurrency, request_rate, duration_s, tuple(results))


async def warm_up(
    client: httpx.AsyncClient, base_url: str, model: str, specs: Sequence[RequestSpec], options: BenchOptions
) -> tuple[RequestResult, ...]:
    """Unmeasured requests (first-request compile, caches, connections), at most the largest
    concurrency at a time as `vllm bench serve` sends its warm-ups, so they open the keep-alive
    connections the first point's requests then reuse instead of connecting inside their TTFT."""
    slots = asyncio.Semaphore(max(options.concurrency))

    async def one(spec: RequestSpec) -> RequestResult:
        async with slots:
            return await send_request(client, base_url, model, spec, options.endpoint, options.ignore_eos)

    return tuple(await asyncio.gather(*(one(spec) for spec in specs)))
