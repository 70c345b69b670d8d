"""`bench()`: warm up, then one run per sweep point over the same request list, then SLO verdicts."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TextIO

from llmdeploy.bench.load import make_client, run_level, warm_up
from llmdeploy.bench.metrics import compute_metrics
from llmdeploy.bench.options import BenchOptions
from llmdeploy.bench.progress import ProgressBar
from llmdeploy.bench.report import BenchReport, LevelReport
from llmdeploy.bench.slo import check_slos
from llmdeploy.bench.words import PromptCalibration
from llmdeploy.bench.workload import Workload, calibrate, make_workload, needs_calibration

OnPoint = Callable[[LevelReport], None]


def bench(
    url: str,
    model: str,
    options: BenchOptions,
    progress: bool = True,
    progress_stream: TextIO | None = None,
    on_point: OnPoint | None = None,
    num_gpus: int | None = None,
) -> BenchReport:
    """Run the sweep against an OpenAI-compatible endpoint and return the report (never raises for
    server faults). `on_point` sees each point as it finishes; `num_gpus` gives per-GPU throughput."""
    base_url = url.rstrip("/")
    notes: list[str] = []
    calibration: PromptCalibration | None = None
    if needs_calibration(options):
        calibration = calibrate(base_url, model, options)
        if not calibration.measured:
            notes.append("prompt length calibration got no usage from the server; assumed 1 token per word")
    workload = make_workload(options, calibration)
    levels, warm_failed = asyncio.run(
        _sweep(base_url, model, options, workload, progress, progress_stream or sys.stderr, on_point)
    )
    if warm_failed:
        notes.append(f"{warm_failed} of {len(workload.warmup)} warm-up requests failed")
    return BenchReport(
        base_url, model, options, calibration, levels, tuple(notes), workload.summary, num_gpus
    )


async def _sweep(
    base_url: str,
    model: str,
    options: BenchOptions,
    workload: Workload,
    progress: bool,
    stream: TextIO,
    on_point: OnPoint | None,
) -> tuple[tuple[LevelReport, ...], int]:
    levels = []
    async with make_client(options, max(options.concurrency)) as client:
        warm_results = await warm_up(client, base_url, model, workload.warmup, options)
        for concurrency, rate in options.points:
            label = f"c={concurrency}" + (f" @{rate:g} req/s" if rate else "")
            bar = ProgressBar(len(workload.measured), label, stream, enabled=progress)
            run = await run_level(client, base_url, model, workload.measured, concurrency, rate, options, bar)
            metrics = compute_metrics(run.results, run.duration_s)
            level = LevelReport(concurrency, rate, metrics, check_slos(metrics, options.slo))
            levels.append(level)
            if on_point is not None:
                on_point(level)
    return tuple(levels), sum(1 for r in warm_results if not r.ok)
