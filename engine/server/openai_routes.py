"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions (plain and SSE), with
structured outputs (constraints.py) and tool calls (tool_calls.py, tool_parser.py)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from llmdeploy_engine.sampling_params import StructuredOutputsParams
from llmdeploy_engine.server.constraints import compile_constraint, tool_call_constraint
from llmdeploy_engine.server.errors import ERROR_RESPONSES, JSON_OR_STREAM, bad_request
from llmdeploy_engine.server.generation import (
    Part,
    Submission,
    all_outputs,
    check_model,
    check_prompt_ids,
    check_request_size,
    constrained,
    encode,
    last_output,
    make_params,
    resolve_max_tokens,
    until_disconnect,
)
from llmdeploy_engine.server.openai_format import (
    chat_choice,
    completion_choice,
    usage,
)
from llmdeploy_engine.server.openai_protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields
from llmdeploy_engine.server.openai_stream import (
    SSE_HEADERS,
    chat_events,
    completion_events,
    guarded,
    start_streams,
)
from llmdeploy_engine.server.request_body import openapi_body, read_body
from llmdeploy_engine.server.state import ServerState, server_state
from llmdeploy_engine.server.tool_calls import ToolPlan, plan_tools, template_messages

logger = logging.getLogger("llmdeploy_engine.server")
router = APIRouter(responses=ERROR_RESPONSES)


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    state = server_state(request)
    max_len = state.engine.max_model_len if state.engine is not None else None
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": state.extra.get("started", 0),
                "owned_by": "llmdeploy",
                "root": state.settings.model_path,
                "parent": None,
                "max_model_len": max_len,
            }
            for name in state.settings.served_model_names
        ],
    }


async def _constraint(
    request: Request, state: ServerState, body: _SamplingFields, tools: ToolPlan | None = None
) -> StructuredOutputsParams | None:
    """The request's structured-output constraint, compiled (in the grammar pool), or None; 400 for a
    bad one. A forced tool call brings its own constraint (then the body may set none)."""
    try:
        spec, param = body.structured_outputs_params()
    except ValueError as e:
        raise bad_request(str(e), "response_format") from e
    if tools is not None and tools.forced is not None:
        if spec is not None:
            raise bad_request(f"{param} cannot be combined with a forced tool call (tool_choice)", param)
        return await tool_call_constraint(request, state, tools.fmt, tools.forced)
    if spec is not None:
        await compile_constraint(request, state, spec, param)
    return spec


Prepared = tuple[list[tuple[list[int], str]], list[Part]]  # (ids, echo text) per prompt; engine parts


def _prepare_completion(state: ServerState, body: CompletionRequest, request_id: str) -> Prepared:
    """Tokenize and check every prompt (runs in a worker thread, before any grammar compiles)."""
    prompts = body.prompts()
    check_request_size(state, len(prompts), body.n, "prompt")
    inputs, parts = [], []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = encode(
                state,
                prompt,
                add_special_tokens=True,
                max_tokens=body.max_tokens,
                param="max_tokens",
                prompt_param="prompt",
            )
            inputs.append((ids, prompt))
        else:
            ids = check_prompt_ids(state, prompt, "prompt")
            text = str(state.ready_engine().tokenizer.decode(ids)) if body.echo else ""
            inputs.append((ids, text))
        max_tokens = resolve_max_tokens(state, len(ids), body.max_tokens, "max_tokens", "prompt")
        params = make_params(
            state,
            **body.sampling_kwargs(),
            max_tokens=max_tokens,
            logprobs=body.logprobs,
        )
        parts.append((ids, params, f"{request_id}-{i}"))
    return inputs, parts


@router.post("/v1/completions", responses=JSON_OR_STREAM, openapi_extra=openapi_body(CompletionRequest))
async def create_completion(request: Request) -> Any:
    state = server_state(request)
    body = await read_body(request, CompletionRequest)
    check_model(state, body.model)
    state.ready_engine()
    request_id = f"cmpl-{uuid.uuid4().hex}"
    inputs, parts = await asyncio.to_thread(_prepare_completion, state, body, request_id)
    parts = constrained(parts, await _constraint(request, state, body))
    tokenizer = state.ready_engine().tokenizer
    created = int(time.time())
    model = body.model or state.settings.model_name
    submission = Submission(state, parts)
    if body.stream:
        try:
            started = await start_streams(request, submission.streams)
        except BaseException:
            submission.close()
            raise
        return StreamingResponse(
            guarded(completion_events(state, body, inputs, started, request_id, created, model), submission),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    try:
        finals = await until_disconnect(request, all_outputs(submission.streams))
    finally:
        submission.close()
    choices, num_prompt, num_completion = [], 0, 0
    for i, (final, (_, text)) in enumerate(zip(finals, inputs, strict=True)):
        num_prompt += len(final.prompt_token_ids)
        for c in final.outputs:
            num_completion += len(c.token_ids)
            prefix = text if body.echo else ""
            choices.append(completion_choice(tokenizer, i * body.n + c.index, c, body.logprobs, prefix))
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(num_prompt, num_completion),
    }


def chat_tool_plan(state: ServerState, body: ChatCompletionRequest) -> ToolPlan | None:
    try:
        return plan_tools(body, getattr(state.ready_engine().tokenizer, "chat_template", None))
    except ValueError as e:
        raise bad_request(str(e), "tools") from e


def chat_prompt_ids(
    state: ServerState, body: ChatCompletionRequest, tools: ToolPlan | None = None
) -> list[int]:
    tokenizer = state.ready_engine().tokenizer
    messages = template_messages(body.messages)
    extra = {} if tools is None else {"tools": tools.tools}
    try:
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, **extra
        )
    except Exception as e:  # the template is user-facing: a failure is about these messages
        raise bad_request(f"the chat template failed on these messages: {e}", "messages") from e
    if isinstance(rendered, str):
        return encode(
            state,
            rendered,
            add_special_tokens=False,
            max_tokens=body.completion_budget,
            param="max_completion_tokens",
            prompt_param="messages",
        )
    return [int(t) for t in rendered]


def _prepare_chat(
    state: ServerState,
    body: ChatCompletionRequest,
    request_id: str,
    tools: ToolPlan | None,
) -> Part:
    """Render, tokenize and check the conversation (runs in a worker thread, before any grammar
    compiles: a conversation that does not fit is refused without paying for its tools' grammar)."""
    check_request_size(state, 1, body.n, "messages")
    ids = chat_prompt_ids(state, body, tools)
    max_tokens = resolve_max_tokens(
        state, len(ids), body.completion_budget, "max_completion_tokens", "messages"
    )
    params = make_params(
        state,
        **body.sampling_kwargs(),
        max_tokens=max_tokens,
        logprobs=body.num_logprobs(),
    )
    return ids, params, request_id


@router.post(
    "/v1/chat/completions", responses=JSON_OR_STREAM, openapi_extra=openapi_body(ChatCompletionRequest)
)
async def create_chat_completion(request: Request) -> Any:
    state = server_state(request)
    body = await read_body(request, ChatCompletionRequest)
    check_model(state, body.model)
    state.ready_engine()
    tools = chat_tool_plan(state, body)
    tool_format = tools.fmt if tools is not None else None
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    part = await asyncio.to_thread(_prepare_chat, state, body, request_id, tools)
    [part] = constrained([part], await _constraint(request, state, body, tools))
    tokenizer = state.ready_engine().tokenizer
    created = int(time.time())
    model = body.model or state.settings.model_name
    submission = Submission(state, [part])
    if body.stream:
        try:
            started = await start_streams(request, submission.streams)
        except BaseException:
            submission.close()
            raise
        return StreamingResponse(
            guarded(
                chat_events(state, body, started[0], request_id, created, model, tool_format), submission
            ),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    try:
        final = await until_disconnect(request, last_output(submission.streams[0]))
    finally:
        submission.close()
    choices = [chat_choice(tokenizer, c.index, c, body.num_logprobs(), tool_format) for c in final.outputs]
    num_completion = sum(len(c.token_ids) for c in final.outputs)
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(len(final.prompt_token_ids), num_completion),
    }
