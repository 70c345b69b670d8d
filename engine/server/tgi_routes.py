"""TGI-compatible routes: POST / and /generate, /generate_stream (SSE), GET /info."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from llmdeploy_engine.outputs import CompletionOutput, Logprob, RequestOutput
from llmdeploy_engine.sampling_params import StructuredOutputsParams
from llmdeploy_engine.server.constraints import compile_constraint
from llmdeploy_engine.server.errors import ERROR_RESPONSES, JSON_OR_STREAM, STREAM_ONLY, APIError, bad_request
from llmdeploy_engine.server.generation import (
    Submission,
    constrained,
    encode,
    last_output,
    make_params,
    resolve_max_tokens,
    until_disconnect,
)
from llmdeploy_engine.server.openai_format import finite, token_text
from llmdeploy_engine.server.openai_stream import SSE_HEADERS, primed
from llmdeploy_engine.server.request_body import openapi_body, read_body
from llmdeploy_engine.server.state import ServerState, server_state
from llmdeploy_engine.server.tgi_protocol import DEFAULT_MAX_NEW_TOKENS, TGIRequest

logger = logging.getLogger("llmdeploy_engine.server")
router = APIRouter(responses=ERROR_RESPONSES)
VERSION = "2.4.0"  # the TGI protocol version these routes follow


def _event(payload: dict[str, Any]) -> str:
    return f"data:{json.dumps(payload, ensure_ascii=False)}\n\n"


def finish_reason(c: CompletionOutput) -> str:
    if c.finish_reason == "length":
        return "length"
    if isinstance(c.stop_reason, str):
        return "stop_sequence"
    return "eos_token"


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    ids.update(getattr(tokenizer, "eos_token_ids", None) or ())
    return {int(i) for i in ids}


def _token(
    tokenizer: Any, token_id: int, step: dict[int, Logprob] | None, special: set[int], text: str | None = None
) -> dict[str, Any]:
    entry = step.get(token_id) if step else None
    return {
        "id": token_id,
        "text": token_text(tokenizer, token_id, entry) if text is None else text,
        "logprob": finite(entry.logprob) if entry is not None else None,
        "special": token_id in special,
    }


def _top_tokens(
    tokenizer: Any, step: dict[int, Logprob] | None, num: int, special: set[int]
) -> list[dict[str, Any]]:
    if not step or not num:
        return []
    ranked = sorted(step.items(), key=lambda kv: -kv[1].logprob)[:num]
    return [_token(tokenizer, t, step, special) for t, _ in ranked]


async def _grammar(request: Request, state: ServerState, body: TGIRequest) -> StructuredOutputsParams | None:
    """The request's `grammar` parameter, compiled (in the grammar pool), or None; 400 for a bad one."""
    grammar = body.parameters.grammar
    if grammar is None:
        return None
    try:
        constraint = grammar.constraint()
    except ValueError as e:
        raise bad_request(str(e), "grammar") from e
    await compile_constraint(request, state, constraint, "grammar")
    return constraint


def _prepare(state: ServerState, body: TGIRequest) -> tuple[list[int], Any]:
    """Tokenize and check the request (runs in a worker thread, before any grammar compiles)."""
    p = body.parameters
    ids = encode(
        state,
        body.inputs,
        add_special_tokens=True,
        # a truncated prompt fits whatever its length; an unset max_new_tokens shrinks to fit
        max_tokens=p.max_new_tokens if p.truncate is None else None,
        param="max_new_tokens",
        prompt_param="inputs",
    )
    if p.truncate is not None:
        ids = ids[-p.truncate :]
    wanted = p.max_new_tokens if p.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS
    if p.max_new_tokens is None:
        wanted = min(wanted, max(1, int(state.ready_engine().max_model_len) - len(ids)))
    max_tokens = resolve_max_tokens(state, len(ids), wanted, "max_new_tokens", "inputs")
    return ids, make_params(state, **p.sampling_kwargs(), max_tokens=max_tokens)


def _details(state: ServerState, body: TGIRequest, c: CompletionOutput) -> dict[str, Any]:
    tokenizer = state.ready_engine().tokenizer
    special = _special_ids(tokenizer)
    steps = c.logprobs or [None] * len(c.token_ids)  # type: ignore[list-item]
    num_top = body.parameters.top_n_tokens or 0
    details: dict[str, Any] = {
        "finish_reason": finish_reason(c),
        "generated_tokens": len(c.token_ids),
        "seed": body.parameters.seed,
        "prefill": [],
        "tokens": [_token(tokenizer, t, s, special) for t, s in zip(c.token_ids, steps, strict=False)],
        "top_tokens": [_top_tokens(tokenizer, s, num_top, special) for s in steps] if num_top else None,
        "best_of_sequences": None,
    }
    return details


async def _submit(request: Request, body: TGIRequest) -> tuple[ServerState, Submission, int]:
    state = server_state(request)
    state.ready_engine()
    ids, params = await asyncio.to_thread(_prepare, state, body)
    [part] = constrained([(ids, params, f"tgi-{uuid.uuid4().hex}")], await _grammar(request, state, body))
    return state, Submission(state, [part]), len(ids)


async def _generate_one(request: Request, body: TGIRequest) -> dict[str, Any]:
    state, submission, _ = await _submit(request, body)
    try:
        final: RequestOutput = await until_disconnect(request, last_output(submission.streams[0]))
    finally:
        submission.close()
    c = final.outputs[0]
    text = (body.inputs + c.text) if body.parameters.return_full_text else c.text
    out: dict[str, Any] = {"generated_text": text}
    if body.parameters.details:
        out["details"] = _details(state, body, c)
    return out


async def _stream_events(
    state: ServerState,
    body: TGIRequest,
    stream: AsyncIterator[RequestOutput],
    num_prompt_tokens: int,
    submission: Submission,
) -> AsyncIterator[str]:
    tokenizer = state.ready_engine().tokenizer
    special = _special_ids(tokenizer)
    p = body.parameters
    sent_tokens, sent_chars = 0, 0
    try:
        async for output in stream:
            c = output.outputs[0]
            new_ids = c.token_ids[sent_tokens:]
            delta = c.text[sent_chars:] if len(c.text) > sent_chars else ""
            first_index = sent_tokens
            if not new_ids and c.finish_reason is not None and c.token_ids:
                # finished without a new token: close the stream on the last token, as TGI always does
                new_ids, first_index = c.token_ids[-1:], len(c.token_ids) - 1
            for k, token_id in enumerate(new_ids):
                i = first_index + k
                step = c.logprobs[i] if c.logprobs and i < len(c.logprobs) else None
                last = k == len(new_ids) - 1
                event: dict[str, Any] = {
                    "index": i,
                    "token": _token(tokenizer, token_id, step, special, text=delta if last else ""),
                    "top_tokens": _top_tokens(tokenizer, step, p.top_n_tokens or 0, special) or None,
                    "generated_text": None,
                    "details": None,
                }
                if last and c.finish_reason is not None:
                    event["generated_text"] = (body.inputs + c.text) if p.return_full_text else c.text
                    if p.details:
                        event["details"] = {
                            "finish_reason": finish_reason(c),
                            "generated_tokens": len(c.token_ids),
                            "seed": p.seed,
                            "input_length": num_prompt_tokens,
                        }
                yield _event(event)
            sent_tokens = len(c.token_ids)
            sent_chars = max(sent_chars, len(c.text))
    except APIError as e:
        yield _event(
            {
                "error": e.message,
                "error_type": {400: "validation", 503: "overloaded"}.get(e.status, "generation"),
            }
        )
    except Exception as e:
        logger.exception("TGI stream failed")
        yield _event({"error": f"internal server error: {type(e).__name__}", "error_type": "generation"})
    finally:
        submission.close()


async def _stream_response(request: Request, body: TGIRequest) -> StreamingResponse:
    state, submission, num_prompt_tokens = await _submit(request, body)
    try:
        started = await until_disconnect(request, primed(submission.streams[0]))
    except BaseException:
        submission.close()
        raise
    return StreamingResponse(
        _stream_events(state, body, started, num_prompt_tokens, submission),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


@router.post("/", responses=JSON_OR_STREAM, openapi_extra=openapi_body(TGIRequest))
async def compat_generate(request: Request) -> Any:
    """TGI's root route: a list with one result, or an SSE stream when `stream` is true."""
    body = await read_body(request, TGIRequest)
    if body.stream:
        return await _stream_response(request, body)
    return [await _generate_one(request, body)]


@router.post("/generate", openapi_extra=openapi_body(TGIRequest))
async def generate(request: Request) -> dict[str, Any]:
    return await _generate_one(request, await read_body(request, TGIRequest))


@router.post(
    "/generate_stream",
    responses=STREAM_ONLY,
    response_class=StreamingResponse,
    openapi_extra=openapi_body(TGIRequest),
)
async def generate_stream(request: Request) -> StreamingResponse:
    return await _stream_response(request, await read_body(request, TGIRequest))


@router.get("/info")
async def info(request: Request) -> dict[str, Any]:
    state = server_state(request)
    s = state.settings
    max_total = int(state.engine.max_model_len) if state.engine is not None else None
    return {
        "model_id": s.model_name,
        "model_sha": None,
        "model_dtype": s.dtype,
        "model_device_type": s.device,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": s.max_num_seqs + s.max_queue_len,
        "max_best_of": 1,
        "max_stop_sequences": 16,
        "max_input_tokens": (max_total - 1) if max_total else None,
        "max_total_tokens": max_total,
        "max_input_length": (max_total - 1) if max_total else None,
        "waiting_served_ratio": 1.2,
        "max_batch_total_tokens": s.max_num_batched_tokens,
        "max_waiting_tokens": 20,
        "max_batch_size": s.max_num_seqs,
        "validation_workers": 1,
        "max_client_batch_size": 1,
        "router": "text-generation-router",
        "version": VERSION,
        "sha": None,
        "docker_label": None,
    }
