"""OpenAI SSE streams: completion and chat chunks in OpenAI's exact shape, ending in `data: [DONE]`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.server.errors import APIError, error_body
from llmdeploy_engine.server.generation import (
    Submission,
    merge,
    until_disconnect,
)
from llmdeploy_engine.server.openai_format import (
    StreamTracker,
    chat_logprobs,
    completion_logprobs,
    sse,
    usage,
)
from llmdeploy_engine.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from llmdeploy_engine.server.state import ServerState
from llmdeploy_engine.server.tool_parser import ToolCallDelta, ToolCallParser

logger = logging.getLogger("llmdeploy_engine.server")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def primed(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """Pull the first output now, so a full queue or a bad request is still a plain HTTP error."""
    first = await stream.__anext__()

    async def rest() -> AsyncIterator[RequestOutput]:
        try:
            yield first
            async for item in stream:
                yield item
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    return rest()


async def start_streams(
    request: Request, streams: list[AsyncIterator[RequestOutput]]
) -> list[AsyncIterator[RequestOutput]]:
    started: list[AsyncIterator[RequestOutput]] = await until_disconnect(
        request, asyncio.gather(*(primed(s) for s in streams))
    )
    return started


async def guarded(events: AsyncIterator[str], submission: Submission) -> AsyncIterator[str]:
    """An error after the 200 header went out can only be reported as an event: `data: {"error":
    {...}}` in OpenAI's error shape, then `data: [DONE]` (as vLLM ends a failed stream). Whichever
    way the stream ends, every engine request of the submission that has not finished is aborted."""
    try:
        async for event in events:
            yield event
    except APIError as e:
        yield sse(e.body())
        yield sse("[DONE]")
    except Exception as e:
        logger.exception("stream failed")
        yield sse(error_body(500, f"internal server error: {type(e).__name__}", code="internal_error"))
        yield sse("[DONE]")
    finally:
        submission.close()


async def completion_events(
    state: ServerState,
    body: CompletionRequest,
    inputs: list[tuple[list[int], str]],
    streams: list[AsyncIterator[RequestOutput]],
    request_id: str,
    created: int,
    model: str,
) -> AsyncIterator[str]:
    tokenizer = state.ready_engine().tokenizer
    trackers = [StreamTracker(index_base=i * body.n) for i in range(len(streams))]
    head = {"id": request_id, "object": "text_completion", "created": created, "model": model}
    if body.echo:
        for i, (_, text) in enumerate(inputs):
            for j in range(body.n):
                yield sse(
                    {
                        **head,
                        "choices": [
                            {"index": i * body.n + j, "text": text, "logprobs": None, "finish_reason": None}
                        ],
                    }
                )
    async for i, output in merge(streams):
        tracker = trackers[i]
        for index, d in tracker.deltas(output):
            offset = tracker.cursors[index - tracker.index_base].num_chars - len(d.text)
            lps = None
            if body.logprobs is not None and d.logprobs is not None:
                lps = completion_logprobs(tokenizer, d.token_ids, d.logprobs, body.logprobs, offset)
            if d.text or d.token_ids:
                yield sse(
                    {
                        **head,
                        "choices": [{"index": index, "text": d.text, "logprobs": lps, "finish_reason": None}],
                    }
                )
            if d.finish_reason is not None:
                yield sse(
                    {
                        **head,
                        "choices": [
                            {
                                "index": index,
                                "text": "",
                                "logprobs": None,
                                "finish_reason": d.finish_reason,
                                "stop_reason": d.stop_reason,
                            }
                        ],
                    }
                )
    if body.include_usage:
        num_prompt = sum(t.num_prompt_tokens for t in trackers)
        num_completion = sum(t.num_completion_tokens for t in trackers)
        yield sse({**head, "choices": [], "usage": usage(num_prompt, num_completion)})
    yield sse("[DONE]")


async def chat_events(
    state: ServerState,
    body: ChatCompletionRequest,
    stream: AsyncIterator[RequestOutput],
    request_id: str,
    created: int,
    model: str,
    tool_format: str | None = None,
) -> AsyncIterator[str]:
    """Chat chunks; with `tool_format` each choice's text goes through a ToolCallParser, so tool calls
    stream as OpenAI's `tool_calls` deltas (index, id, type and name first, then `arguments`
    fragments) and a stopped choice that called tools ends with finish_reason "tool_calls"."""
    tokenizer = state.ready_engine().tokenizer
    tracker = StreamTracker()
    parsers: dict[int, ToolCallParser] = {}
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    num_logprobs = body.num_logprobs()
    async for output in stream:
        for index, d in tracker.deltas(output):
            if d.first:
                yield sse(
                    {
                        **head,
                        "choices": [
                            {
                                "index": index,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            if tool_format is not None:
                parser = parsers.setdefault(index, ToolCallParser(tool_format))
                pieces = parser.feed(d.text) if d.text else []
                if d.finish_reason is not None:
                    pieces += parser.finish()
                for piece in pieces:
                    yield sse(
                        {
                            **head,
                            "choices": [
                                {
                                    "index": index,
                                    "delta": _delta(piece),
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
            elif d.text or d.token_ids:
                lps = None
                if num_logprobs is not None and d.logprobs is not None:
                    lps = chat_logprobs(tokenizer, d.token_ids, d.logprobs, num_logprobs)
                yield sse(
                    {
                        **head,
                        "choices": [
                            {
                                "index": index,
                                "delta": {"content": d.text},
                                "logprobs": lps,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            if d.finish_reason is not None:
                reason = d.finish_reason
                if reason == "stop" and index in parsers and parsers[index].tool_calls:
                    reason = "tool_calls"
                yield sse(
                    {
                        **head,
                        "choices": [
                            {
                                "index": index,
                                "delta": {},
                                "logprobs": None,
                                "finish_reason": reason,
                                "stop_reason": d.stop_reason,
                            }
                        ],
                    }
                )
    if body.include_usage:
        yield sse(
            {**head, "choices": [], "usage": usage(tracker.num_prompt_tokens, tracker.num_completion_tokens)}
        )
    yield sse("[DONE]")


def _delta(piece: ToolCallDelta) -> dict[str, Any]:
    if piece.content is not None:
        return {"content": piece.content}
    call: dict[str, Any] = {"index": piece.index}
    if piece.id is not None:
        call.update(id=piece.id, type="function", function={"name": piece.name, "arguments": ""})
    else:
        call["function"] = {"arguments": piece.arguments}
    return {"tool_calls": [call]}
