"""Waiting for a freshly started engine: stream its log, show progress, stop early when it dies."""

from __future__ import annotations

import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import httpx

QUIET_PROGRESS_S = 10.0
POLL_S = 0.5


def wait_for_health(
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    budget_s: float,
    echo: Callable[[str], None],
) -> bool:
    """True once GET /health answers 200; False when the process exits or the budget runs out."""
    start = time.monotonic()
    last_output = start
    offset = 0
    recent: deque[str] = deque(maxlen=20)
    partial = ""
    while True:
        elapsed = time.monotonic() - start
        offset, chunk = _read_from(log_path, offset)
        if chunk:
            partial += chunk
            *lines, partial = partial.split("\n")
            for line in lines:
                if line.strip():
                    recent.append(line)
                    echo(f"  | {line}")
                    last_output = time.monotonic()
        if proc.poll() is not None:
            echo(
                f"the engine exited with code {proc.returncode} after {elapsed:.0f} s; last lines of its log:"
            )
            for line in recent:
                echo(f"  | {line}")
            return False
        if _healthy(url):
            echo(f"  healthy after {elapsed:.1f} s")
            return True
        if elapsed > budget_s:
            echo(
                f"no answer from {url}/health within the start-up budget of {budget_s:.0f} s (smoke.startup_timeout_s)"
            )
            return False
        if time.monotonic() - last_output > QUIET_PROGRESS_S:
            msg = f"  ... waiting for {url}/health: {elapsed:.0f} s of {budget_s:.0f} s"
            echo(msg)
            last_output = time.monotonic()
        time.sleep(POLL_S)


def _read_from(path: Path, offset: int) -> tuple[int, str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset, ""
    return offset + len(data), data.decode("utf-8", errors="replace")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
