"""Waiting for a freshly started engine: stream its log, show progress, stop early when it dies.

"Up" means /health answers 200 *from the process we started* (`stranger` says when another server
answers instead); an engine that dies because its port was taken is reported as such.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import httpx

QUIET_PROGRESS_S = 10.0
POLL_S = 0.5
# how uvicorn (the built-in engine), vLLM and TGI word a failed bind of their listening socket
_BIND_FAILURE = re.compile(r"address already in use|errno 98\b|eaddrinuse", re.IGNORECASE)


def wait_for_health(
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    budget_s: float,
    echo: Callable[[str], None],
    stranger: Callable[[], str | None] = lambda: None,
) -> bool:
    """True once GET /health answers 200 and `stranger()` finds the answer is ours; False when the
    process exits or the budget runs out."""
    start = time.monotonic()
    other: str | None = None
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
            if any(_BIND_FAILURE.search(line) for line in recent):
                echo(
                    f"the engine could not listen on {url}: the port was taken by another process "
                    "after llmdeploy checked that it was free" + (f" ({other})" if other else "")
                )
            return False
        if _healthy(url):
            found = _stranger(stranger)
            if found is None:
                echo(f"  healthy after {elapsed:.1f} s")
                return True
            if found != other:
                echo(f"  not our engine: {found}; waiting for the one we started")
                other = found
        if elapsed > budget_s:
            echo(
                f"no answer from {url}/health within the start-up budget of {budget_s:.0f} s (smoke.startup_timeout_s)"
                + (f"; meanwhile {other}" if other else "")
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


def _stranger(stranger: Callable[[], str | None]) -> str | None:
    try:
        return stranger()
    except httpx.HTTPError as e:
        return f"could not check who answers ({type(e).__name__})"


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
