"""Bad requests against a real engine server: always a 4xx in OpenAI's error shape, never a 500.

After every case the server still answers /health and a normal request.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from engine_server import MODEL_NAME, EngineServer

from hardening.conftest import MAX_MODEL_LEN
from hardening.figures import record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": USER, "max_tokens": 2, **fields}


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, **fields}


def _nested(path: str, depth: int) -> bytes:
    base = _chat() if path == CHAT else _completion() if path == COMPLETIONS else {"inputs": "hi"}
    return (json.dumps(base)[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}").encode()


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}


# (name, path, body: dict/list/str for JSON or bytes as is)
CASES: list[tuple[str, str, Any]] = [
    ("truncated JSON", CHAT, b'{"model": "smollm2", "messages": ['),
    ("JSON array body", CHAT, [1, 2]),
    ("JSON string body", COMPLETIONS, "prompt"),
    ("JSON null body", CHAT, None),
    ("empty body", CHAT, b""),
    ("non-UTF-8 body", CHAT, b'{"model": "\xff\xfe\xfd", "messages": []}'),
    ("UTF-16 body", COMPLETIONS, json.dumps(_completion()).encode("utf-16")),
    ("NaN literal", COMPLETIONS, b'{"model": "smollm2", "prompt": "x", "temperature": NaN}'),
    ("max_tokens as text", CHAT, _chat(max_tokens="ten")),
    ("messages as text", CHAT, _chat(messages="hi")),
    ("temperature as text", CHAT, _chat(temperature="hot")),
    ("stream as text", CHAT, _chat(stream="maybe")),
    ("stop as number", CHAT, _chat(stop=5)),
    ("negative max_tokens", CHAT, _chat(max_tokens=-1)),
    ("zero max_tokens", COMPLETIONS, _completion(max_tokens=0)),
    ("huge max_tokens", CHAT, _chat(max_tokens=10**12)),
    ("max_tokens past int64", COMPLETIONS, _completion(max_tokens=2**70)),
    ("max_tokens as float", COMPLETIONS, _completion(max_tokens=1e308)),
    ("empty messages", CHAT, _chat(messages=[])),
    ("message without role", CHAT, _chat(messages=[{"content": "hi"}])),
    ("unknown role", CHAT, _chat(messages=[{"role": "wizard", "content": "hi"}])),
    ("content as object", CHAT, _chat(messages=[{"role": "user", "content": {"a": 1}}])),
    ("content part of unknown type", CHAT, _chat(messages=[{"role": "user", "content": [{"type": "x"}]}])),
    ("prompt past max_model_len", COMPLETIONS, _completion(prompt="word " * (8 * MAX_MODEL_LEN))),
    (
        "chat past max_model_len",
        CHAT,
        _chat(messages=[{"role": "user", "content": "word " * (8 * MAX_MODEL_LEN)}]),
    ),
    ("prompt + max_tokens past max_model_len", COMPLETIONS, _completion(max_tokens=MAX_MODEL_LEN)),
    ("unknown model", CHAT, _chat(model="gpt-9")),
    ("model as number", CHAT, _chat(model=7)),
    ("huge n", COMPLETIONS, _completion(n=10**6)),
    ("zero n", COMPLETIONS, _completion(n=0)),
    ("negative n", CHAT, _chat(n=-3)),
    ("negative temperature", CHAT, _chat(temperature=-1)),
    ("top_p above 1", CHAT, _chat(top_p=2)),
    ("negative top_k", COMPLETIONS, _completion(top_k=-5)),
    ("huge seed", COMPLETIONS, _completion(seed=2**70)),
    ("token ids out of vocabulary", COMPLETIONS, _completion(prompt=[10**9])),
    ("negative token id", COMPLETIONS, _completion(prompt=[-1, 2])),
    ("empty prompt", COMPLETIONS, _completion(prompt="")),
    ("empty token list", COMPLETIONS, _completion(prompt=[])),
    ("logprobs out of range", COMPLETIONS, _completion(logprobs=10**6)),
    ("top_logprobs out of range", CHAT, _chat(logprobs=True, top_logprobs=10**6)),
    ("logit_bias with text keys", COMPLETIONS, _completion(logit_bias={"abc": 1})),
    ("unknown field only", CHAT, {"foo": "bar"}),
    ("TGI inputs missing", "/generate", {"parameters": {"max_new_tokens": 2}}),
    ("TGI negative max_new_tokens", "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": -1}}),
    (
        "TGI huge max_new_tokens",
        "/generate_stream",
        {"inputs": "hi", "parameters": {"max_new_tokens": 10**9}},
    ),
    ("TGI temperature 0", "/", {"inputs": "hi", "parameters": {"temperature": 0, "max_new_tokens": 2}}),
    ("TGI inputs past max_model_len", "/generate", {"inputs": "word " * (8 * MAX_MODEL_LEN)}),
    *(
        (f"JSON nested {depth} levels on {path}", path, _nested(path, depth))
        for depth in (65, 990, 20_000)
        for path in (CHAT, COMPLETIONS, "/generate", "/generate_stream")
    ),
    ("lone surrogate in an unknown key", CHAT, _chat(**{"\ud800": 1})),
    ("lone surrogate in a nested key", COMPLETIONS, _completion(extra={"a": [{"\udfff": 1}]})),
    (
        "lone surrogate in a schema property name",
        CHAT,
        _chat(
            response_format=_schema_format({"type": "object", "properties": {"\udbff": {"type": "string"}}})
        ),
    ),
    ("lone surrogate in a guided_json key", COMPLETIONS, _completion(guided_json={"\ud800x": {}})),
    ("lone surrogate in a TGI key", "/generate", {"inputs": "hi", "parameters": {"\udc00": 1}}),
]

# cases where a 2xx is also a fine answer (the server may clamp or accept the value)
MAY_SUCCEED = {
    "huge seed",
    "UTF-16 body",
    "logit_bias with text keys",
    "unknown field only",
    "TGI temperature 0",
    "empty prompt",
    "TGI huge max_new_tokens",
    "prompt + max_tokens past max_model_len",
    "content part of unknown type",
    "negative top_k",
    "huge max_tokens",
}


def _send(
    server: EngineServer, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    merged = {"Content-Type": "application/json", **server.headers(), **(headers or {})}
    return httpx.post(server.url + path, content=data, headers=merged, timeout=120)


def assert_openai_error(response: httpx.Response) -> None:
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "param" in error and "code" in error


def check_still_serving(server: EngineServer) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    ok = _send(server, COMPLETIONS, _completion(max_tokens=1))
    assert ok.status_code == 200, ok.text


def _classify(status: int) -> str:
    return f"HTTP {status // 100}xx" if status != 413 else "HTTP 413"


@pytest.mark.parametrize("name,path,body", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_a_4xx_in_openai_shape(
    engine_server: EngineServer, name: str, path: str, body: Any
) -> None:
    response = _send(engine_server, path, body)
    record("hand-written bad requests sent", 1)
    record(f"hand-written bad requests answered {_classify(response.status_code)}", 1)
    assert response.status_code < 500, f"{name}: {response.status_code} {response.text[:300]}"
    if name not in MAY_SUCCEED:
        assert 400 <= response.status_code < 500, f"{name}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400 and path.startswith("/v1"):
        assert_openai_error(response)
    elif response.status_code >= 400:  # TGI routes answer TGI's error shape
        assert "error" in response.json()
    check_still_serving(engine_server)


@pytest.mark.parametrize("headers,expected", [
    ({"Authorization": ""}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": "Basic eDp5"}, 401),
    ({"Content-Type": "text/plain"}, None), ({"Content-Type": "application/x-www-form-urlencoded"}, None),
])  # fmt: skip
def test_headers(engine_server: EngineServer, headers: dict[str, str], expected: int | None) -> None:
    response = _send(engine_server, CHAT, _chat(), headers)
    record("hand-written bad requests sent", 1)
    record(f"hand-written bad requests answered {_classify(response.status_code)}", 1)
    assert response.status_code < 500
    if expected is not None:
        assert response.status_code == expected
        assert_openai_error(response)
    check_still_serving(engine_server)


def test_unknown_route_and_method(engine_server: EngineServer) -> None:
    for response in (
        httpx.get(engine_server.url + "/v1/nope", headers=engine_server.headers()),
        httpx.get(engine_server.url + CHAT, headers=engine_server.headers()),
        httpx.delete(engine_server.url + "/v1/models", headers=engine_server.headers()),
    ):
        record("hand-written bad requests sent", 1)
        record(f"hand-written bad requests answered {_classify(response.status_code)}", 1)
        assert response.status_code in (404, 405)
        assert_openai_error(response)


def test_oversized_bodies_are_413(engine_server: EngineServer) -> None:
    big = b'{"model": "smollm2", "prompt": "' + b"a" * (20 * 1024 * 1024) + b'"}'
    declared = _send(engine_server, COMPLETIONS, big)

    def chunks() -> Any:
        for start in range(0, len(big), 1024 * 1024):
            yield big[start : start + 1024 * 1024]

    chunked = httpx.post(
        engine_server.url + COMPLETIONS,
        content=chunks(),
        timeout=120,
        headers={"Content-Type": "application/json", **engine_server.headers()},
    )
    for response in (declared, chunked):
        record("hand-written bad requests sent", 1)
        record(f"hand-written bad requests answered {_classify(response.status_code)}", 1)
        assert response.status_code == 413, response.text[:300]
        assert_openai_error(response)
    check_still_serving(engine_server)
