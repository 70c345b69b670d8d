"""The tool-call parser: whole replies and the same replies streamed in pieces give the same calls."""

from __future__ import annotations

import json

import pytest
from llmdeploy_engine.server.tool_parser import ToolCallParser, parse_tool_calls


def streamed(fmt: str, text: str, step: int) -> tuple[str, list[dict[str, str]]]:
    """Feed `text` `step` characters at a time; rebuild content and calls from the deltas the way an
    OpenAI client does (name from the first delta of an index, arguments concatenated)."""
    parser = ToolCallParser(fmt)
    pieces = []
    for i in range(0, len(text), step):
        pieces += parser.feed(text[i : i + step])
    pieces += parser.finish()
    content = ""
    calls: dict[int, dict[str, str]] = {}
    for p in pieces:
        if p.content is not None:
            content += p.content
            continue
        assert p.index is not None
        if p.id is not None:
            assert p.index not in calls, "a call started twice"
            assert p.name and p.arguments == ""
            calls[p.index] = {"id": p.id, "name": p.name, "arguments": ""}
        else:
            assert p.index in calls, "arguments before the call's name"
            calls[p.index]["arguments"] += p.arguments or ""
    return content, [calls[i] for i in sorted(calls)]


CASES = [
    # (format, reply, expected content, expected [(name, arguments)])
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>',
        None,
        [("get_weather", {"city": "Paris", "days": [1, 2]})],
    ),
    (
        "hermes",
        'Let me look.\n<tool_call>\n{"name": "a", "arguments": {"s": "x}\\"{"}}\n</tool_call>\n'
        '<tool_call>{"name":"b","arguments":{}}</tool_call>',
        "Let me look.",
        [("a", {"s": 'x}"{'}), ("b", {})],
    ),
    (
        "hermes",
        "No tools needed: 1 < 2 and <tool is not a tag.",
        "No tools needed: 1 < 2 and <tool is not a tag.",
        [],
    ),
    (
        "hermes",
        '<tool_call>\n{"arguments": {"x": 1}, "name": "late_name"}\n</tool_call>',
        None,
        [("late_name", {"x": 1})],
    ),
    ("hermes", "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ("llama3_json", '{"name": "get_time", "parameters": {"tz": "UTC"}}', None, [("get_time", {"tz": "UTC"})]),
    (
        "llama3_json",
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}',
        None,
        [("f", {"a": 1}), ("g", {})],
    ),
    ("llama3_json", "The answer is {42}.", "The answer is {42}.", []),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
]


@pytest.mark.parametrize(("fmt", "reply", "content", "calls"), CASES)
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_streamed_and_whole_replies_give_the_same_calls(
    fmt: str, reply: str, content: str | None, calls: list[tuple[str, object]], step: int
) -> None:
    whole_content, whole_calls = parse_tool_calls(fmt, reply)
    assert whole_content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole_calls] == calls
    assert all(c.id.startswith("call_") for c in whole_calls)
    stream_content, stream_calls = streamed(fmt, reply, step)
    assert [(c["name"], json.loads(c["arguments"])) for c in stream_calls] == calls
    if calls:
        assert stream_content.strip() == (content or "")
    else:
        assert stream_content == reply if fmt == "llama3_json" else stream_content == (content or "")


def test_arguments_stream_as_they_grow() -> None:
    parser = ToolCallParser("hermes")
    out = parser.feed('<tool_call>\n{"name": "f", "arguments": {"city": "Pa')
    assert [(p.name, p.arguments) for p in out] == [("f", ""), (None, '{"city": "Pa')]
    out = parser.feed('ris"}}\n</tool_call>')
    assert [p.arguments for p in out] == ['ris"}']
    assert parser.finish() == []


def test_a_reply_cut_inside_a_call_keeps_what_came() -> None:
    content, calls = parse_tool_calls("hermes", '<tool_call>\n{"name": "f", "arguments": {"q": "ab')
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"q": "ab')]
