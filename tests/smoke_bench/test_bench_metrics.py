"""Metric definitions (vLLM serving benchmark) on hand-made request results."""

from __future__ import annotations

import pytest

from llmdeploy.bench.metrics import compute_metrics, percentile
from llmdeploy.bench.request import RequestResult
from llmdeploy.bench.slo import check_slos
from llmdeploy.recipe.schema import SLOs


def test_percentile_interpolates_linearly_between_ranks() -> None:
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert percentile(values, 50) == 30.0
    assert percentile(values, 90) == pytest.approx(46.0)  # rank 3.6: 40 + 0.6 x 10
    assert percentile(values, 99) == pytest.approx(49.6)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0


def _ok(prompt: int, output: int, ttft_s: float, latency_s: float, itl: tuple[float, ...]) -> RequestResult:
    return RequestResult(
        ok=True,
        prompt_tokens=prompt,
        output_tokens=output,
        usage_reported=True,
        ttft_s=ttft_s,
        itl_s=itl,
        latency_s=latency_s,
    )


def test_metrics_follow_vllm_definitions() -> None:
    results = [
        _ok(10, 5, 0.1, 0.5, (0.1, 0.1, 0.1, 0.1)),  # TPOT (0.5 - 0.1) / 4 = 0.1
        _ok(20, 3, 0.2, 0.6, (0.2, 0.2)),  # TPOT (0.6 - 0.2) / 2 = 0.2
        _ok(30, 1, 0.3, 0.3, ()),  # one token: no TPOT
        RequestResult(ok=False, error="HTTP 500: boom", latency_s=0.01),
        RequestResult(ok=False, error="HTTP 500: boom", latency_s=0.01),
        RequestResult(ok=False, error="connection dropped (RemoteProtocolError)", latency_s=0.01),
    ]
    m = compute_metrics(results, duration_s=2.0)
    assert (m.num_requests, m.completed, m.failed) == (6, 3, 3)
    assert m.failure_reasons == (("HTTP 500: boom", 2), ("connection dropped (RemoteProtocolError)", 1))
    assert (m.total_input_tokens, m.total_output_tokens) == (60, 9)
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput_tok_s == pytest.approx(4.5)
    assert m.total_token_throughput_tok_s == pytest.approx(34.5)
    assert m.ttft.mean_ms == pytest.approx(200.0)
    assert m.ttft.p50_ms == pytest.approx(200.0)
    assert m.tpot.count == 2
    assert m.tpot.mean_ms == pytest.approx(150.0)
    assert m.itl.count == 6
    assert m.itl.mean_ms == pytest.approx((4 * 100 + 2 * 200) / 6)
    assert m.e2el.p99_ms == pytest.approx(598.0)  # 500 + 0.98 x 100
    assert m.failed_fraction == pytest.approx(0.5)


def test_slos_pass_fail_and_no_samples_is_a_miss() -> None:
    m = compute_metrics([_ok(10, 5, 0.1, 0.5, (0.1,) * 4)], duration_s=1.0)
    results = {r.name: r.ok for r in check_slos(m, SLOs(p99_ttft_ms=150, p99_tpot_ms=50, min_output_tok_s=4))}
    assert results == {
        "p99_ttft_ms": True,
        "p99_tpot_ms": False,
        "min_output_tok_s": True,
        "max_failed_fraction": True,
    }
    all_failed = compute_metrics([RequestResult(ok=False, error="x")], duration_s=1.0)
    verdicts = {r.name: r.ok for r in check_slos(all_failed, SLOs(p99_ttft_ms=1e9, max_failed_fraction=1.0))}
    assert verdicts == {"p99_ttft_ms": False, "max_failed_fraction": True}
