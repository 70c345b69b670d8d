"""Planner vs public vLLM start-up logs (fixtures/vllm_logs.json, each with its source URL)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from llmdeploy.planner.accuracy import DEFAULT_FIXTURES, check_all, report

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_logs.json"


def test_fixtures_cite_their_source() -> None:
    assert FIXTURES.resolve() == DEFAULT_FIXTURES.resolve()
    for entry in json.loads(FIXTURES.read_text())["logs"]:
        assert entry["source"].startswith("https://")


def test_bytes_per_token_part_matches_logged_kv_tokens() -> None:
    # the log's own KV memory divided by our bytes/token must give the log's token count
    errors = [abs(c.bpt_error) for c in check_all() if c.bpt_error is not None and not c.hybrid]
    assert len(errors) >= 4
    assert statistics.median(errors) <= 0.02
    assert max(errors) <= 0.10


def test_full_prediction_error_is_reported_and_bounded() -> None:
    checks = [c for c in check_all() if c.full_error is not None and not c.hybrid]
    assert len(checks) >= 4
    assert max(abs(c.full_error) for c in checks) <= 0.10  # type: ignore[arg-type]
    for c in checks:
        if c.weights_error_gib is not None:
            assert abs(c.weights_error_gib) < 0.1, c.log_id
    assert "median |error|" in report(check_all())
