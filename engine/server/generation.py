"""One request's trip through the engine: prompt checks, metrics, and abort when the client goes.

Routes never call the engine directly: a `Submission` admits all engine requests of one HTTP request
at once (or answers 503 for all of them), records the latency and token metrics of each, and its
`close()` aborts every part that has not finished (freeing their KV blocks) when one part fails or
the client goes. Non-streaming routes wrap their wait in `until_disconnect`, which cancels it when
the client disconnects; a streaming response closes its submission when its generator ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from fastapi import Request
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import SamplingParams, StructuredOutputsParams
from llmdeploy_engine.server.errors import APIError, bad_request
from llmdeploy_engine.server.state import ServerState

logger = logging.getLogger("llmdeploy_engine.server")
T = TypeVar("T")


# Names TGI-style clients send when they do not know the model (huggingface_hub's InferenceClient sends
# "dummy" for a bare URL; TGI's own docs use "tgi"). TGI ignores the field, so these mean "the served one".
CLIENT_PLACEHOLDER_MODELS = frozenset({"tgi", "dummy"})


def check_model(state: ServerState, model: str | None) -> None:
    if model is None or model in state.settings.served_model_names or model in CLIENT_PLACEHOLDER_MODELS:
        return
    raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def check_prompt_ids(state: ServerState, ids: Sequence[int], param: str) -> list[int]:
    tokenizer = state.ready_engine().tokenizer
    limit = getattr(tokenizer, "vocab_size", None)
    for token in ids:
        if not isinstance(token, int) or token < 0 or (limit is not None and token >= limit):
            raise bad_request(f"token id {token!r} is outside the vocabulary (0..{(limit or 0) - 1})", param)
    if not ids:
        raise bad_request("the prompt is empty", param)
    return list(ids)


def encode(
    state: ServerState,
    text: str,
    *,
    add_special_tokens: bool,
    max_tokens: int | None,
    param: str,
    prompt_param: str,
) -> list[int]:
    """Token ids of a prompt; a prompt that cannot fit in max_model_len is refused before it is
    tokenized in full where the tokenizer bounds how much text one token stands for. Call it off the
    event loop (a 10 MB prompt takes seconds to tokenize)."""
    tokenizer = state.ready_engine().tokenizer
    chars_per_token = getattr(tokenizer, "max_chars_per_token", None)
    if isinstance(chars_per_token, int) and chars_per_token > 0:
        resolve_max_tokens(
            state, -(-len(text) // chars_per_token), max_tokens, param, prompt_param, at_least=True
        )
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=add_special_tokens)]


def resolve_max_tokens(
    state: ServerState,
    num_prompt_tokens: int,
    max_tokens: int | None,
    param: str,
    prompt_param: str,
    *,
    at_least: bool = False,
) -> int:
    """The completion budget, or 400 when prompt plus budget passes max_model_len (vLLM's wording).
    `at_least`: `num_prompt_tokens` is a lower bound from the prompt's length (not tokenized yet)."""
    max_len = int(state.ready_engine().max_model_len)
    has = "at least " if at_least else ""
    if max_tokens is None:
        if num_prompt_tokens >= max_len:
            raise bad_request(
                f"This model's maximum context length is {max_len} tokens. However, your request has "
                f"{has}{num_prompt_tokens} input tokens. Please reduce the length of the input.",
                prompt_param,
            )
        return max_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_len:
        raise bad_request(
            f"This model's maximum context length is {max_len} tokens. However, you requested "
            f"{has}{num_prompt_tokens + max_tokens} tokens ({has}{num_prompt_tokens} in the input, {max_tokens} in the "
            f"completion). Please reduce the length of the input or completion.",
            prompt_param if num_prompt_tokens >= max_len else param,
        )
    return max_tokens


def make_params(state: ServerState, **kwargs: Any) -> SamplingParams:
    n = int(kwargs.get("n", 1))
    if n > state.settings.max_num_seqs:
        raise bad_request(
            f"n={n} is more than this server runs at once (max_num_seqs={state.settings.max_num_seqs})", "n"
        )
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:
        raise bad_request(str(e)) from e


def constrained(parts: list[Part], constraint: StructuredOutputsParams | None) -> list[Part]:
    """`parts` with their output held to `constraint` (compiled after the cheap checks passed)."""
    if constraint is None:
        return parts
    return [(ids, dataclasses.replace(p, structured_outputs=constraint), rid) for ids, p, rid in parts]


def check_request_size(state: ServerState, num_prompts: int, n: int, prompt_param: str) -> None:
    """400 for a request whose prompts x n pass --max-num-seqs-per-request, or whose prompts could
    never all fit in the waiting queue (a request is admitted whole or not at all)."""
    limit = state.settings.max_num_seqs_per_request
    if num_prompts * n > limit:
        raise bad_request(
            f"this request asks for {num_prompts * n} sequences ({num_prompts} prompts x n={n}); this "
            f"server takes at most {limit} per request (--max-num-seqs-per-request)",
            prompt_param if n == 1 else "n",
        )
    if num_prompts > state.settings.max_queue_len:
        raise bad_request(
            f"this request has {num_prompts} prompts; this server queues at most "
            f"{state.settings.max_queue_len} (--max-queue-len)",
            prompt_param,
        )


Part = tuple[list[int], SamplingParams, str]  # prompt ids, parameters, engine request id


class Submission:
    """The engine requests of one HTTP request, admitted together. `close()` aborts every one that has
    not finished: routes call it in a `finally`, so a failed part or a client that left takes the
    whole request out of the engine."""

    def __init__(self, state: ServerState, parts: Sequence[Part]) -> None:
        engine = state.ready_engine()
        try:
            self._sources: list[Any] = list(engine.generate_batch(parts))
        except state.settings.queue_full_errors as e:
            raise APIError(
                503, f"the server is overloaded: {e}", code="queue_full", headers={"Retry-After": "1"}
            ) from e
        except state.settings.shutdown_errors as e:
            raise shutting_down() from e
        self.streams = [
            _observed(state, ids, request_id, source)
            for (ids, _, request_id), source in zip(parts, self._sources, strict=True)
        ]

    def close(self) -> None:
        for source in self._sources:
            source.close()


def shutting_down() -> APIError:
    message = "the server is shutting down; retry on another replica"
    return APIError(503, message, code="server_shutting_down", headers={"Retry-After": "5"})


async def _observed(
    state: ServerState, prompt_ids: list[int], request_id: str, source: AsyncIterator[RequestOutput]
) -> AsyncIterator[RequestOutput]:
    """One engine request's outputs, recording latency and token metrics and its request log line."""
    metrics = state.metrics
    start = time.monotonic()
    first_s: float | None = None
    last_s: float | None = None
    seen_tokens = 0
    seen_longest = 0  # tokens of the longest choice: the engine steps each choice once per step
    final: RequestOutput | None = None
    try:
        try:
            async for output in source:
                now = time.monotonic()
                num_tokens = sum(len(c.token_ids) for c in output.outputs)
                longest = max((len(c.token_ids) for c in output.outputs), default=0)
                if num_tokens > seen_tokens:
                    if first_s is None:
                        first_s = now
                        metrics.observe_first_token(now - start)
                    elif last_s is not None and longest > seen_longest:
                        # a slow reader gets several steps at once: spread the gap over them
                        steps = longest - seen_longest
                        for _ in range(steps):
                            metrics.observe_token_gap((now - last_s) / steps)
                    last_s = now
                    seen_tokens = num_tokens
                    seen_longest = longest
                final = output
                yield output
                if output.finished:
                    break
        except state.settings.shutdown_errors as e:
            raise shutting_down() from e
        except ValueError as e:
            # The engine validates a request before producing anything; its ValueError is the user's.
            if final is not None:
                raise
            raise bad_request(str(e)) from e
    finally:
        # No await before the bookkeeping: under a cancelled (anyio) scope every await raises again.
        source.close()  # type: ignore[attr-defined]
        done = final is not None and final.finished
        if final is not None or first_s is not None:
            reasons = [c.finish_reason for c in final.outputs] if final is not None and done else []
            reason = (
                "abort" if not done or "abort" in reasons else ("length" if "length" in reasons else "stop")
            )
            metrics.observe_finished(
                reason=str(reason),
                num_prompt_tokens=len(prompt_ids),
                num_generated_tokens=seen_tokens,
                e2e_s=time.monotonic() - start,
                decode_s=(last_s - first_s) if first_s is not None and last_s is not None else None,
            )
        if state.settings.log_requests:
            logger.info(
                "request %s: %d prompt tokens, %d generated, %s",
                request_id,
                len(prompt_ids),
                seen_tokens,
                "finished" if done else ("aborted" if final is not None else "not started"),
            )


async def last_output(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final: RequestOutput | None = None
    async for output in stream:
        final = output
    assert final is not None, "the engine finished a request without any output"
    return final


async def all_outputs(streams: Sequence[AsyncIterator[RequestOutput]]) -> list[RequestOutput]:
    """The final output of every stream; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(last_output(s)) for s in streams]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ClientDisconnected(Exception):
    """The client closed the connection before its non-streaming response was ready."""


async def until_disconnect(request: Request, work: Any) -> Any:
    """Run `work` (a coroutine); cancel it when the client disconnects first (the route's `finally`
    then aborts its engine requests) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done():
        # let the cancelled work unwind (its streams' bookkeeping runs) before the route goes on
        await asyncio.wait({task})
    if task.cancelled():
        raise ClientDisconnected(f"{request.method} {request.url.path}")
    return task.result()


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several async iterators as items arrive, tagging each with its stream's index."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None, bool]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item, None, False))
        except Exception as e:
            await queue.put((i, None, e, True))
            return
        await queue.put((i, None, None, True))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item, error, done = await queue.get()
            if error is not None:
                raise error
            if done:
                remaining -= 1
                continue
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            closer = getattr(s, "aclose", None)
            if closer is not None:
                await closer()
