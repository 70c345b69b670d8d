"""End to end: `llmdeploy apply` of the quickstart recipe on the local target, with the real
built-in engine process, then status, logs, a no-op re-apply, and down."""

from __future__ import annotations

import os
import socket

import pytest
from local_apply_helpers import free_port as _free_port
from local_apply_helpers import run_llmdeploy as _llmdeploy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("state")
    port = _free_port()
    env = {**os.environ, "LLMDEPLOY_STATE_DIR": str(state)}
    sets = ["--set", f"server.port={port}"]
    recipe = "recipes/quickstart.yaml"
    first = _llmdeploy("apply", recipe, "--yes", *sets, env=env)
    yield recipe, sets, env, port, first
    _llmdeploy("down", recipe, *sets, env=env)


def test_apply_starts_engine_and_smoke_passes(applied) -> None:
    _, _, _, port, first = applied
    out = first.stdout + first.stderr
    assert first.returncode == 0, out
    assert f"127.0.0.1:{port}" in out
    assert "Traceback" not in out
    assert "llmdeploy down" in out  # tells how to stop it


def test_second_apply_is_a_noop(applied) -> None:
    recipe, sets, env, _, _ = applied
    again = _llmdeploy("apply", recipe, "--yes", *sets, env=env)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stderr


def test_status_and_logs(applied) -> None:
    recipe, sets, env, port, _ = applied
    status = _llmdeploy("status", recipe, *sets, env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "healthy" in status.stdout and str(port) in status.stdout
    logs = _llmdeploy("logs", recipe, *sets, "--lines", "200", env=env)
    assert logs.returncode == 0
    assert "KV cache size" in logs.stdout  # the engine's start-up report


def test_down_stops_and_frees_the_port(applied) -> None:
    recipe, sets, env, port, _ = applied
    down = _llmdeploy("down", recipe, *sets, env=env)
    assert down.returncode == 0, down.stderr
    status = _llmdeploy("status", recipe, *sets, env=env)
    assert status.returncode != 0
    with socket.socket() as s:
        # a connection the engine closed may linger in TIME_WAIT; servers (uvicorn too) bind past it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # raises if the engine still listens
