"""Request bodies against a fake engine: JSON nested past the limit and lone surrogates in object keys
are a 400 in OpenAI's shape (issue 48, items 3 and 5), and with an API key a request without it is
refused before one byte of its body is read (item 4)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from llmdeploy_engine.server.app import build_app
from llmdeploy_engine.server.request_body import MAX_JSON_DEPTH
from llmdeploy_engine.server.state import ServerSettings

from tests.server.fake_engine import FakeEngine
from tests.server.test_app_unit import MODEL, make_client

ROUTES = ["/v1/completions", "/v1/chat/completions", "/generate", "/generate_stream", "/"]


def _valid(path: str) -> dict[str, Any]:
    if path == "/v1/completions":
        return {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    if path == "/v1/chat/completions":
        return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return {"inputs": "hi", "parameters": {"max_new_tokens": 2}}


def _assert_400(r: Any) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    return dict(error)


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 990, 5000, 100_000])
def test_deep_json_is_400(path: str, depth: int) -> None:
    deep = "[" * depth + "]" * depth
    raw = json.dumps(_valid(path))[:-1] + f', "extra": {deep}}}'
    client = make_client(FakeEngine())
    error = _assert_400(client.post(path, content=raw, headers={"content-type": "application/json"}))
    assert f"deeper than {MAX_JSON_DEPTH} levels" in error["message"]


def test_nesting_within_the_limit_is_served() -> None:
    depth = MAX_JSON_DEPTH - 4  # the body's own object and the field count as levels too
    body = {**_valid("/v1/completions"), "extra": json.loads("[" * depth + "]" * depth)}
    assert make_client(FakeEngine()).post("/v1/completions", json=body).status_code == 200


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    "fragment",
    [
        '"\\ud800": 1',  # an unknown field
        '"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
        '{"type": "object", "properties": {"\\udfff": {"type": "string"}}}}}',  # a schema's property name
        '"\\udbff\\udbff": {"\\ud800": [1]}',
    ],
)
def test_lone_surrogate_in_a_key_is_400(path: str, fragment: str) -> None:
    raw = json.dumps(_valid(path))[:-1] + ", " + fragment + "}"
    client = make_client(FakeEngine())
    r = client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    if path.startswith("/v1"):
        error = _assert_400(r)
        assert "surrogate" in error["message"] and "\\ud" in error["message"]
    else:
        assert r.status_code == 400 and "surrogate" in r.text, r.text


def _asgi_post(app: Any, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """(status, body messages the app asked for) for a chunked POST whose body never ends."""
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        if reads > 1000:
            await asyncio.sleep(3600)  # the client stalls
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"transfer-encoding", b"chunked"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    return int(sent[0]["status"]), reads


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate", "/v1/models"])
def test_without_the_key_no_body_byte_is_read(path: str) -> None:
    settings = ServerSettings(served_model_names=(MODEL,), model_path="/m.gguf", api_key="sk-unit")
    app = build_app(settings, engine=FakeEngine())
    status, reads = _asgi_post(app, path, [(b"authorization", b"Bearer wrong")])
    assert (status, reads) == (401, 0)
    status, reads = _asgi_post(app, path, [])
    assert (status, reads) == (401, 0)
    # with the key, the body is read (and refused at the size limit: it never ends)
    status, reads = _asgi_post(app, path, [(b"authorization", b"Bearer sk-unit")])
    assert reads > 0 and status in (405, 413), status
