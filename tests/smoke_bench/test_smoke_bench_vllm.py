"""smoke and a short bench against vLLM's CPU server (`vllm` marker), a real process on the default model.

Needs the vLLM venv made by tests/vllm/setup.sh; skipped with that reason when it is missing. vLLM
0.32 cannot read GGUF, so the default model is converted once into llmdeploy's cache (as `apply` does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from default_model import default_model_gguf

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "smollm2-135m-instruct"
KV_CACHE_BYTES = 512 * 2**20
STARTUP_BUDGET_S = 1200  # import, torch.compile and warm-up on a shared 2-core machine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def default_gguf() -> Path:
    return default_model_gguf()


@dataclass(frozen=True)
class Server:
    url: str
    log: Path


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, pick_port: Callable[[], int]) -> Iterator[Server]:
    from llmdeploy_engine.facts import cache_root
    from vllm_install import SETUP_SCRIPT, vllm_python

    from llmdeploy.apply.local_command import checkpoint_from_gguf

    python = vllm_python()
    if python is None:
        pytest.skip(f"the vLLM CPU venv does not exist; run {SETUP_SCRIPT}")
    checkpoint = checkpoint_from_gguf(default_gguf(), cache_root(), python)
    port = pick_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # vLLM's CPU attention wants block sizes in multiples of 32, so --block-size is left to vLLM
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
        "--model", str(checkpoint), "--max-model-len", "2048", "--max-num-seqs", "32",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--served-model-name", MODEL_NAME,
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_BUDGET_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM was not healthy within {STARTUP_BUDGET_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield Server(url, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def test_smoke_against_vllm(vllm_server: Server) -> None:
    done = run_cli(
        "smoke", "--url", vllm_server.url, "--model", MODEL_NAME, "--log-file", str(vllm_server.log)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for check in ("list models", "chat completion", "streamed chat completion"):
        assert f"ok    {check} " in done.stdout, done.stdout
    assert "TGI InferenceClient" not in done.stdout  # vLLM has no /info: not a TGI endpoint
    kv_line = next(line for line in done.stdout.splitlines() if "KV cache:" in line)
    assert "engine reports" in kv_line, kv_line  # from vllm:cache_config_info or the start-up log


def test_short_bench_against_vllm(vllm_server: Server, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli(
        "bench", "--url", vllm_server.url, "--model", MODEL_NAME, "--num-requests", "4", "--concurrency", "1,2",
        "--input-len", "32", "--output-len", "8", "--warmup-requests", "1", "--no-progress", "--output-json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    for level in report["levels"]:
        assert (level["completed"], level["failed"], level["usage_reported"]) == (4, 0, True)
        assert level["total_output_tokens"] == 4 * 8  # vLLM honours ignore_eos
        assert 4 * 24 <= level["total_input_tokens"] <= 4 * 40
