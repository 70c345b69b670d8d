"""One request's trip through the engine: prompt checks, metrics, and abort when the client goes.

Routes never call `engine.generate` directly: `stream_outputs` records the latency and token
metrics, turns a full queue into 503 and aborts the request in the engine (freeing its KV blocks)
whenever the consumer stops early, such as when a streaming client disconnects. Non-streaming
routes wrap their wait in `until_disconnect`, which cancels it (and so aborts) when the client goes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from fastapi import Request
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import SamplingParams
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


def encode(state: ServerState, text: str, *, add_special_tokens: bool) -> list[int]:
    tokenizer = state.ready_engine().tokenizer
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=add_special_tokens)]


def resolve_max_tokens(
    state: ServerState, num_prompt_tokens: int, max_tokens: int | None, param: str, prompt_param: str
) -> int:
    """The completion budget, or 400 when prompt plus budget passes max_model_len (vLLM's wording)."""
    max_len = int(state.ready_engine().max_model_len)
    if max_tokens is None:
        if num_prompt_tokens >= max_len:
            raise bad_request(
                f"This model's maximum context length is {max_len} tokens. However, your request has "
                f"{num_prompt_tokens} input tokens. Please reduce the length of the input.",
                prompt_param,
            )
        return max_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_len:
        raise bad_request(
            f"This model's maximum context length is {max_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the input, {max_tokens} in the "
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


_PENDING_ABORTS: set[asyncio.Future[None]] = set()  # strong references until each abort ran


async def _abort(state: ServerState, request_id: str) -> None:
    engine = state.engine
    if engine is None:
        return
    try:
        result = engine.abort(request_id)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("aborting request %s failed", request_id)


async def stream_outputs(
    state: ServerState, prompt_ids: list[int], params: SamplingParams, request_id: str
) -> AsyncIterator[RequestOutput]:
    engine = state.ready_engine()
    metrics = state.metrics
    start = time.monotonic()
    first_s: float | None = None
    last_s: float | None = None
    seen_tokens = 0
    seen_longest = 0  # tokens of the longest choice: the engine steps each choice once per step
    final: RequestOutput | None = None
    try:
        try:
            stream = engine.generate(prompt_ids, params, request_id)
            async for output in stream:
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
        except state.settings.queue_full_errors as e:
            raise APIError(
                503, f"the server is overloaded: {e}", code="queue_full", headers={"Retry-After": "1"}
            ) from e
        except ValueError as e:
            # The engine validates a request before producing anything; its ValueError is the user's.
            if final is not None:
                raise
            raise bad_request(str(e)) from e
    finally:
        # No await before the bookkeeping: under a cancelled (anyio) scope every await raises again.
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
        if not done:
            task = asyncio.ensure_future(_abort(state, request_id))
            _PENDING_ABORTS.add(task)
            task.add_done_callback(_PENDING_ABORTS.discard)


async def last_output(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final: RequestOutput | None = None
    async for output in stream:
        final = output
    assert final is not None, "the engine finished a request without any output"
    return final


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Any) -> Any:
    """Run `work` (a coroutine); cancel it when the client disconnects first (its finally aborts)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        raise APIError(499, "the client closed the request", code="client_closed_request")
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
