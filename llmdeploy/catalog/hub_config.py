"""`config.json` of a hub model the catalog lacks, through `huggingface_hub` and its cache.

`huggingface_hub` owns the protocol, authentication (`HF_TOKEN` or a stored login), the endpoint
(`HF_ENDPOINT`), offline mode (`HF_HUB_OFFLINE`) and the cache (`HF_HOME` / `HF_HUB_CACHE`), so a
config fetched here is the one vLLM and transformers would read later. A cached config answers
without any network call (planning runs often and config.json of a revision rarely changes); a
miss asks the hub once, with a short timeout and no retries, and every failure becomes a
`UserError` that says how to give the config locally. Imported only on that path: the library
costs most of a second to import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llmdeploy.errors import UserError

TIMEOUT_S = 5.0

_LOCAL_FIX = (
    "set model.path (`plan --model FOLDER`) to a folder holding the model's config.json (a downloaded "
    "checkpoint, or just its config.json), or model.architecture to a catalog name (`llmdeploy models list`)"
)
_ENV_HINT = (
    "HF_ENDPOINT selects the hub endpoint, HF_TOKEN authenticates, HF_HUB_OFFLINE=1 uses the cache "
    "only, HF_HOME / HF_HUB_CACHE move the cache"
)


# One answer per process and question: validation, planning and the engine checks each resolve
# the recipe's model, and a failed lookup should cost one request, not three.
_ANSWERS: dict[tuple[str, str | None, str | None, str | None], dict[str, Any] | UserError] = {}


def fetch_hub_config(
    hf_id: str,
    revision: str | None = None,
    endpoint: str | None = None,
    cache_dir: Path | None = None,
    timeout_s: float = TIMEOUT_S,
) -> dict[str, Any]:
    """The model's config.json: from the hub cache, else from the hub (then cached), else a UserError."""
    key = (hf_id, revision, endpoint or os.environ.get("HF_ENDPOINT"), str(cache_dir) if cache_dir else None)
    if key not in _ANSWERS:
        try:
            _ANSWERS[key] = _fetch(hf_id, revision, endpoint, cache_dir, timeout_s)
        except UserError as exc:
            _ANSWERS[key] = exc
    answer = _ANSWERS[key]
    if isinstance(answer, UserError):
        raise answer
    return dict(answer)


def _fetch(
    hf_id: str, revision: str | None, endpoint: str | None, cache_dir: Path | None, timeout_s: float
) -> dict[str, Any]:
    from huggingface_hub import (
        constants,
        get_hf_file_metadata,
        hf_hub_download,
        hf_hub_url,
        try_to_load_from_cache,
    )
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    where = f"{hf_id!r}" + (f" at revision {rev!r}" if revision else "")
    # read at call time: huggingface_hub's constants hold the environment of its import
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    try:
        cached = try_to_load_from_cache(hf_id, "config.json", cache_dir=cache_dir, revision=rev)
    except HFValidationError as exc:
        raise _unknown(hf_id, f"{hf_id!r} is not a hub repository id ({exc})", fix=_LOCAL_FIX) from None
    if isinstance(cached, str):
        return _read(Path(cached), hf_id)
    offline = constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").lower() in (
        "1",
        "true",
        "yes",
        "on",
    )
    if offline:
        raise _unknown(
            hf_id,
            f"config.json of {where} is not in the hub cache and HF_HUB_OFFLINE is set",
            fix=f"run once online to cache it, or {_LOCAL_FIX}; {_ENV_HINT}",
        )
    try:
        # One HEAD without retries first: huggingface_hub retries a failed connection for ~20 s
        # before giving up, too long for an answer that only says "offline".
        url = hf_hub_url(hf_id, "config.json", revision=rev, endpoint=endpoint)
        get_hf_file_metadata(url, timeout=timeout_s, endpoint=endpoint)
        path = hf_hub_download(
            hf_id,
            "config.json",
            revision=rev,
            endpoint=endpoint,
            cache_dir=cache_dir,
            etag_timeout=timeout_s,
        )
    except GatedRepoError:
        raise _unknown(
            hf_id,
            f"{where} is a gated repository and this token has no access to it",
            fix=f"accept its terms on the hub with your account and set HF_TOKEN (or run `hf auth login`), or {_LOCAL_FIX}",
        ) from None
    except RepositoryNotFoundError:
        raise _unknown(
            hf_id,
            f"no repository {hf_id!r} on the hub (or it is private and this token cannot see it)",
            fix=f"check the id; for a private repository set HF_TOKEN; or {_LOCAL_FIX}",
        ) from None
    except RevisionNotFoundError:
        raise _unknown(
            hf_id,
            f"repository {hf_id!r} has no revision {rev!r}",
            fix="set model.revision to an existing branch, tag or commit",
        ) from None
    except RemoteEntryNotFoundError:
        raise _unknown(
            hf_id,
            f"repository {where} has no config.json (a GGUF-only or adapter repository?)",
            fix=f"{_LOCAL_FIX}; a GGUF file works as model.path",
        ) from None
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise _unreachable(hf_id, where, exc) from None
    except _transport_errors() as exc:
        raise _unreachable(hf_id, where, exc) from None
    assert isinstance(path, str)
    return _read(Path(path), hf_id)


def _unreachable(hf_id: str, where: str, exc: BaseException) -> UserError:
    return _unknown(
        hf_id,
        f"config.json of {where} is not in the hub cache and the hub could not be reached ({_reason(exc)})",
        fix=f"{_LOCAL_FIX}; {_ENV_HINT}",
    )


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection and timeout errors of the HTTP library this huggingface_hub release uses."""
    errors: list[type[Exception]] = []
    for name in ("httpx2", "httpx"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        errors.append(module.TransportError)
    return tuple(errors)


def _reason(exc: BaseException) -> str:
    """The first line of the error, or of its cause (a connection error's own words)."""
    inner = exc.__cause__ or exc.__context__ or exc
    text = str(inner).strip().splitlines() or [type(inner).__name__]
    return text[0][:200]


def _read(path: Path, hf_id: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _unknown(
            hf_id,
            f"the cached config.json of {hf_id!r} ({path}) cannot be read: {exc}",
            fix="delete that file so it is fetched again",
        ) from None
    if not isinstance(data, dict):
        raise _unknown(hf_id, f"config.json of {hf_id!r} ({path}) is not a JSON object", fix=_LOCAL_FIX)
    return data


def _unknown(hf_id: str, why: str, fix: str) -> UserError:
    return UserError.one(
        f"unknown model {hf_id!r}: not in the catalog; {why}", path="model.id", value=hf_id, fix=fix
    )
