"""A port taken by another server while the engine starts (issue 29, item 12).

Another server answers /health 200 on the port with the same served model name, the way a second
engine of the same model would; the process "we started" then dies because it cannot bind. The
wait must not call that up, and must say the port was taken. The stand-ins are a real HTTP server
and a real process that really fails to bind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from llmdeploy.apply.startup_watch import wait_for_health
from llmdeploy.smoke import smoke
from llmdeploy.smoke.identity import EngineIdentity

SERVED = "smollm2-135m-instruct"


class _OtherEngine(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": SERVED, "object": "model"}]}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("x-llmdeploy-instance", "someone-elses-instance")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _engine_that_cannot_bind(port: int, log: Path) -> subprocess.Popen[bytes]:
    code = (
        "import socket, time; time.sleep(2); s = socket.socket(); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"
    )
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.parametrize("instance_id", ["ours-123", None], ids=["builtin", "vllm-like"])
def test_another_server_on_the_port_is_not_our_engine(
    other_server: int, tmp_path: Path, instance_id: str | None
) -> None:
    port = other_server
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "engine.log"
    proc = _engine_that_cannot_bind(port, log)
    identity = EngineIdentity(SERVED if instance_id else "our-model", instance_id)
    said: list[str] = []
    try:
        with httpx.Client(timeout=5.0) as client:
            up = wait_for_health(
                url, proc, log, budget_s=60, echo=said.append, stranger=lambda: identity.mismatch(client, url)
            )
    finally:
        proc.kill()
        proc.wait()
    text = "\n".join(said)
    assert up is False, text
    assert "not our engine" in text and "the port was taken by another process" in text, text


def test_smoke_with_an_identity_stops_at_another_server(other_server: int) -> None:
    url = f"http://127.0.0.1:{other_server}"
    report = smoke(url, model=SERVED, identity=EngineIdentity(SERVED, "ours-123"), progress_stream=None)
    assert not report.ok
    assert [c.name for c in report.checks] == ["health", "engine identity"]
    assert "someone-elses-instance" in report.checks[-1].detail
