"""`llmdeploy smoke` / `llmdeploy bench` as real processes against the fault-injecting test server.

Failure counts, exit codes and the JSON report's numbers are checked against a hand count; no run may
print a traceback.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from llmdeploy.bench import BenchOptions, bench
from llmdeploy.bench.request import RequestResult, RequestSpec, send_request
from llmdeploy.smoke import smoke

pytestmark = pytest.mark.slow  # each test starts the fault server and the CLI as processes

StartServer = Callable[..., str]  # the conftest fixture `start_fault_server`


def run_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", *args], capture_output=True, text=True, timeout=timeout_s
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def write_dataset(path: Path, rows: list[tuple[str, int]]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "output_len": n}) + "\n" for p, n in rows))
    return str(path)


# prompt words (= prompt tokens on the test server) 3+4+5+6+7 = 25; output tokens 2+3+4+5+6 = 20
ROWS = [("one two three", 2), ("a b c d", 3), ("a b c d e", 4), ("a b c d e f", 5), ("a b c d e f g", 6)]


def bench_json(
    url: str, model: str, tmp_path: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / f"{model}.json"
    done = run_cli(
        "bench", "--url", url, "--model", model, "--no-progress", "--output-json", str(out),
        "--warmup-requests", "0", *extra,
    )  # fmt: skip
    return done, json.loads(out.read_text())


def test_json_report_matches_hand_count(fault_server: str, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "d.jsonl", ROWS)
    done, report = bench_json(
        fault_server, "ok", tmp_path, "--dataset", dataset, "--num-requests", "5", "--concurrency", "1,2",
        "--chart", str(tmp_path / "c.png"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert [lv["max_concurrency"] for lv in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert (level["num_requests"], level["completed"], level["failed"]) == (5, 5, 0)
        assert (level["total_input_tokens"], level["total_output_tokens"]) == (25, 20)
        assert level["usage_reported"] is True
        assert level["request_throughput"] == pytest.approx(5 / level["duration_s"])
        assert level["output_throughput_tok_s"] == pytest.approx(20 / level["duration_s"])
        assert level["total_token_throughput_tok_s"] == pytest.approx(45 / level["duration_s"])
        assert level["ttft"]["count"] == 5
        assert level["tpot"]["count"] == 5  # every request has more than one output token
        assert level["itl"]["count"] == 20 - 5  # one gap fewer than tokens, per request
    assert report["passed"] is True
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "result: PASS" in done.stdout


def test_chat_endpoint_hand_count(fault_server: str, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "d.jsonl", ROWS)
    options = BenchOptions(
        num_requests=5, concurrency=(2,), dataset=dataset, warmup_requests=1, endpoint="chat"
    )
    report = bench(fault_server, "ok", options, progress=False)
    (level,) = report.levels
    assert (level.metrics.completed, level.metrics.failed) == (5, 0)
    # the 1 warm-up request takes the first row, the 5 measured ones the next five (cycled)
    assert level.metrics.total_input_tokens == 4 + 5 + 6 + 7 + 3
    assert level.metrics.total_output_tokens == 3 + 4 + 5 + 6 + 2
    assert report.passed


def test_counts_chunks_without_usage(fault_server: str, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "d.jsonl", ROWS)
    done, report = bench_json(fault_server, "no-usage", tmp_path, "--dataset", dataset, "--num-requests", "5",
                              "--concurrency", "3")  # fmt: skip
    assert done.returncode == 0
    level = report["levels"][0]
    assert (level["completed"], level["total_output_tokens"], level["usage_reported"]) == (5, 20, False)


def test_requests_share_one_keep_alive_connection(fault_server: str) -> None:
    """Each stream is read to its end after [DONE], so the next request reuses the connection (as vLLM's
    client does) instead of paying a new connect inside its TTFT."""
    connects: list[str] = []

    async def trace(name: str, info: dict[str, object]) -> None:
        if name == "connection.connect_tcp.complete":
            connects.append(name)

    async def traced(request: httpx.Request) -> None:
        request.extensions["trace"] = trace

    async def run() -> list[RequestResult]:
        async with httpx.AsyncClient(event_hooks={"request": [traced]}) as client:
            return [
                await send_request(
                    client, fault_server, "ok", RequestSpec("one two three", 4), endpoint, False
                )
                for endpoint in ("completions", "chat", "completions")
            ]

    results = asyncio.run(run())
    assert [r.ok for r in results] == [True] * 3
    assert len(connects) == 1


def test_dropped_connections_are_counted_with_reasons(
    start_fault_server: StartServer, tmp_path: Path
) -> None:
    url = start_fault_server()  # fresh server: `mixed` cuts its 3rd, 6th, 9th, ... request
    dataset = write_dataset(tmp_path / "d.jsonl", ROWS)
    done, report = bench_json(url, "mixed", tmp_path, "--dataset", dataset, "--num-requests", "9",
                              "--concurrency", "1,3")  # fmt: skip
    assert done.returncode == 1
    for level in report["levels"]:
        assert (level["completed"], level["failed"]) == (6, 3)
        assert level["failure_reasons"] == {"connection dropped (RemoteProtocolError)": 3}
        assert not level["passed"]
    assert "failed at c=3: 3 x connection dropped" in done.stdout
    assert "result: FAIL" in done.stdout


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("midstream-error", "error event in stream: injected mid-stream failure"),
        ("drop", "connection dropped (RemoteProtocolError)"),
        ("http-500", "HTTP 500: injected failure"),
        ("bad-shape", "stream ended without data: [DONE]"),
    ],
)
def test_every_failure_kind_fails_the_run(fault_server: str, tmp_path: Path, model: str, reason: str) -> None:
    done, report = bench_json(fault_server, model, tmp_path, "--num-requests", "4", "--concurrency", "2",
                              "--input-len", "8", "--output-len", "4")  # fmt: skip
    assert done.returncode == 1
    level = report["levels"][0]
    assert (level["completed"], level["failed"], level["failure_reasons"]) == (0, 4, {reason: 4})


def test_tolerated_failures_pass_with_max_failed_fraction(
    start_fault_server: StartServer, tmp_path: Path
) -> None:
    url = start_fault_server()
    dataset = write_dataset(tmp_path / "d.jsonl", ROWS)
    done, _ = bench_json(url, "mixed", tmp_path, "--dataset", dataset, "--num-requests", "9", "--concurrency", "1",
                         "--slo-max-failed-fraction", "0.34")  # fmt: skip
    assert done.returncode == 0, done.stdout


def test_latency_slo_decides_the_exit_code(fault_server: str, tmp_path: Path) -> None:
    # `slow` waits 0.3 s before its first token
    args = ("--num-requests", "3", "--concurrency", "3", "--input-len", "4", "--output-len", "3")
    missed, report = bench_json(fault_server, "slow", tmp_path, *args, "--slo-p99-ttft-ms", "100")
    assert missed.returncode == 1
    assert (
        report["levels"][0]["slo"][0]["name"] == "p99_ttft_ms"
        and report["levels"][0]["ttft"]["p99_ms"] >= 300
    )
    met, _ = bench_json(fault_server, "slow", tmp_path, *args, "--slo-p99-ttft-ms", "5000")
    assert met.returncode == 0


def test_poisson_arrivals_and_synthetic_lengths(fault_server: str, tmp_path: Path) -> None:
    done, report = bench_json(fault_server, "ok", tmp_path, "--num-requests", "6", "--concurrency", "4",
                              "--request-rate", "50", "--input-len", "20:40", "--output-len", "2:6")  # fmt: skip
    assert done.returncode == 0
    level = report["levels"][0]
    assert level["request_rate"] == 50 and level["completed"] == 6
    # the test server counts words, so the calibration is exact and prompts land in range
    assert 6 * 20 <= level["total_input_tokens"] <= 6 * 40
    assert 6 * 2 <= level["total_output_tokens"] <= 6 * 6
    assert report["calibration"]["measured"] is True


def test_bench_unreachable_url_is_a_clear_error() -> None:
    done = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", "x", "--num-requests", "1")
    assert done.returncode != 0


def test_smoke_passes_and_fails_per_check(fault_server: str) -> None:
    good = run_cli("smoke", "--url", fault_server, "--model", "ok")
    assert good.returncode == 0, good.stdout
    assert "ok    streamed chat completion" in good.stdout
    assert "ok    TGI InferenceClient.text_generation(stream)" in good.stdout
    assert "engine reports 1,000 tokens" in good.stdout
    bad = run_cli("smoke", "--url", fault_server, "--model", "bad-shape")
    assert bad.returncode == 1
    fails = [line for line in bad.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and "does not end with data: [DONE]" in fails[0]
    dropped = run_cli("smoke", "--url", fault_server, "--model", "drop")
    assert dropped.returncode == 1
    assert "RemoteProtocolError" in dropped.stdout
    assert "result: FAIL (3 checks failed)" in dropped.stdout


def test_smoke_waits_for_health_with_progress(start_fault_server: StartServer) -> None:
    url = start_fault_server("--health-delay-s", "2")
    done = run_cli("smoke", "--url", url, "--model", "ok", "--startup-timeout", "30")
    assert done.returncode == 0, done.stdout
    assert f"waiting for {url}/health" in done.stderr and "HTTP 503" in done.stderr


def test_smoke_gives_up_after_the_startup_budget() -> None:
    done = run_cli("smoke", "--url", "http://127.0.0.1:9", "--startup-timeout", "2")
    assert done.returncode == 1
    assert "FAIL  health" in done.stdout and "not healthy within 2 s" in done.stdout


def test_smoke_warns_when_kv_differs_from_plan(fault_server: str) -> None:
    class Plan:
        kv_cache_tokens = 800

    report = smoke(fault_server, model="ok", plan=Plan(), kv_tolerance=0.1, progress_stream=None)
    assert report.ok and report.kv is not None
    assert not report.kv.within_tolerance
    assert "warn  KV cache: engine reports 1,000 tokens" in report.render() and "800" in report.render()


def test_recipe_drives_smoke_and_bench(fault_server: str, tmp_path: Path) -> None:
    port = fault_server.rsplit(":", 1)[1]
    recipe = tmp_path / "fault.yaml"
    recipe.write_text(
        f"""
name: fault-test
model: {{id: ok}}
server: {{port: {port}}}
smoke:
  startup_timeout_s: 10
  prompts:
    - {{prompt: "say w2", expect: ["w2"], max_tokens: 4}}
    - {{messages: [{{role: user, content: hi}}], expect: ["w9"], max_tokens: 4}}
bench:
  num_requests: 4
  concurrency: [2]
  input_len: 8
  output_len: 3
  warmup_requests: 1
  slo: {{p99_ttft_ms: 5000}}
"""
    )
    smoked = run_cli("smoke", str(recipe))
    assert smoked.returncode == 1
    assert "ok    recipe prompt 1" in smoked.stdout
    assert "FAIL  recipe prompt 2" in smoked.stdout and "lacks 'w9'" in smoked.stdout
    out = tmp_path / "r.json"
    benched = run_cli("bench", str(recipe), "--no-progress", "--output-json", str(out))
    assert benched.returncode == 0, benched.stdout
    level = json.loads(out.read_text())["levels"][0]
    assert (level["max_concurrency"], level["completed"], level["total_output_tokens"]) == (2, 4, 12)
