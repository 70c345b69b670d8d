"""A real `llmdeploy-engine serve` process on the default model (CPU), started and stopped by a test.

The one helper the server, hardening, structured-output and smoke/bench tests start engines with.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from default_model import DEFAULT_MODEL_GGUF, MISSING_REASON

MODEL_NAME = "smollm2"
GGUF = DEFAULT_MODEL_GGUF
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EngineServer:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    api_key: str | None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, wait; SIGKILL the group only if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return int(self.proc.returncode)


def start(
    log_dir: Path,
    *flags: str,
    env_api_key: str | None = None,
    extra_env: dict[str, str] | None = None,
    served_model_name: str = MODEL_NAME,
    through_toolkit: bool = False,
) -> EngineServer:
    """Start the engine server and wait for /health; `env_api_key` goes in through VLLM_API_KEY only.

    `through_toolkit` starts it as `llmdeploy serve`, which execs the engine's serve command (same pid).
    """
    if not GGUF.is_file():
        pytest.skip(MISSING_REASON)
    port = free_port()
    log_path = log_dir / f"engine-{port}.log"
    command = (
        ["-c", "from llmdeploy.cli.main import main; main()"]
        if through_toolkit
        else ["-m", "llmdeploy_engine.cli"]
    )
    argv = [
        sys.executable,
        *command,
        "serve",
        "--model",
        str(GGUF),
        "--device",
        "cpu",
        "--served-model-name",
        served_model_name,
        "--port",
        str(port),
        *flags,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    env.pop("VLLM_API_KEY", None)
    if env_api_key is not None:
        env["VLLM_API_KEY"] = env_api_key
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = EngineServer(f"http://127.0.0.1:{port}", proc, log_path, env_api_key)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            pytest.fail(f"server not healthy in {START_TIMEOUT_S} s:\n{server.log()[-4000:]}")
        time.sleep(0.5)


def metric_values(url: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (unauthenticated: /metrics is for the scraper)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def metric(values: dict[str, float], name: str) -> float:
    """The sum of a metric over its label sets."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))
