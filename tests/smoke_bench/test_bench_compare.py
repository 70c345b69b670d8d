"""`bench compare`: ratios, direction-aware verdicts and the exit code, on a real report of the test server."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmdeploy.bench.compare import compare_reports, format_comparison, parse_bound
from llmdeploy.errors import UserError


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", *args], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def _level(concurrency: int, tpot_ms: float, tok_s: float, ttft_ms: float = 50.0) -> dict[str, object]:
    def dist(v: float) -> dict[str, float]:
        return {"mean_ms": v, "p50_ms": v, "p90_ms": v * 1.1, "p99_ms": v * 1.3}

    return {
        "max_concurrency": concurrency,
        "request_rate": None,
        "failed": 0,
        "output_throughput_tok_s": tok_s,
        "request_throughput": tok_s / 100,
        "total_token_throughput_tok_s": tok_s * 2,
        "ttft": dist(ttft_ms),
        "tpot": dist(tpot_ms),
        "itl": dist(tpot_ms),
        "e2el": dist(ttft_ms + 100 * tpot_ms),
    }


def test_direction_aware_verdicts() -> None:
    base = {"levels": [_level(1, 10.0, 100.0), _level(4, 20.0, 300.0)]}
    faster = {"levels": [_level(1, 9.0, 110.0, ttft_ms=40.0), _level(4, 18.0, 330.0)]}
    changes, notes = compare_reports(base, faster, 0.05)
    assert not notes and changes and not any(c.regressed for c in changes)  # better everywhere
    slower = {"levels": [_level(1, 10.0, 90.0), _level(4, 20.0, 300.0, ttft_ms=60.0)]}
    changes, _ = compare_reports(base, slower, 0.05)
    regressed = {(c.point, c.figure) for c in changes if c.regressed}
    assert ("c=1", "output tok/s") in regressed  # lower throughput is worse
    assert ("c=4", "TTFT p99 (ms)") in regressed  # higher latency is worse
    assert ("c=1", "TTFT mean (ms)") not in regressed
    # within the bound is not a regression
    changes, _ = compare_reports(base, slower, 0.25)
    assert not any(c.regressed for c in changes)
    text = format_comparison(changes, [], 0.25)
    assert "new/base" in text and "0.900" in text and "result: PASS" in text


def test_points_missing_on_one_side_are_named_and_failures_count() -> None:
    base = {"levels": [_level(1, 10.0, 100.0), _level(8, 10.0, 100.0)]}
    new = {"levels": [{**_level(1, 10.0, 100.0), "failed": 2}]}
    changes, notes = compare_reports(base, new, 0.05)
    assert notes == ["c=8: only in BASE"]
    assert [c.figure for c in changes if c.regressed] == ["failed requests"]


def test_bound_parsing() -> None:
    assert parse_bound("5%") == pytest.approx(0.05)
    assert parse_bound("12.5") == pytest.approx(0.125)
    with pytest.raises(UserError):
        parse_bound("five")


@pytest.mark.slow
def test_compare_cli_identical_passes_planted_tpot_regression_fails(
    fault_server: str, tmp_path: Path
) -> None:
    base = tmp_path / "base.json"
    done = run_cli(
        "bench", "--url", fault_server, "--model", "ok", "--num-requests", "6", "--concurrency", "1,2",
        "--input-len", "8", "--output-len", "6", "--warmup-requests", "0", "--no-progress", "--output-json", str(base),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    same = run_cli("bench", "compare", str(base), str(base), "--max-regression", "5%")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "result: PASS" in same.stdout and "TPOT p90 (ms)" in same.stdout and "1.000" in same.stdout

    planted = copy.deepcopy(json.loads(base.read_text()))
    for level in planted["levels"]:
        level["tpot"] = {k: v * 1.10 if k.endswith("_ms") else v for k, v in level["tpot"].items()}
    new = tmp_path / "new.json"
    new.write_text(json.dumps(planted))
    worse = run_cli("bench", "compare", str(base), str(new), "--max-regression", "5%")
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "REGRESSION (higher is worse)" in worse.stdout and "1.100" in worse.stdout
    assert "result: FAIL" in worse.stdout
    loose = run_cli("bench", "compare", str(base), str(new), "--max-regression", "15%")
    assert loose.returncode == 0, loose.stdout

    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    bad = run_cli("bench", "compare", str(base), str(junk))
    assert bad.returncode == 2 and "not a bench report" in bad.stderr
