from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from engine_server import EngineServer, start

from hardening.figures import FIGURES, record, save, table

# planted in the server's environment; never to appear in any log or rendered file
PLANTED_API_KEY = "sk-planted-" + secrets.token_hex(12)
MAX_MODEL_LEN = 128


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        save()
        terminalreporter.write_sep("=", "hardening figures")
        terminalreporter.write_line(table(dict(FIGURES)))


@pytest.fixture(scope="session")
def engine_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """One server for the bad-input, fuzz, load and log tests: small KV budget, API key from the env."""
    server = start(
        tmp_path_factory.mktemp("engine"),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes",
        "24M",
        "--max-num-seqs",
        "16",
        "--max-queue-len",
        "4096",
        env_api_key=PLANTED_API_KEY,
    )
    try:
        yield server
    finally:
        server.stop()
        log = server.log()
        record("server log bytes checked for planted secrets", len(log.encode()))
        hits = log.count(PLANTED_API_KEY)
        record("planted secrets found in server logs", hits)
        assert hits == 0, "the API key was written to the server log"
