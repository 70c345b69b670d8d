"""Fixtures: the fault-injecting test server as a real process on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

SERVER = Path(__file__).with_name("fault_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"test server exited with {process.returncode}")
        try:
            httpx.get(url + "/v1/models", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"test server at {url} did not start within {timeout_s} s")


StartServer = Callable[..., str]


@pytest.fixture(scope="session")
def pick_port() -> Callable[[], int]:
    return free_port


@pytest.fixture
def start_fault_server() -> Iterator[StartServer]:
    """start(*extra_args) -> base URL; every server started is stopped at the end of the test."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> str:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, str(SERVER), "--port", str(port), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_listening(url, process)
        return url

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def fault_server(start_fault_server: StartServer) -> str:
    return start_fault_server("--kv-cache-tokens", "1000", "--token-delay-s", "0.01")
