"""Every suite script's CPU `--quick` run: it exits 0, prints its header and table, and writes JSON
whose rows carry the figures the table shows (positive where they are measured). This is how CI
covers benchmarks/; the figures themselves are not checked (a shared CPU, tiny sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
# script -> figures each JSON row must hold as positive numbers
FIGURES = {
    "latency": (
        "decode_tok_s",
        "e2e_tok_s",
        "roofline_tok_s",
        "roofline_pct",
        "achieved_gb_s",
        "gb_per_token",
    ),
    "throughput": ("tok_s", "seconds", "peer_useful_tok_s", "x_peer"),
    "decode_kernels": ("us", "gb_s", "copy_pct"),
    "serving": ("tok_s", "ttft_ms", "tpot_ms", "out_tokens"),
}


def run_quick(script: str, out: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{script}.py --quick failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.parametrize("script", sorted(FIGURES))
def test_quick_run_prints_a_table_and_writes_json(script: str, tmp_path: Path) -> None:
    out = tmp_path / f"{script}.json"
    done = run_quick(script, out)
    assert "commit: " in done.stdout and "torch: " in done.stdout, done.stdout
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 3, done.stdout  # heading, rule, at least one row
    data = json.loads(out.read_text())
    assert data["script"] == script
    assert {"commit", "cpu", "torch", "triton", "transformers"} <= set(data["header"])
    assert data["rows"] and len(data["rows"]) == len(table) - 2
    for row in data["rows"]:
        for figure in FIGURES[script]:
            assert isinstance(row[figure], int | float) and row[figure] > 0, (figure, row)
    if script == "serving":
        assert {r["phase"] for r in data["rows"]} == {"single", "8 streams"}
        assert all(r["failed"] == 0 and r["out_tokens"] == 8 for r in data["rows"]), data["rows"]


def test_compare_prints_ratios_of_matching_rows(tmp_path: Path) -> None:
    a = {
        "script": "latency",
        "header": {"commit": "a"},
        "rows": [{"model": "m", "decode_spread": "1-2", "tok_s": 100.0}],
    }
    b = {
        "script": "latency",
        "header": {"commit": "b"},
        "rows": [{"model": "m", "decode_spread": "3-4", "tok_s": 125.0}],
    }
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    cmd = [sys.executable, str(BENCH / "compare.py"), str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "| m | tok_s | 100 | 125 | 1.250 |" in done.stdout, done.stdout
    b["script"] = "throughput"
    (tmp_path / "b.json").write_text(json.dumps(b))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "nothing to compare" in done.stderr
