"""The request list of a benchmark: a generated workload or a JSONL file, and its summary.

The same seeded list is replayed at every sweep point, so points differ only in load. The summary
names the workload, its seed and a digest of the request list, so a rerun can show it sent the same
requests; the realised token counts (from the server's `usage`) are in every point's metrics.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from llmdeploy.bench.datasets import DatasetRow, read_dataset
from llmdeploy.bench.generators import (
    draw_length,
    multi_turn_requests,
    random_requests,
    shared_prefix_requests,
)
from llmdeploy.bench.options import BenchOptions
from llmdeploy.bench.request import RequestSpec, endpoint_path
from llmdeploy.bench.words import PromptCalibration, random_words

_PROBE_WORDS = (32, 160)


@dataclass(frozen=True)
class WorkloadSummary:
    name: str  # random, shared-prefix, multi-turn, dataset, sharegpt
    num_requests: int
    seed: int
    digest: str  # sha256 of the measured request list
    details: tuple[tuple[str, object], ...] = ()

    def describe(self) -> str:
        extra = "".join(f", {k} {v}" for k, v in self.details)
        return f"workload: {self.name}, {self.num_requests} requests, seed {self.seed}{extra}, requests sha256 {self.digest[:12]}"

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "num_requests": self.num_requests,
            "seed": self.seed,
            "requests_sha256": self.digest,
            **dict(self.details),
        }


@dataclass(frozen=True)
class Workload:
    warmup: tuple[RequestSpec, ...]
    measured: tuple[RequestSpec, ...]
    summary: WorkloadSummary


def request_digest(specs: tuple[RequestSpec, ...]) -> str:
    text = json.dumps([[s.prompt, s.output_len, s.session, s.turn] for s in specs])
    return hashlib.sha256(text.encode()).hexdigest()


def make_workload(options: BenchOptions, calibration: PromptCalibration | None) -> Workload:
    """Warm-up requests first, then the measured ones; a calibration is needed by generated prompts."""
    count = options.num_requests + options.warmup_requests
    details: tuple[tuple[str, object], ...] = ()
    if options.dataset is not None:
        rows = read_dataset(Path(options.dataset))
        name = "sharegpt" if any(r.reply is not None for r in rows) else "dataset"
        specs = dataset_requests(rows, options, calibration or PromptCalibration(), count, options.seed)
        details = (("file", options.dataset), ("num_rows", len(rows)))
    else:
        assert calibration is not None
        name = options.workload
        if options.workload == "shared-prefix":
            specs = shared_prefix_requests(options, calibration, count, options.seed)
            details = (
                ("num_prefixes", options.num_prefixes),
                ("suffixes_per_prefix", options.suffixes_per_prefix),
                ("prefix_len", options.prefix_len),
            )
        elif options.workload == "multi-turn":
            # sessions are measured whole: warm-up requests come from their own seed, without history
            measured = multi_turn_requests(options, calibration, options.num_requests, options.seed)
            warm = random_requests(options, calibration, options.warmup_requests, options.seed + 1)
            specs = warm + measured
            details = (("num_turns", options.num_turns),)
        else:
            specs = random_requests(options, calibration, count, options.seed)
        details = (("input_len", str(options.input_len)), ("output_len", str(options.output_len)), *details)
    warmup = tuple(replace(s, session=None, turn=0) for s in specs[: options.warmup_requests])
    measured = specs[options.warmup_requests :]
    summary = WorkloadSummary(name, len(measured), options.seed, request_digest(measured), details)
    return Workload(warmup, measured, summary)


def needs_calibration(options: BenchOptions) -> bool:
    """Generated prompts are sized with it; a ShareGPT file sizes output lengths from its replies."""
    if options.dataset is None:
        return True
    return not options.override_dataset_output_len and any(
        r.reply is not None for r in read_dataset(Path(options.dataset))
    )


def dataset_requests(
    rows: tuple[DatasetRow, ...], options: BenchOptions, calibration: PromptCalibration, count: int, seed: int
) -> tuple[RequestSpec, ...]:
    """The file's rows cycled to `count`; a row's own output length unless --output-len overrides it."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        row = rows[i % len(rows)]
        output_len = None if options.override_dataset_output_len else row.output_len
        if output_len is None and row.reply is not None and not options.override_dataset_output_len:
            output_len = max(1, round(len(row.reply.split()) * calibration.tokens_per_word))
        specs.append(RequestSpec(row.prompt, output_len or draw_length(options.output_len, rng)))
    return tuple(specs)


def calibrate(base_url: str, model: str, options: BenchOptions) -> PromptCalibration:
    """Fit prompt tokens per word from two tiny non-streamed requests; 1 token/word if the server says nothing."""
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    rng = random.Random(options.seed)
    points = []
    with httpx.Client(
        headers=headers, timeout=httpx.Timeout(options.request_timeout_s, connect=10.0)
    ) as client:
        for num_words in _PROBE_WORDS:
            text = random_words(num_words, rng)
            body: dict[str, object] = {"model": model, "max_tokens": 1, "temperature": 0.0}
            if options.endpoint == "chat":
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
            try:
                response = client.post(base_url + endpoint_path(options.endpoint), json=body)
                usage = response.json().get("usage") if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                usage = None
            tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if not isinstance(tokens, int):
                return PromptCalibration()
            points.append((num_words, tokens))
    return PromptCalibration.fit(points[0], points[1])
