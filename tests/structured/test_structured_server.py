"""The real server on the default model (CPU) with a tool-aware chat template (the model's tokenizer
saved with tool_templates.HERMES_TEMPLATE): structured outputs in every request shape, TGI grammars,
tool calls round-tripping through the real `openai` client, and 400s for bad constraints.

One server for the module; requests run concurrently so constrained and free ones share batches."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator

import httpx
import jsonschema
import openai
import pytest
from engine_server import GGUF, MODEL_NAME, EngineServer, start
from httpx_sse import EventSource
from tool_templates import HERMES_TEMPLATE, tokenizer_folder

pytestmark = pytest.mark.slow
pytest.importorskip("xgrammar")

SCHEMAS: list[dict[str, object]] = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    },
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}
        },
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -9, "maximum": 9},
                    "y": {"type": "integer", "minimum": -9, "maximum": 9},
                },
                "required": ["x", "y"],
            }
        },
        "required": ["point"],
    },
    {
        "type": "object",
        "properties": {"v": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}},
        "required": ["v"],
    },
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
        "required": ["code"],
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4},
]
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER_PARAMS},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["UTC", "CET"]}},
                "required": ["tz"],
            },
        },
    },
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    if not GGUF.is_file():
        pytest.skip(f"default model not installed at {GGUF}")
    folder = tokenizer_folder(GGUF, tmp_path_factory.mktemp("tokenizer"), HERMES_TEMPLATE)
    s = start(
        tmp_path_factory.mktemp("server"),
        "--tokenizer", str(folder), "--max-model-len", "1024", "--kv-cache-memory-bytes", "96M",
        "--max-num-seqs", "16",
    )  # fmt: skip
    yield s
    s.stop()


def client(server: EngineServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def test_json_schema_replies_always_parse_and_validate(server: EngineServer) -> None:
    async def one(
        api: openai.AsyncOpenAI, schema: dict[str, object], strict: bool
    ) -> list[tuple[str, str | None]]:
        r = await api.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Reply with JSON."}],
            temperature=1.0,
            max_tokens=150,
            n=2,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": schema, "strict": strict},
            },
        )
        return [(c.message.content or "", c.finish_reason) for c in r.choices]

    async def free(api: openai.AsyncOpenAI) -> str | None:
        r = await api.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi"}], temperature=1.0, max_tokens=30
        )
        return r.choices[0].message.content

    async def run() -> tuple[list[list[tuple[str, str | None]]], str | None]:
        api = client(server)
        *replies, text = await asyncio.gather(
            *(one(api, s, i % 2 == 0) for i, s in enumerate(SCHEMAS)), free(api)
        )
        return replies, text

    replies, text = asyncio.run(run())
    assert isinstance(text, str)  # the unconstrained request in the same batches
    for schema, choices in zip(SCHEMAS, replies, strict=True):
        for content, finish in choices:
            assert finish == "stop", (schema, content)
            jsonschema.validate(json.loads(content), schema)


def _json_object_prefix(text: str) -> bool:
    """Whether `text` is a start of a JSON object in the engine's compact JSON grammar."""
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(["a"]))
    grammar = compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
    return bool(xgr.GrammarMatcher(grammar, terminate_without_stop_token=True).accept_string(text))


def _json_object(text: str, finish: str) -> None:
    # An open object has no length bound: a sampled one may still be open at max_tokens, and then
    # the constraint held if what came is a start of an object.
    if finish == "length":
        assert _json_object_prefix(text), text
    else:
        assert finish == "stop" and isinstance(json.loads(text), dict), (finish, text)


def test_every_request_shape_is_constrained(server: EngineServer) -> None:
    person = SCHEMAS[1]
    chat: list[tuple[dict[str, object], Callable[[str, str], object]]] = [
        ({"guided_json": person}, lambda t, _: jsonschema.validate(json.loads(t), person)),
        ({"guided_json": json.dumps(person)}, lambda t, _: jsonschema.validate(json.loads(t), person)),
        ({"structured_outputs": {"json": person}}, lambda t, _: jsonschema.validate(json.loads(t), person)),
        ({"response_format": {"type": "json_object"}}, _json_object),
        (
            {"guided_regex": r"[0-9]{3}-[a-z]{2,4}"},
            lambda t, _: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", t) or pytest.fail(t),
        ),
        (
            {"structured_outputs": {"regex": r"(yes|no)!"}},
            lambda t, _: t in ("yes!", "no!") or pytest.fail(t),
        ),
        (
            {"guided_choice": ["alpha", "beta gamma"]},
            lambda t, _: t in ("alpha", "beta gamma") or pytest.fail(t),
        ),
        ({"structured_outputs": {"choice": ["x", "y"]}}, lambda t, _: t in ("x", "y") or pytest.fail(t)),
        (
            {"guided_grammar": 'root ::= "ab" [0-9] | "cd"'},
            lambda t, _: re.fullmatch(r"ab[0-9]|cd", t) or pytest.fail(t),
        ),
    ]

    async def run() -> tuple[list[tuple[str, str]], list[str]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
            chats = [
                http.post(
                    "/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": "Answer."}],
                        "temperature": 1.0,
                        "max_tokens": 80,
                        **extra,
                    },
                )
                for extra, _ in chat
            ]
            completions = [
                http.post(
                    "/v1/completions",
                    json={"prompt": "Pick:", "max_tokens": 10, "guided_choice": ["up", "down"]},
                ),
                http.post(
                    "/v1/completions",
                    json={
                        "prompt": "JSON:",
                        "max_tokens": 80,
                        "temperature": 1.0,
                        "response_format": {
                            "type": "json_schema",
                            "json_schema": {"name": "p", "schema": person},
                        },
                    },
                ),
            ]
            answers = await asyncio.gather(*chats, *completions)
        for r in answers:
            assert r.status_code == 200, r.text
        chat_replies = [
            (r.json()["choices"][0]["message"]["content"], r.json()["choices"][0]["finish_reason"])
            for r in answers[: len(chat)]
        ]
        return chat_replies, [r.json()["choices"][0]["text"] for r in answers[len(chat) :]]

    chat_replies, completion_texts = asyncio.run(run())
    for (_, check), (text, finish) in zip(chat, chat_replies, strict=True):
        check(text, finish)
    assert completion_texts[0] in ("up", "down")
    jsonschema.validate(json.loads(completion_texts[1]), person)


def test_json_object_prefix_check_refuses_text_outside_the_grammar() -> None:
    assert _json_object_prefix('{"a": "b')
    assert not _json_object_prefix('x{"a": 1}')
    assert not _json_object_prefix('{"a" : 1}')  # the compact grammar has no space before a colon
    for text, finish in [('{"a": 1} trailing', "stop"), ('{"a": 1', "stop"), ('x{"a": 1', "length")]:
        with pytest.raises((AssertionError, ValueError)):
            _json_object(text, finish)


def test_tgi_grammar_holds(server: EngineServer) -> None:
    person = SCHEMAS[1]
    r = httpx.post(
        server.url + "/generate",
        json={
            "inputs": "A person:",
            "parameters": {
                "max_new_tokens": 80,
                "do_sample": True,
                "grammar": {"type": "json", "value": person},
            },
        },
        timeout=600,
    )
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["generated_text"]), person)
    r = httpx.post(
        server.url + "/generate",
        json={
            "inputs": "Year:",
            "parameters": {"max_new_tokens": 10, "grammar": {"type": "regex", "value": "(19|20)[0-9]{2}"}},
        },
        timeout=600,
    )
    assert re.fullmatch(r"(19|20)[0-9]{2}", r.json()["generated_text"]), r.text
    with httpx.stream(
        "POST",
        server.url + "/generate_stream",
        json={
            "inputs": "Code:",
            "parameters": {"max_new_tokens": 10, "grammar": {"type": "regex", "value": "[A-F]{3}"}},
        },
        timeout=600,
    ) as s:
        events = [event.json() for event in EventSource(s).iter_sse()]
    assert re.fullmatch(r"[A-F]{3}", events[-1]["generated_text"]), events
    assert "".join(e["token"]["text"] for e in events) == events[-1]["generated_text"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_round_trip_through_the_openai_client(server: EngineServer, stream: bool) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    choice: object = "required" if not stream else {"type": "function", "function": {"name": "get_weather"}}
    first = dict(
        model=MODEL_NAME, messages=messages, tools=TOOLS, tool_choice=choice, temperature=1.0, max_tokens=80
    )
    if stream:
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in api.chat.completions.create(**first, stream=True):  # type: ignore[call-overload]
            for c in chunk.choices:
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] += d.id or ""
                    entry["name"] += (d.function.name or "") if d.function else ""
                    entry["arguments"] += (d.function.arguments or "") if d.function else ""
                finish = c.finish_reason or finish
        assert list(calls) == [0]
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["arguments"]
    else:
        r = api.chat.completions.create(**first)  # type: ignore[call-overload]
        finish = r.choices[0].finish_reason
        tool_calls = r.choices[0].message.tool_calls
        assert tool_calls and len(tool_calls) == 1
        call_id, name, arguments = (
            tool_calls[0].id,
            tool_calls[0].function.name,
            tool_calls[0].function.arguments,
        )
    assert finish == "tool_calls"
    assert call_id.startswith("call_")
    assert name in ("get_weather", "get_time") and (not stream or name == "get_weather")
    if name == "get_weather":
        jsonschema.validate(json.loads(arguments), WEATHER_PARAMS)
    # turn two: the call and its result go back; the model answers
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "4 degrees and rain"},
    ]
    second = dict(model=MODEL_NAME, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=20)
    if stream:
        text = "".join(
            c.delta.content or ""
            for chunk in api.chat.completions.create(**second, stream=True)
            for c in chunk.choices  # type: ignore[call-overload]
        )
    else:
        answer = api.chat.completions.create(**second)  # type: ignore[call-overload]
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert not answer.choices[0].message.tool_calls
        text = answer.choices[0].message.content or ""
    assert text.strip()


def test_streamed_tool_call_chunks_have_openai_shape(server: EngineServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "Time in UTC?"}],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "stream": True,
        "max_tokens": 60,
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=600) as s:
        lines = [event.data for event in EventSource(s).iter_sse()]
    assert lines[-1] == "[DONE]"
    deltas = [json.loads(x)["choices"][0] for x in lines[:-1]]
    tool_deltas = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    head, *rest = tool_deltas
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"] == {"name": "get_time", "arguments": ""}
    assert rest and all(set(t) == {"index", "function"} and set(t["function"]) == {"arguments"} for t in rest)
    assert json.loads("".join(t["function"]["arguments"] for t in rest))["tz"] in ("UTC", "CET")
    assert deltas[-1]["finish_reason"] == "tool_calls" and deltas[-1]["delta"] == {}


@pytest.mark.parametrize(
    ("path", "body", "param", "needle"),
    [
        ("/v1/chat/completions", {"guided_json": {"type": "nonsense"}}, "guided_json", "invalid JSON schema"),
        ("/v1/chat/completions", {"guided_regex": "(("}, "guided_regex", "invalid regex"),
        ("/v1/chat/completions", {"guided_grammar": "root ::= "}, "guided_grammar", "invalid grammar"),
        ("/v1/chat/completions", {"guided_json": "{not json"}, "response_format", "not valid JSON"),
        (
            "/v1/chat/completions",
            {"guided_regex": "a", "guided_choice": ["a"]},
            "response_format",
            "not several",
        ),
        ("/v1/chat/completions", {"guided_choice": []}, "response_format", "at least one"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, None, "json_schema.schema"),
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, None, "response_format"),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"regex": "a", "json": {}}},
            "response_format",
            "exactly one",
        ),
        (
            "/v1/chat/completions",
            {"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"},
            "guided_regex",
            "forced tool call",
        ),
        (
            "/v1/chat/completions",
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            None,
            "not in tools",
        ),
        ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": "sometimes"}, None, "tool_choice"),
        (
            "/v1/chat/completions",
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
                ],
                "tool_choice": "required",
            },
            "tools",
            "parameters schema",
        ),
        ("/v1/completions", {"prompt": "x", "guided_regex": "(("}, "guided_regex", "invalid regex"),
        (
            "/generate",
            {"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "(("}}},
            "grammar",
            "invalid regex",
        ),
        (
            "/generate",
            {"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": {"a": 1}}}},
            "grammar",
            "string",
        ),
        (
            "/generate",
            {"inputs": "x", "parameters": {"grammar": {"type": "lark", "value": "x"}}},
            None,
            "grammar",
        ),
    ],
)
def test_bad_constraints_are_400s(
    server: EngineServer, path: str, body: dict[str, object], param: str | None, needle: str
) -> None:
    if path.startswith("/v1/chat"):
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"], error
    if param is not None:
        assert error["param"] == param
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
