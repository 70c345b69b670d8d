"""smoke and a short bench against the built-in engine server as a real process on the default model.

The engine is started with the quickstart recipe's limits (0.5 GiB KV cache, max_model_len 2048), so
smoke's predicted-versus-actual compares the planner's figure with what the engine allocated.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from default_model import default_model_gguf
from engine_server import start

from llmdeploy.smoke.kv_capacity import capacity_from_log

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "recipes" / "quickstart.yaml"
MODEL_NAME = "smollm2-135m-instruct"  # the quickstart's served_model_name

pytestmark = pytest.mark.slow


def default_gguf() -> Path:
    return default_model_gguf()


@dataclass(frozen=True)
class Engine:
    url: str
    port: int
    log: Path


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    server = start(
        tmp_path_factory.mktemp("engine"),
        *("--kv-cache-memory-bytes", str(512 * 2**20), "--max-model-len", "2048", "--max-num-seqs", "32"),
        served_model_name=MODEL_NAME,
    )
    try:
        yield Engine(server.url, server.port, server.log_path)
    finally:
        server.stop(timeout_s=20)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def test_smoke_quickstart_recipe_against_engine(engine: Engine) -> None:
    done = run_cli(
        "smoke", str(QUICKSTART), "--set", f"server.port={engine.port}", "--log-file", str(engine.log)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for check in ("list models", "chat completion", "streamed chat completion", "recipe prompt 1",
                  "TGI InferenceClient.chat_completion", "TGI InferenceClient.text_generation(stream)"):  # fmt: skip
        assert f"ok    {check} " in done.stdout, done.stdout
    from llmdeploy.planner import make_plan
    from llmdeploy.recipe import load_recipe

    predicted = make_plan(load_recipe(QUICKSTART)).kv_cache_tokens
    kv_line = next(line for line in done.stdout.splitlines() if "KV cache:" in line)
    assert f"plan predicted {predicted:,}" in kv_line
    assert "/metrics llmdeploy:kv_cache_tokens" in kv_line
    metrics = httpx.get(engine.url + "/metrics").text
    actual = next(
        int(float(line.split()[-1]))
        for line in metrics.splitlines()
        if line.startswith("llmdeploy:kv_cache_tokens")
    )
    assert f"engine reports {actual:,} tokens" in kv_line
    from_log = capacity_from_log(engine.log)
    assert from_log is not None and from_log.tokens == actual  # the start-up log and /metrics agree


def test_short_bench_against_engine(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli(
        "bench", "--url", engine.url, "--model", MODEL_NAME, "--num-requests", "4", "--concurrency", "1,2",
        "--input-len", "32", "--output-len", "8", "--warmup-requests", "1", "--no-progress",
        "--output-json", str(out), "--chart", str(tmp_path / "chart.png"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["calibration"]["measured"] is True
    for level in report["levels"]:
        assert (level["completed"], level["failed"]) == (4, 0)
        assert level["usage_reported"] is True
        assert level["total_output_tokens"] == 4 * 8  # ignore_eos: every request runs to max_tokens
        assert 4 * 24 <= level["total_input_tokens"] <= 4 * 40  # sized by calibration, measured by usage
        assert 0 < level["ttft"]["p50_ms"] <= level["e2el"]["p50_ms"]
        assert level["tpot"]["count"] == 4
    assert (tmp_path / "chart.png").stat().st_size > 0


def test_bench_recipe_against_engine(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli(
        "bench", str(QUICKSTART), "--set", f"server.port={engine.port}", "--num-requests", "2", "--concurrency", "2",
        "--output-len", "4", "--warmup-requests", "0", "--no-progress", "--output-json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["model"] == MODEL_NAME
    assert report["options"]["input_len"] == "64"  # the recipe's bench.input_len
    assert report["levels"][0]["total_output_tokens"] == 8


def test_smoke_records_calibration_and_plan_uses_it(engine: Engine, tmp_path: Path) -> None:
    calibration = tmp_path / "calibration.yaml"
    port = f"server.port={engine.port}"
    done = run_cli("smoke", str(QUICKSTART), "--set", port, "--calibration", str(calibration))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "calibration: recorded" in done.stderr
    metrics = httpx.get(engine.url + "/metrics").text
    actual = next(
        int(float(line.split()[-1]))
        for line in metrics.splitlines()
        if line.startswith("llmdeploy:kv_cache_tokens")
    )
    planned = run_cli(
        "plan", str(QUICKSTART), "--set", port, "--calibration", str(calibration), "--output", "json"
    )
    assert planned.returncode == 0, planned.stderr
    body = json.loads(planned.stdout)
    assert body["kv_cache_tokens"] == actual
    assert body["calibration"]["actual_kv_cache_tokens"] == actual
    assert body["calibration"]["source"] == "/metrics llmdeploy:kv_cache_tokens"
    assert "kv_cache_tokens" in body["modeled"]
    # a setting the measurement was not made with is planned from the model alone
    other = run_cli(
        "plan", str(QUICKSTART), "--set", "limits.max_model_len=1024", "--calibration", str(calibration)
    )
    assert other.returncode == 0, other.stderr
    assert "no record in" in other.stdout


def test_sweep_of_quickstart_draws_its_points_on_the_pareto_png(engine: Engine, tmp_path: Path) -> None:
    from PIL import Image

    from llmdeploy.bench.chart import POINT_COLOR

    out, png = tmp_path / "bench.json", tmp_path / "pareto.png"
    done = run_cli(
        "bench", str(QUICKSTART), "--set", f"server.port={engine.port}", "--num-requests", "4",
        "--concurrency", "1,2,4", "--input-len", "32", "--output-len", "8", "--warmup-requests", "1",
        "--no-progress", "--slo-p99-tpot-ms", "5000", "--output-json", str(out), "--chart", str(png),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # the curve comes first, a row per point in sweep order, then the full table
    lines = done.stdout.splitlines()
    assert lines[0].startswith("point") and "tok/s/user" in lines[0] and "TTFT p90" in lines[0]
    assert [line.split()[0] for line in lines[2:5]] == ["c=1", "c=2", "c=4"]
    assert lines.index("") == 5 and lines[6].startswith("benchmark of")
    report = json.loads(out.read_text())
    image = Image.open(png)
    assert image.size == (1600, 480) and png.stat().st_size > 20_000
    drawn = json.loads(image.info["llmdeploy:points"])
    assert [p["point"] for p in drawn["points"]] == ["c=1", "c=2", "c=4"]
    red = tuple(int(POINT_COLOR[i : i + 2], 16) for i in (1, 3, 5))
    pixels = image.convert("RGB")
    for point, level in zip(drawn["points"], report["levels"], strict=True):
        assert point["x"] == pytest.approx(level["tok_s_per_user"]) and level["tok_s_per_user"] > 0
        assert point["y"] == pytest.approx(level["output_throughput_tok_s"])
        assert 0 < point["px"] < 1600 and 0 < point["py"] < 480
        assert pixels.getpixel((point["px"], point["py"])) == red, point  # the marker is drawn there


def test_multi_turn_sessions_resend_their_history(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli(
        "bench", "--url", engine.url, "--model", MODEL_NAME, "--workload", "multi-turn", "--num-turns", "3",
        "--num-requests", "6", "--concurrency", "2", "--input-len", "16", "--output-len", "8",
        "--warmup-requests", "0", "--no-progress", "--output-json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["endpoint"] == "chat" and report["workload"]["name"] == "multi-turn"
    (level,) = report["levels"]
    assert (level["completed"], level["total_output_tokens"]) == (6, 6 * 8)
    # turn 2 and 3 carry the earlier turns and replies: far more than 16 prompt tokens on average
    assert level["mean_input_tokens"] > 16 + 2 * 8


def test_shared_prefix_workload_against_engine(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli(
        "bench", "--url", engine.url, "--model", MODEL_NAME, "--workload", "shared-prefix", "--num-prefixes", "2",
        "--suffixes-per-prefix", "3", "--prefix-len", "64", "--num-requests", "6", "--concurrency", "3",
        "--input-len", "16", "--output-len", "4", "--warmup-requests", "0", "--no-progress", "--output-json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    (level,) = report["levels"]
    assert report["workload"]["num_prefixes"] == 2 and level["completed"] == 6
    assert 6 * 64 <= level["total_input_tokens"] <= 6 * (64 + 16) * 1.3  # realised counts from usage
