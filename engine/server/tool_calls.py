"""Tool calling, request side: which tool-call format the model's chat template speaks, the messages
and tools as the template reads them, and the constraint that guarantees a call.

The format comes from the chat template (there is no flag to set it): a template that writes
`<tool_call>` speaks `hermes`; one that reads `tools` and writes `<|python_tag|>` or `<|eot_id|>`
speaks `llama3_json` (tool_parser.py describes both). A template that never reads `tools` cannot
show the model its tools: such a request is refused with 400, unless tool_choice is "none" (the
tools are then left out of the prompt and no call is parsed).

`tool_choice: "required"` and a named function are guaranteed through a structured-output
constraint (an EBNF grammar, structured_output.py): the reply must be one call, in the template's format, to one of
the tools (the named one), its arguments valid against that tool's `parameters` schema. Building that
grammar from the schemas can take seconds for a large one, so `forced_call_constraint` runs in a
grammar worker process (grammar_pool.py), never on the event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from llmdeploy_engine.sampling_params import StructuredOutputsParams
from llmdeploy_engine.server.openai_protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice
from llmdeploy_engine.server.tool_parser import HERMES_CLOSE, HERMES_OPEN
from llmdeploy_engine.structured_output import clean_reason, json_schema_grammar

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses its tools: the format, the tools for the template, and the functions
    one of which must be called (None for auto; `forced_call_constraint` builds the constraint)."""

    fmt: str
    tools: list[dict[str, Any]]
    forced: list[dict[str, Any]] | None


def template_tool_format(template: str | None) -> str | None:
    """`hermes`, `llama3_json`, or None when the template does not render tools."""
    if not template or "tools" not in _template_variables(template):
        return None
    if HERMES_OPEN in template:
        return "hermes"
    if "<|python_tag|>" in template or "<|eot_id|>" in template:
        return "llama3_json"
    return None


def plan_tools(body: ChatCompletionRequest, template: str | None) -> ToolPlan | None:
    """The request's ToolPlan, or None without tools (or tool_choice none); ValueError (400) when the
    template cannot render tools."""
    mode = body.tool_mode
    if mode == "none":
        return None
    assert body.tools is not None
    fmt = template_tool_format(template)
    if fmt is None:
        raise ValueError(
            "this model's chat template does not support tools (it never reads a `tools` variable, or "
            "writes neither <tool_call> nor Llama 3.1's tool-call format); serve it with a tool-aware "
            'template (--tokenizer FOLDER whose tokenizer_config.json has one) or send tool_choice "none"'
        )
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    forced = None
    if mode != "auto":
        wanted = body.tool_choice.function.name if isinstance(body.tool_choice, NamedToolChoice) else None
        forced = [t["function"] for t in tools if wanted is None or t["function"]["name"] == wanted]
    return ToolPlan(fmt, tools, forced)


def forced_call_constraint(fmt: str, functions: list[dict[str, Any]]) -> StructuredOutputsParams:
    """One call to one of `functions`, in `fmt`, as an EBNF grammar (xgrammar builds the JSON part
    from each function's schema; ValueError for a schema it cannot use)."""
    import xgrammar as xgr

    key = "arguments" if fmt == "hermes" else "parameters"
    schemas = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, key: f.get("parameters") or ANY_OBJECT},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    try:
        call = xgr.Grammar.from_ebnf(json_schema_grammar(json.dumps(schema)))
    except Exception as e:
        raise ValueError(f"tools: a function's parameters schema cannot be used: {clean_reason(e)}") from e
    if fmt == "hermes":
        call = xgr.Grammar.concat(
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(HERMES_OPEN + chr(10))}"),
            call,
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(chr(10) + HERMES_CLOSE)}"),
        )
    return StructuredOutputsParams(grammar=str(call))


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: `developer` as `system`, an assistant's tool calls with
    their arguments as objects (templates serialize them themselves), tool results with their id."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role if m.role != "developer" else "system", "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
                }
                for c in m.tool_calls
            ]
        out.append(msg)
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # not JSON: the template gets the text as sent


def _template_variables(template: str) -> set[str]:
    try:
        return set(meta.find_undeclared_variables(ImmutableSandboxedEnvironment().parse(template)))
    except Exception:  # a template jinja cannot parse fails later, where it is rendered
        return set()
