"""Hub config lookup against a real local HTTP server (an endpoint laid out like the hub's)."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "hub"
    target = root / "acme" / "tiny-qwen" / "resolve" / "main"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(CONFIG))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_then_cache_then_offline(endpoint: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert fetch_hub_config("acme/tiny-qwen", endpoint=endpoint, cache_dir=cache) == CONFIG
    assert fetch_hub_config("acme/missing", endpoint=endpoint, cache_dir=cache) is None
    # offline: a dead endpoint fails cleanly, the cached file still answers
    dead = "http://127.0.0.1:9"
    assert fetch_hub_config("acme/tiny-qwen", endpoint=dead, cache_dir=cache) == CONFIG
    assert fetch_hub_config("acme/other", endpoint=dead, cache_dir=cache, timeout_s=0.5) is None


def test_resolve_model_uses_the_hub_when_configured(
    endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    with pytest.raises(UserError):
        resolve_model("acme/tiny-qwen")  # no endpoint, nothing cached: unknown
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    spec = resolve_model("acme/tiny-qwen")
    assert spec.source == "hub" and spec.num_params == 494_032_768
