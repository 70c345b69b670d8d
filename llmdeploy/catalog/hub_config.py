"""`config.json` of a hub model, fetched once and cached, for models the catalog lacks.

Opt-in: only when a hub endpoint is configured (`HF_ENDPOINT`, the variable the Hugging Face tools
read) does anything go to the network, with a short timeout; any failure means "not found" and the
caller reports the unknown model. Cached files are used offline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TIMEOUT_S = 3.0


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmdeploy" / "hub-configs"


def _cache_file(cache_dir: Path, hf_id: str, revision: str) -> Path:
    return cache_dir / hf_id.replace("/", "--") / revision / "config.json"


def fetch_hub_config(
    hf_id: str,
    revision: str | None = None,
    endpoint: str | None = None,
    cache_dir: Path | None = None,
    timeout_s: float = TIMEOUT_S,
) -> dict[str, Any] | None:
    """The model's config.json from the cache, else from the endpoint (then cached), else None."""
    rev = revision or "main"
    cache = _cache_file(cache_dir or default_cache_dir(), hf_id, rev)
    try:
        if cache.is_file():
            data = json.loads(cache.read_text())
            return data if isinstance(data, dict) else None
    except (OSError, ValueError):  # a name too long for a path, an unreadable or broken cache file
        pass
    endpoint = endpoint or os.environ.get("HF_ENDPOINT")
    if not endpoint or "/" not in hf_id:
        return None
    import httpx

    headers = {}
    token = os.environ.get("HF_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{endpoint.rstrip('/')}/{hf_id}/resolve/{rev}/config.json"
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s, follow_redirects=True)
        if response.status_code != 200:
            return None
        data = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data))
    except OSError:
        pass  # a read-only cache only costs a refetch
    return data
