"""Another client's /health latency, measured from a process of its own.

A probe inside the test's own event loop also measures the test: its JSON encoding of large bodies,
its /proc scans, its cancelled requests. This one runs `python -c PROBE` with one keep-alive
connection, a GET /health every 10 ms, until told to stop; the latencies come back as JSON.

    with HealthProbe(server.url) as probe:
        ...  # the load
    latencies_s = probe.latencies_s
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from types import TracebackType

PROBE = r"""
import http.client, json, sys, threading, time, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
interval_s, at_least = float(sys.argv[2]), int(sys.argv[3])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
latencies = []
while not stop.is_set() or len(latencies) < at_least:
    t0 = time.monotonic()
    conn.request("GET", "/health")
    r = conn.getresponse()
    r.read()
    latencies.append(time.monotonic() - t0)
    if r.status != 200:
        raise SystemExit(f"/health answered {r.status}")
    if len(latencies) == 1:
        print("ready", flush=True)
    time.sleep(interval_s)
print(json.dumps(latencies), flush=True)
"""


class HealthProbe:
    """GET /health every `interval_s` from another process while the `with` block runs."""

    def __init__(self, url: str, interval_s: float = 0.01, at_least: int = 1) -> None:
        self.url, self.interval_s, self.at_least = url, interval_s, at_least
        self.latencies_s: list[float] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> HealthProbe:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, self.url, str(self.interval_s), str(self.at_least)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        first = self._proc.stdout.readline()
        if first.strip() != "ready":
            self._proc.kill()
            raise RuntimeError(f"the /health probe did not start: {first!r}")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._proc is not None
        try:
            out, _ = self._proc.communicate("", timeout=120)  # closing stdin tells it to stop
        finally:
            self._proc.kill()
        if kind is None:
            assert self._proc.returncode == 0, f"the /health probe failed: {out[-2000:]}"
            self.latencies_s = json.loads(out.strip().splitlines()[-1])

    def summary(self) -> str:
        s = self.latencies_s
        return f"{len(s)} probes, median {statistics.median(s) * 1000:.1f} ms, worst {max(s) * 1000:.1f} ms"

    @property
    def worst_ms(self) -> float:
        return max(self.latencies_s) * 1000


def idle_probe(url: str, num: int = 500) -> HealthProbe:
    """`num` probes with nothing else running (the baseline printed next to each figure; as many probes
    as under load, since on a shared host the worst of many probes is worse than the worst of few)."""
    with HealthProbe(url, at_least=num) as probe:
        pass
    return probe
