"""Malformed JSON bodies get a 400 whose `param` is null and whose message says where the JSON
breaks (issue 29, item 13: `param` used to carry FastAPI's character offset, e.g. "81")."""

from __future__ import annotations

import json

import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.test_app_unit import make_client

BODIES = [
    b'{"model": "fake-model", "prompt": "hi",, "max_tokens": 2}',
    b'{"model": "fake-model", "messages": [',
    b"{'model': 'fake-model'}",
]


def _offset(body: bytes) -> int:
    try:
        json.loads(body)
    except json.JSONDecodeError as e:
        return e.pos
    raise AssertionError("the body is valid JSON")


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_malformed_json_names_the_position_not_a_param(body: bytes, path: str) -> None:
    client = make_client(FakeEngine())
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] is None
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value"
    assert "not valid JSON" in error["message"] and f"(char {_offset(body)})" in error["message"]


def test_a_bad_field_still_names_its_param() -> None:
    client = make_client(FakeEngine())
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
