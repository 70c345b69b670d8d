"""The cheap checks come before any grammar compiles (issue 48): a request whose prompt cannot fit
max_model_len is a 400 at once, without asking for the grammar compiler, on every generation route
and for every kind of constraint (json_schema, forced tool calls, TGI grammars)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from llmdeploy_engine.server.app import build_app
from llmdeploy_engine.server.state import ServerSettings

from tests.server.fake_engine import FakeEngine, FakeTokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]
TOO_LONG = "x" * 400  # the fake engine's max_model_len is 256 (one token per character)


class ToolTokenizer(FakeTokenizer):
    chat_template = "{% for t in tools %}{{ t }}{% endfor %}<tool_call>"

    def apply_chat_template(  # type: ignore[override]
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        return super().apply_chat_template(messages, add_generation_prompt) + str(extra.get("tools", ""))


class CountingEngine(FakeEngine):
    """A fake engine whose grammar compiler is missing (a 400 naming xgrammar) and counts each ask."""

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = ToolTokenizer()
        self.compiler_asked = 0

    def grammar_compiler(self) -> Any:
        self.compiler_asked += 1
        raise ImportError("no grammar compiler in this test")


def _chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}


def _json_schema() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}


CASES = [
    ("/v1/chat/completions", _chat(TOO_LONG, tools=TOOLS, tool_choice="required"), "messages"),
    (
        "/v1/chat/completions",
        _chat(TOO_LONG, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "lookup"}}),
        "messages",
    ),
    ("/v1/chat/completions", _chat(TOO_LONG, response_format=_json_schema()), "messages"),
    ("/v1/completions", {"prompt": TOO_LONG, "max_tokens": 4, "response_format": _json_schema()}, "prompt"),
    ("/v1/completions", {"prompt": TOO_LONG, "max_tokens": 4, "guided_regex": "[a-z]+"}, "prompt"),
    ("/generate", {"inputs": TOO_LONG, "parameters": {"max_new_tokens": 4, "grammar": {"type": "json", "value": SCHEMA}}}, "inputs"),
]  # fmt: skip


@pytest.fixture
def engine() -> CountingEngine:
    return CountingEngine()


@pytest.fixture
def client(engine: CountingEngine) -> TestClient:
    settings = ServerSettings(
        served_model_names=("fake-model",), model_path="/models/fake.gguf", max_num_seqs=8
    )
    return TestClient(build_app(settings, engine=engine), raise_server_exceptions=False)


@pytest.mark.parametrize(("path", "body", "param"), CASES)
def test_a_prompt_that_does_not_fit_is_refused_before_any_compile(
    client: TestClient, engine: CountingEngine, path: str, body: dict[str, Any], param: str
) -> None:
    with client:
        r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert "context length" in error["message"] or "tokens" in error["message"], error
    assert engine.compiler_asked == 0


@pytest.mark.parametrize(("path", "body", "param"), CASES)
def test_a_prompt_that_fits_goes_on_to_compile(
    client: TestClient, engine: CountingEngine, path: str, body: dict[str, Any], param: str
) -> None:
    fitting = {k: v for k, v in body.items()}
    for key in ("prompt", "inputs"):
        if key in fitting:
            fitting[key] = "hi"
    if "messages" in fitting:
        fitting["messages"] = [{"role": "user", "content": "hi"}]
    with client:
        r = client.post(path, json=fitting)
    assert r.status_code == 400, r.text
    assert "xgrammar" in r.json()["error"]["message"], r.text
    assert engine.compiler_asked == 1
