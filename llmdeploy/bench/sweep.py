"""`bench()`: warm up, then one run per concurrency level over the same request list, then SLO verdicts."""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from llmdeploy.bench.load import make_client, run_level, warm_up
from llmdeploy.bench.metrics import compute_metrics
from llmdeploy.bench.options import BenchOptions
from llmdeploy.bench.progress import ProgressBar
from llmdeploy.bench.report import BenchReport, LevelReport
from llmdeploy.bench.request import RequestSpec
from llmdeploy.bench.slo import check_slos
from llmdeploy.bench.words import PromptCalibration
from llmdeploy.bench.workload import calibrate, dataset_requests, synthetic_requests


def bench(
    url: str, model: str, options: BenchOptions, progress: bool = True, progress_stream: TextIO | None = None
) -> BenchReport:
    """Run the sweep against an OpenAI-compatible endpoint and return the report (never raises for server faults)."""
    base_url = url.rstrip("/")
    notes: list[str] = []
    calibration: PromptCalibration | None = None
    count = options.num_requests + options.warmup_requests
    if options.dataset is not None:
        specs = dataset_requests(options.dataset, options, count, options.seed)
    else:
        calibration = calibrate(base_url, model, options)
        if not calibration.measured:
            notes.append("prompt length calibration got no usage from the server; assumed 1 token per word")
        specs = synthetic_requests(options, calibration, count, options.seed)
    warmup, measured = specs[: options.warmup_requests], specs[options.warmup_requests :]
    levels, warm_failed = asyncio.run(
        _sweep(base_url, model, options, warmup, measured, progress, progress_stream or sys.stderr)
    )
    if warm_failed:
        notes.append(f"{warm_failed} of {len(warmup)} warm-up requests failed")
    return BenchReport(base_url, model, options, calibration, levels, tuple(notes))


async def _sweep(
    base_url: str,
    model: str,
    options: BenchOptions,
    warmup: tuple[RequestSpec, ...],
    measured: tuple[RequestSpec, ...],
    progress: bool,
    stream: TextIO,
) -> tuple[tuple[LevelReport, ...], int]:
    levels = []
    async with make_client(options, max(options.concurrency)) as client:
        warm_results = await warm_up(client, base_url, model, warmup, options)
        for concurrency in options.concurrency:
            label = f"c={concurrency}" + (f" @{options.request_rate:g} req/s" if options.request_rate else "")
            bar = ProgressBar(len(measured), label, stream, enabled=progress)
            run = await run_level(client, base_url, model, measured, concurrency, options, bar)
            metrics = compute_metrics(run.results, run.duration_s)
            levels.append(
                LevelReport(concurrency, options.request_rate, metrics, check_slos(metrics, options.slo))
            )
    return tuple(levels), sum(1 for r in warm_results if not r.ok)
