"""Two `llmdeploy apply` at once on the local target, with the real built-in engine (issue 29, item 12).

While one apply of the quickstart recipe is starting its engine: a second apply of the same recipe,
and an apply of a copy under another name on the same port (same served model name, so answers alone
cannot tell the engines apart), both fail at once and clearly, and start nothing. Once the first is
up, the copy is refused naming the recipe that holds the port; state.json records the engine that
really listens, `down` stops it and the port is free.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from local_apply_helpers import ROOT, free_port, run_llmdeploy

pytestmark = pytest.mark.slow
RECIPE = "recipes/quickstart.yaml"


def _listener_pid(port: int) -> int | None:
    """The pid whose socket listens on 127.0.0.1:`port` (Linux /proc), to check state.json against."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
            inode = fields[9]
    if inode is None:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == f"socket:[{inode}]" for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


def test_concurrent_applies_one_wins_the_others_fail_clearly(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = {**os.environ, "LLMDEPLOY_STATE_DIR": str(state_dir)}
    port = free_port()
    sets = ["--set", f"server.port={port}"]
    copy = tmp_path / "quickcopy.yaml"
    copy.write_text(f"extends: {ROOT / RECIPE}\nname: quickcopy\n")
    first = subprocess.Popen(
        [sys.executable, "-m", "llmdeploy.cli.main", "apply", RECIPE, "--yes", *sets],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # wait until the first apply has started its engine (which takes a while to load and bind)
        log = state_dir / "quickstart" / "engine.log"
        deadline = time.monotonic() + 300
        while not log.is_file() and first.poll() is None:
            assert time.monotonic() < deadline, "the first apply never started its engine"
            time.sleep(0.2)
        assert first.poll() is None, first.stdout.read() if first.stdout else ""

        same = run_llmdeploy("apply", RECIPE, "--yes", *sets, env=env, timeout=120)
        out = same.stdout + same.stderr
        assert same.returncode == 2, out
        assert "another llmdeploy command is working on recipe 'quickstart'" in out, out
        assert "Traceback" not in out and "PASS" not in out

        other = run_llmdeploy("apply", str(copy), "--yes", *sets, env=env, timeout=120)
        out = other.stdout + other.stderr
        assert other.returncode == 2, out
        assert f"port {port} is being claimed by another llmdeploy apply" in out, out
        assert "PASS" not in out and not (state_dir / "quickcopy" / "state.json").exists()

        first_out, _ = first.communicate(timeout=1200)
        assert first.returncode == 0, first_out
        assert "result: PASS" in first_out and "engine identity" in first_out

        state = json.loads((state_dir / "quickstart" / "state.json").read_text())
        assert _listener_pid(port) == state["pid"]
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert health.headers["x-llmdeploy-instance"] == state["instance_id"]

        later = run_llmdeploy("apply", str(copy), "--yes", *sets, env=env, timeout=120)
        out = later.stdout + later.stderr
        assert later.returncode == 2 and f"port {port} is in use by recipe 'quickstart'" in out, out
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        down = run_llmdeploy("down", RECIPE, *sets, env=env, timeout=120)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    assert "still answers" not in down.stdout
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections may linger
        s.bind(("127.0.0.1", port))  # raises if anything still listens
