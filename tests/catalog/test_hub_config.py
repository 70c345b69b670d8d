"""Unknown models through the real huggingface_hub client, against a local server that serves the
hub's file-resolve route (HEAD + GET with the X-Repo-Commit / ETag headers the client checks, and
the X-Error-Code answers of gated, missing and revision-less repositories)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from llmdeploy.catalog.hub_config import fetch_hub_config
from llmdeploy.catalog.models import resolve_model
from llmdeploy.errors import UserError

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SECRET = "hf_test_secret_value_not_to_print"


class HubHandler(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, with_body: bool) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        parts = self.path.split("?")[0].strip("/").split("/")
        repo, rev, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        body = json.dumps(CONFIG).encode()
        if repo == "acme/gated" and self.headers.get("authorization") != f"Bearer {SECRET}":
            return self._error(403, "GatedRepo", "Access to model acme/gated is restricted.")
        if repo not in ("acme/tiny-qwen", "acme/gated", "acme/gguf-only"):
            return self._error(401, "RepoNotFound", "Repository not found")
        if rev not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        if repo == "acme/gguf-only" or filename != "config.json":
            return self._error(404, "EntryNotFound", "Entry not found")
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_GET(self) -> None:
        self._answer(with_body=True)


class Hub:
    def __init__(self) -> None:
        HubHandler.requests = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub() -> Iterator[Hub]:
    server = Hub()
    yield server
    server.stop()


def test_fetched_through_the_client_then_answered_from_its_cache(hub: Hub, tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    assert fetch_hub_config("acme/tiny-qwen", endpoint=hub.url, cache_dir=cache) == CONFIG
    assert any(r.startswith("GET /acme/tiny-qwen/resolve/main/config.json") for r in HubHandler.requests)
    # the client's own cache layout, so vLLM and transformers find the same file
    assert (cache / "models--acme--tiny-qwen" / "refs" / "main").read_text() == COMMIT
    hub.stop()
    assert fetch_hub_config("acme/tiny-qwen", endpoint=hub.url, cache_dir=cache) == CONFIG
    assert fetch_hub_config("acme/tiny-qwen", revision=COMMIT, endpoint=hub.url, cache_dir=cache) == CONFIG
    with pytest.raises(UserError) as err:
        fetch_hub_config("acme/other", endpoint=hub.url, cache_dir=cache, timeout_s=1.0)
    text = str(err.value)
    assert "unknown model 'acme/other'" in text and "could not be reached" in text
    assert "model.path" in text and "model.architecture" in text
    assert "HF_ENDPOINT" in text and "HF_TOKEN" in text and "HF_HUB_OFFLINE" in text


def test_missing_gated_revision_and_entry_errors(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hf-cache"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    cases = {
        "acme/missing": "no repository 'acme/missing' on the hub",
        "acme/gated": "is a gated repository",
        "acme/gguf-only": "has no config.json",
    }
    for repo, words in cases.items():
        with pytest.raises(UserError) as err:
            fetch_hub_config(repo, endpoint=hub.url, cache_dir=cache)
        assert words in str(err.value), str(err.value)
    with pytest.raises(UserError) as err:
        fetch_hub_config("acme/tiny-qwen", revision="v9", endpoint=hub.url, cache_dir=cache)
    assert "has no revision 'v9'" in str(err.value) and "model.revision" in str(err.value)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


@pytest.mark.slow
def test_cli_reads_the_hub_environment(hub: Hub, tmp_path: Path) -> None:
    """HF_ENDPOINT, HF_TOKEN, HF_HOME and HF_HUB_OFFLINE as a user sets them, in a fresh process."""
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": SECRET}
    env.pop("HF_HUB_OFFLINE", None)
    shown = _cli(["models", "show", "acme/gated", "--output", "json"], env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["num_params"] == 494_032_768
    denied = _cli(["models", "show", "acme/tiny-qwen-x"], {**env, "HF_TOKEN": "hf_wrong_" + SECRET})
    assert denied.returncode == 2 and "no repository" in denied.stderr
    assert SECRET not in denied.stderr + denied.stdout and "Traceback" not in denied.stderr
    hub.stop()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    again = _cli(["models", "show", "acme/gated", "--output", "json"], offline)
    assert again.returncode == 0, again.stderr
    missing = _cli(["models", "show", "acme/never-fetched"], offline)
    assert missing.returncode == 2
    assert "HF_HUB_OFFLINE is set" in missing.stderr and "model.path" in missing.stderr


def test_resolve_model_goes_to_the_hub_for_namespaced_ids_only(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(UserError) as err:
        resolve_model("not-a-namespaced-id")
    assert "unknown model" in str(err.value)
    assert not HubHandler.requests
    with pytest.raises(UserError) as err:
        resolve_model("acme/missing")
    assert "no repository" in str(err.value)
    assert HubHandler.requests
