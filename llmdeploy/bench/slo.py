"""Service-level objectives (recipe `bench.slo` or flags) checked against one run's metrics."""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy.bench.metrics import BenchMetrics
from llmdeploy.recipe.schema import SLOs


@dataclass(frozen=True)
class SLOResult:
    name: str  # the SLO field name, e.g. "p99_ttft_ms"
    limit: float
    actual: float
    ok: bool

    def describe(self) -> str:
        relation = ">=" if self.name.startswith("min_") else "<="
        verdict = "pass" if self.ok else "FAIL"
        return f"{verdict} {self.name}: {self.actual:.4g} (want {relation} {self.limit:g})"


def check_slos(metrics: BenchMetrics, slo: SLOs) -> tuple[SLOResult, ...]:
    """Only the SLOs that are set; `max_failed_fraction` (default 0) is always checked."""
    results: list[SLOResult] = []
    latency = {
        "p99_ttft_ms": (slo.p99_ttft_ms, metrics.ttft),
        "p99_tpot_ms": (slo.p99_tpot_ms, metrics.tpot),
        "p99_itl_ms": (slo.p99_itl_ms, metrics.itl),
        "p99_e2el_ms": (slo.p99_e2el_ms, metrics.e2el),
    }
    for name, (limit, dist) in latency.items():
        if limit is not None:
            # no samples (every request failed) is a miss, not a vacuous pass
            results.append(SLOResult(name, limit, dist.p99_ms, dist.count > 0 and dist.p99_ms <= limit))
    failed = metrics.failed_fraction
    results.append(
        SLOResult("max_failed_fraction", slo.max_failed_fraction, failed, failed <= slo.max_failed_fraction)
    )
    if slo.min_output_tok_s is not None:
        actual = metrics.output_throughput_tok_s
        results.append(
            SLOResult("min_output_tok_s", slo.min_output_tok_s, actual, actual >= slo.min_output_tok_s)
        )
    return tuple(results)
