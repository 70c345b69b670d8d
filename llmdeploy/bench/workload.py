"""The request list of a benchmark: random-word prompts of chosen token lengths, or a JSONL dataset.

The same seeded list is replayed at every concurrency level, so levels differ only in load.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx

from llmdeploy.bench.options import BenchOptions, LengthSpec
from llmdeploy.bench.request import RequestSpec, endpoint_path
from llmdeploy.bench.words import PromptCalibration, random_words
from llmdeploy.errors import Problem, UserError

_PROBE_WORDS = (32, 160)


def _draw(length: LengthSpec, rng: random.Random) -> int:
    return length.min_tokens if length.fixed else rng.randint(length.min_tokens, length.max_tokens)


def synthetic_requests(
    options: BenchOptions, calibration: PromptCalibration, count: int, seed: int
) -> tuple[RequestSpec, ...]:
    rng = random.Random(seed)
    specs = []
    for _ in range(count):
        input_len = _draw(options.input_len, rng)
        output_len = _draw(options.output_len, rng)
        specs.append(RequestSpec(random_words(calibration.words_for(input_len), rng), output_len, input_len))
    return tuple(specs)


def dataset_requests(path: str, options: BenchOptions, count: int, seed: int) -> tuple[RequestSpec, ...]:
    """JSONL, one object a line: {"prompt": str, "output_len": int (optional)}; cycled to `count`."""
    rows = _read_dataset(Path(path))
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        prompt, output_len = rows[i % len(rows)]
        specs.append(RequestSpec(prompt, output_len or _draw(options.output_len, rng)))
    return tuple(specs)


def _read_dataset(path: Path) -> list[tuple[str, int | None]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UserError.one(
            f"cannot read the dataset: {e.strerror}", file=str(path), fix="give a JSONL file"
        ) from e
    rows: list[tuple[str, int | None]] = []
    problems: list[Problem] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(Problem(f"not JSON: {e.msg}", file=str(path), line=number))
            continue
        prompt = row.get("prompt") if isinstance(row, dict) else None
        output_len = row.get("output_len") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt:
            problems.append(
                Problem('each line needs a non-empty "prompt" string', file=str(path), line=number)
            )
        elif output_len is not None and (not isinstance(output_len, int) or output_len < 1):
            problems.append(Problem('"output_len" must be a positive integer', file=str(path), line=number))
        else:
            rows.append((prompt, output_len))
    if problems:
        raise UserError(problems)
    if not rows:
        raise UserError.one(
            "the dataset has no prompts", file=str(path), fix='one {"prompt": "..."} per line'
        )
    return rows


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
