"""Benchmark metrics, defined as vLLM's serving benchmark defines them.

- request throughput: completed requests / benchmark duration
- output throughput: sum of output tokens / duration; total: (input + output tokens) / duration
- TTFT: time to the first token; TPOT: (E2E latency - TTFT) / (output tokens - 1), requests with more
  than one output token only; ITL: every gap between successive streamed chunks; E2EL: request latency
- percentiles interpolate linearly between closest ranks (numpy's default); times in milliseconds.
- tok/s per user (MLPerf Endpoints' interactivity axis): 1000 / TPOT p90 in ms.
Failed requests count towards nothing but `failed` and `failure_reasons`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from llmdeploy.bench.request import RequestResult

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    """Summary of one latency metric, in milliseconds."""

    mean_ms: float
    std_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    count: int

    @classmethod
    def of_seconds(cls, values_s: Sequence[float]) -> Distribution:
        ms = [v * 1000 for v in values_s]
        if not ms:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0)
        mean = sum(ms) / len(ms)
        std = math.sqrt(sum((v - mean) ** 2 for v in ms) / len(ms))
        return cls(mean, std, percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), len(ms))

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class BenchMetrics:
    num_requests: int
    completed: int
    failed: int
    failure_reasons: tuple[tuple[str, int], ...]  # (reason, count), most frequent first
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    usage_reported: bool  # False: some output counts came from counting chunks
    request_throughput: float  # requests/s
    output_throughput_tok_s: float
    total_token_throughput_tok_s: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution

    @property
    def failed_fraction(self) -> float:
        return self.failed / self.num_requests if self.num_requests else 0.0

    @property
    def tok_s_per_user(self) -> float:
        """1000 / TPOT p90 (ms): the decode speed nine in ten users see at least; 0 without TPOT samples."""
        return 1000.0 / self.tpot.p90_ms if self.tpot.count and self.tpot.p90_ms > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "num_requests": self.num_requests,
            "completed": self.completed,
            "failed": self.failed,
            "failure_reasons": dict(self.failure_reasons),
            "duration_s": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "usage_reported": self.usage_reported,
            "request_throughput": self.request_throughput,
            "output_throughput_tok_s": self.output_throughput_tok_s,
            "total_token_throughput_tok_s": self.total_token_throughput_tok_s,
            "tok_s_per_user": self.tok_s_per_user,
            "mean_input_tokens": self.total_input_tokens / self.completed if self.completed else 0.0,
            "mean_output_tokens": self.total_output_tokens / self.completed if self.completed else 0.0,
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            out[name] = getattr(self, name).to_json()
        return out


def compute_metrics(results: Sequence[RequestResult], duration_s: float) -> BenchMetrics:
    ok = [r for r in results if r.ok]
    reasons = Counter(r.error or "unknown" for r in results if not r.ok)
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [gap for r in ok for gap in r.itl_s]
    safe_duration = duration_s if duration_s > 0 else float("inf")
    return BenchMetrics(
        num_requests=len(results),
        completed=len(ok),
        failed=len(results) - len(ok),
        failure_reasons=tuple(reasons.most_common()),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        usage_reported=all(r.usage_reported for r in ok),
        request_throughput=len(ok) / safe_duration,
        output_throughput_tok_s=total_out / safe_duration,
        total_token_throughput_tok_s=(total_in + total_out) / safe_duration,
        ttft=Distribution.of_seconds([r.ttft_s for r in ok]),
        tpot=Distribution.of_seconds(tpots),
        itl=Distribution.of_seconds(itls),
        e2el=Distribution.of_seconds([r.latency_s for r in ok]),
    )
