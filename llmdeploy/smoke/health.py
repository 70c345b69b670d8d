"""Waiting for an endpoint to come up, with a progress line saying what is awaited and for how long."""

from __future__ import annotations

import time
from typing import TextIO

import httpx

from llmdeploy.smoke.report import CheckResult

_POLL_S = 1.0
_PLAIN_LINE_EVERY_S = 15.0


def wait_for_health(
    client: httpx.Client, base_url: str, timeout_s: float, stream: TextIO | None, poll_s: float = _POLL_S
) -> CheckResult:
    """Poll GET /health until 200 or `timeout_s`; `stream` (stderr) shows elapsed time and the last answer."""
    url = base_url + "/health"
    start = time.perf_counter()
    tty = stream is not None and stream.isatty()
    next_plain_line_s = 0.0
    status = "no answer yet"
    while True:
        elapsed = time.perf_counter() - start
        try:
            response = client.get(url, timeout=min(10.0, max(1.0, timeout_s)))
            if response.status_code == 200:
                _clear(stream, tty)
                return CheckResult("health", True, f"GET /health 200 after {elapsed:.1f} s", elapsed)
            status = f"HTTP {response.status_code}"
        except httpx.ConnectError:
            status = "connection refused"
        except httpx.TimeoutException:
            status = "timed out"
        except httpx.HTTPError as e:
            status = type(e).__name__
        elapsed = time.perf_counter() - start
        if elapsed >= timeout_s:
            _clear(stream, tty)
            reason = f"GET {url} not healthy within {timeout_s:g} s (last: {status})"
            return CheckResult("health", False, reason, elapsed)
        if stream is not None:
            text = f"waiting for {url}: {elapsed:.0f} s of {timeout_s:g} s ({status})"
            if tty:
                stream.write("\r\033[2K" + text)
                stream.flush()
            elif elapsed >= next_plain_line_s:
                stream.write(text + "\n")
                stream.flush()
                next_plain_line_s = elapsed + _PLAIN_LINE_EVERY_S
        time.sleep(min(poll_s, max(0.0, timeout_s - elapsed)))


def _clear(stream: TextIO | None, tty: bool) -> None:
    if stream is not None and tty:
        stream.write("\r\033[2K")
        stream.flush()
