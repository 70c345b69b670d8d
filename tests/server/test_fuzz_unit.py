"""Random request bodies never crash the HTTP layer: every answer is a success or a 4xx in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmdeploy_engine.server.app import build_app
from llmdeploy_engine.server.state import ServerSettings

from tests.server.fake_engine import FakeEngine, QueueFull

CLIENT = TestClient(
    build_app(
        ServerSettings(
            served_model_names=("m",), model_path="m", max_num_seqs=4, queue_full_errors=(QueueFull,)
        ),
        engine=FakeEngine(max_model_len=64),
    ),
    raise_server_exceptions=False,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
small_ints = st.integers(min_value=-3, max_value=40)

OPENAI_FIELDS = {
    "model": st.sampled_from(["m", "x", None]),
    "prompt": st.one_of(
        st.text(max_size=30),
        st.lists(st.integers(-5, 600), max_size=10),
        st.lists(st.lists(st.integers(0, 300), max_size=5), max_size=3),
        values,
    ),
    "max_tokens": st.one_of(small_ints, values),
    "max_completion_tokens": st.one_of(small_ints, values),
    "temperature": st.one_of(st.floats(-1, 3), values),
    "top_p": st.one_of(st.floats(-1, 2), values),
    "top_k": st.one_of(small_ints, values),
    "min_p": st.one_of(st.floats(-1, 2), values),
    "n": st.one_of(small_ints, values),
    "stream": st.one_of(st.booleans(), values),
    "stream_options": st.one_of(st.just({"include_usage": True}), values),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=20), values),
    "seed": st.one_of(st.integers(-(2**65), 2**65), values),
    "logprobs": st.one_of(small_ints, st.booleans(), values),
    "top_logprobs": st.one_of(small_ints, values),
    "echo": st.one_of(st.booleans(), values),
    "presence_penalty": st.one_of(st.floats(-3, 3), values),
    "repetition_penalty": st.one_of(st.floats(-1, 3), values),
    "stop_token_ids": st.one_of(st.lists(st.integers(-2, 2**40), max_size=3), values),
    "min_tokens": st.one_of(small_ints, values),
    "ignore_eos": st.one_of(st.booleans(), values),
    "messages": st.one_of(
        st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "system", "assistant", "bot"]),
                    "content": st.one_of(st.text(max_size=30), values),
                }
            ),
            max_size=3,
        ),
        values,
    ),
}
TGI_PARAMS = {
    "max_new_tokens": st.one_of(small_ints, values),
    "temperature": st.one_of(st.floats(-1, 3), values),
    "top_p": st.one_of(st.floats(-1, 2), values),
    "top_k": st.one_of(small_ints, values),
    "do_sample": st.one_of(st.booleans(), values),
    "details": st.one_of(st.booleans(), values),
    "stop": st.one_of(st.lists(st.text(max_size=3), max_size=3), values),
    "truncate": st.one_of(small_ints, values),
    "top_n_tokens": st.one_of(small_ints, values),
    "return_full_text": st.one_of(st.booleans(), values),
    "seed": st.one_of(st.integers(-5, 2**65), values),
}


def check(r: Any) -> None:
    assert r.status_code in (200, 400, 404), (r.status_code, r.text)
    if r.status_code != 200:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert "internal server error" not in r.text


def body_from(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]), body=body_from(OPENAI_FIELDS))
@pytest.mark.slow
def test_openai_routes_survive_random_bodies(path: str, body: dict[str, Any]) -> None:
    check(CLIENT.post(path, json=body))


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(["/", "/generate", "/generate_stream"]),
    inputs=st.one_of(st.text(max_size=40), values),
    params=st.one_of(body_from(TGI_PARAMS), values),
    stream=st.one_of(st.booleans(), values),
)
@pytest.mark.slow
def test_tgi_routes_survive_random_bodies(path: str, inputs: Any, params: Any, stream: Any) -> None:
    check(CLIENT.post(path, json={"inputs": inputs, "parameters": params, "stream": stream}))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=60))
def test_garbage_bodies_are_400(raw: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        r = CLIENT.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code in (200, 400), (path, raw, r.text)
