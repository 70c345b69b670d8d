"""The model's reply -> OpenAI tool calls, incrementally (streamed deltas) or at once.

Two formats (`FORMATS`), named as vLLM's `--tool-call-parser` names them:
- `hermes` (Hermes 2 Pro, Qwen2.5, Qwen3 and the templates written after them): each call is
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, with text before it as the content;
- `llama3_json` (Llama 3.1 / 3.2 JSON tool calling): the reply is one JSON object
  `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`; several joined by `;`).

Our own small parser: the tool-call parsers that exist live inside vLLM and SGLang (not libraries
one can import without the engine), and transformers parses nothing incrementally. It reads the
stream once: text that cannot start a call goes out as content at once; inside a call the function
name is sent as soon as it is complete and the arguments' JSON text is sent as it grows (the chunk
shape OpenAI streams: id, type and name first, then `arguments` fragments). A call that does not
have the `{"name": ..., "arguments"|"parameters": ...}` shape is handed back as content at the end.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

import regex

FORMATS = ("hermes", "llama3_json")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"

# `{"name": "<name>", "arguments": ` (or "parameters"), possibly still incomplete (partial matches)
_HEAD = regex.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass
class ToolCallDelta:
    """A piece of the reply: content text, or a call's start (id + name) or an arguments fragment."""

    content: str | None = None
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class _Call:
    raw: str = ""  # text of the call since its start
    head_end: int | None = None  # where its arguments value starts, once the head matched
    scanned: int = 0  # chars of the arguments value scanned (and sent)
    depth: int = 0
    in_string: bool = False
    escape: bool = False
    value_done: bool = False
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    name: str | None = None
    arguments: str = ""


class ToolCallParser:
    """Feed the reply's text as it grows (`feed`), then `finish`; both return the new deltas."""

    def __init__(self, fmt: str) -> None:
        assert fmt in FORMATS, fmt
        self.fmt = fmt
        self.pending = ""  # text not yet handed out
        self.call: _Call | None = None
        self.calls: list[_Call] = []  # completed or started calls, in order
        self.content = ""
        self._seen_text = False  # llama3_json: the reply started with text (so it is no call)

    # ---- driving ----------------------------------------------------------------------------
    def feed(self, text: str) -> list[ToolCallDelta]:
        self.pending += text
        out: list[ToolCallDelta] = []
        while True:
            before = (len(self.pending), self.call is not None)
            if self.call is None:
                self._text_step(out)
            else:
                self._call_step(out)
            if (len(self.pending), self.call is not None) == before:
                return out

    def finish(self) -> list[ToolCallDelta]:
        out = self.feed("")
        call, self.call = self.call, None
        if call is not None:
            call.raw += self.pending
            self.pending = ""
            if call.head_end is None:
                self._rescue(call, out)
        if self.pending:
            self._content(self.pending, out)
            self.pending = ""
        return out

    @property
    def tool_calls(self) -> list[ParsedCall]:
        """The calls whose head was read (name known), arguments as sent (JSON text)."""
        return [ParsedCall(c.id, c.name, c.arguments) for c in self.calls if c.name is not None]

    # ---- states -------------------------------------------------------------------------------
    def _text_step(self, out: list[ToolCallDelta]) -> None:
        if self.fmt == "hermes":
            at = self.pending.find(HERMES_OPEN)
            if at >= 0:
                self._content(self.pending[:at], out)
                self.pending = self.pending[at + len(HERMES_OPEN) :]
                self.call = _Call()
                return
            keep = _prefix_overlap(self.pending, HERMES_OPEN)
            self._content(self.pending[: len(self.pending) - keep], out)
            self.pending = self.pending[len(self.pending) - keep :]
            return
        # llama3_json: a call only as the whole reply (or after `;` between calls)
        stripped = self.pending.lstrip()
        if self._seen_text or (stripped and not (stripped[0] in "{<" or stripped.startswith(";"))):
            self._seen_text = True
            self._content(self.pending, out)
            self.pending = ""
            return
        if stripped.startswith(PYTHON_TAG):
            self.pending = stripped[len(PYTHON_TAG) :]
            return
        if stripped.startswith("<"):
            if not PYTHON_TAG.startswith(stripped[: len(PYTHON_TAG)]):
                self._seen_text = True
            return
        if stripped.startswith(";") and self.calls:
            self.pending = stripped[1:]
            return
        if stripped.startswith("{"):
            self.pending = stripped
            self.call = _Call()

    def _call_step(self, out: list[ToolCallDelta]) -> None:
        call = self.call
        assert call is not None
        call.raw += self.pending
        self.pending = ""
        if call.head_end is None:
            m = _HEAD.match(call.raw, partial=True)
            if m is None:
                self._bad_head(call, out)
                return
            if m.partial:
                return
            call.head_end = m.end()
            call.name = json.loads(f'"{m.group(1)}"')
            self.calls.append(call)
            out.append(ToolCallDelta(index=len(self.calls) - 1, id=call.id, name=call.name, arguments=""))
        if not call.value_done:
            self._scan_arguments(call, out)
        if call.value_done:
            self._after_value(call)

    def _scan_arguments(self, call: _Call, out: list[ToolCallDelta]) -> None:
        assert call.head_end is not None
        text = call.raw[call.head_end :]
        start = call.scanned
        i = start
        while i < len(text) and not call.value_done:
            ch = text[i]
            if call.in_string:
                if call.escape:
                    call.escape = False
                elif ch == "\\":
                    call.escape = True
                elif ch == '"':
                    call.in_string = False
                    if call.depth == 0:
                        call.value_done = True
            elif ch == '"':
                call.in_string = True
            elif ch in "{[":
                call.depth += 1
            elif ch in "}]":
                if call.depth == 0:  # a bare scalar value ended by the object's closing brace
                    call.value_done = True
                    break
                call.depth -= 1
                if call.depth == 0:
                    call.value_done = True
            elif call.depth == 0 and ch == ",":
                call.value_done = True
                break
            i += 1
        piece = text[start:i]
        if call.value_done:
            piece = piece.rstrip()
        call.scanned = i
        if piece:
            call.arguments += piece
            out.append(ToolCallDelta(index=self.calls.index(call), arguments=piece))

    def _after_value(self, call: _Call) -> None:
        """The arguments are complete: wait for the call's end, then back to text."""
        assert call.head_end is not None
        rest = call.raw[call.head_end + call.scanned :]
        if self.fmt == "hermes":
            at = rest.find(HERMES_CLOSE)
            if at >= 0:
                self.call = None
                self.pending = rest[at + len(HERMES_CLOSE) :]
            return
        at = rest.find("}")
        if at >= 0:
            self.call = None
            self.pending = rest[at + 1 :]

    def _bad_head(self, call: _Call, out: list[ToolCallDelta]) -> None:
        """Not the `{"name": ..., "arguments": ...}` head: keep the call's text until it ends, then
        try it as one JSON object (`_rescue`), else as content."""
        if self.fmt == "hermes":
            at = call.raw.find(HERMES_CLOSE)
            if at < 0:
                return
            self.call = None
            self.pending = call.raw[at + len(HERMES_CLOSE) :]
            call.raw = call.raw[:at]
            self._rescue(call, out, HERMES_CLOSE)
            return
        self.call = None
        self._seen_text = True
        self.pending = call.raw
        call.raw = ""

    def _rescue(self, call: _Call, out: list[ToolCallDelta], closing: str = "") -> None:
        """A whole call's text that did not start with the usual head: a call if it is one JSON
        object with a name and arguments, else its text (tags included) as content."""
        try:
            obj = json.loads(call.raw)
        except json.JSONDecodeError:
            obj = None
        args = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", obj.get("parameters"))
        if args is None:
            opening = HERMES_OPEN if self.fmt == "hermes" else ""
            self._content(opening + call.raw + closing, out)
            return
        assert isinstance(obj, dict)
        call.name = obj["name"]
        call.arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        self.calls.append(call)
        index = len(self.calls) - 1
        out.append(ToolCallDelta(index=index, id=call.id, name=call.name, arguments=""))
        out.append(ToolCallDelta(index=index, arguments=call.arguments))

    def _content(self, text: str, out: list[ToolCallDelta]) -> None:
        if not text or (self.calls and not text.strip()):
            return  # whitespace between or after calls is no content
        self.content += text
        out.append(ToolCallDelta(content=text))


def parse_tool_calls(fmt: str, text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content or None, calls) of a whole reply; each call's arguments re-serialized when they are
    valid JSON."""
    parser = ToolCallParser(fmt)
    parser.feed(text)
    parser.finish()
    calls = []
    for c in parser.tool_calls:
        try:
            args = json.dumps(json.loads(c.arguments), ensure_ascii=False)
        except json.JSONDecodeError:
            args = c.arguments
        calls.append(ParsedCall(c.id, c.name, args))
    content = parser.content.strip() if calls else parser.content
    return (content or None) if calls else content, calls


def _prefix_overlap(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (held back: it may be its start)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
