"""Tool formats from chat templates, the 400 for a template without tools, and forced calls: the
grammar of tool_choice required / a named function, walked with random logits over the default
model's real vocabulary, always gives a call the parser reads back with valid arguments."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from default_model import default_model_gguf
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.server.openai_protocol import ChatCompletionRequest
from llmdeploy_engine.server.tool_calls import (
    forced_call_constraint,
    plan_tools,
    template_messages,
    template_tool_format,
)
from llmdeploy_engine.server.tool_parser import parse_tool_calls
from llmdeploy_engine.structured_output import GrammarCompiler, fill_grammar_mask
from tool_templates import HERMES_TEMPLATE, LLAMA31_TEMPLATE

pytest.importorskip("xgrammar")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]},
    },
}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model(default_model_gguf())


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size)


def request(**kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **kw})


def test_formats_come_from_the_template(tokenizer: Tokenizer) -> None:
    assert template_tool_format(HERMES_TEMPLATE) == "hermes"
    assert template_tool_format(LLAMA31_TEMPLATE) == "llama3_json"
    # the default model's own template never reads `tools`
    assert template_tool_format(tokenizer.chat_template) is None
    assert template_tool_format(None) is None


def test_a_template_without_tools_is_refused_unless_tool_choice_is_none(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="does not support tools"):
        plan_tools(request(tools=[WEATHER]), tokenizer.chat_template)
    assert plan_tools(request(tools=[WEATHER], tool_choice="none"), tokenizer.chat_template) is None


def test_tool_results_and_calls_render_through_the_template(tokenizer: Tokenizer) -> None:
    body = request(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
        ],
    )
    for template, call_text in (
        (HERMES_TEMPLATE, '{"name": "get_weather", "arguments": {"city": "Oslo"}}'),
        (LLAMA31_TEMPLATE, '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    ):
        plan = plan_tools(body, template)
        assert plan is not None and plan.forced is None  # auto: nothing forced
        text = Tokenizer(tokenizer.hf, template).apply_chat_template(
            template_messages(body.messages), tools=plan.tools
        )
        assert call_text in text and "4 degrees, rain" in text and '"get_weather"' in text


@pytest.mark.parametrize("template", [HERMES_TEMPLATE, LLAMA31_TEMPLATE])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_calls_always_parse_with_valid_arguments(
    compiler: GrammarCompiler, tokenizer: Tokenizer, template: str, choice: object
) -> None:
    plan = plan_tools(request(tools=[WEATHER, TIME], tool_choice=choice), template)
    assert plan is not None and plan.forced is not None
    compiled = compiler.compile(forced_call_constraint(plan.fmt, plan.forced))
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        matcher = compiler.matcher(compiled)
        ids: list[int] = []
        for _ in range(300):
            logits = torch.randn(1, tokenizer.vocab_size, generator=gen) * 3
            fill_grammar_mask(compiler, [matcher]).apply(logits)
            token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))
            assert matcher.accept(token)
            if matcher.is_terminated:
                break
            ids.append(token)
        assert matcher.is_terminated, "the forced call did not end"
        content, calls = parse_tool_calls(plan.fmt, tokenizer.decode(ids))
        assert content is None and len(calls) == 1
        if isinstance(choice, dict):
            assert calls[0].name == "get_time"
        jsonschema.validate(json.loads(calls[0].arguments), schemas[calls[0].name])


def test_a_named_function_must_be_among_the_tools() -> None:
    with pytest.raises(ValueError, match="not in tools"):
        request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="tool_choice needs tools"):
        request(tool_choice="required")
