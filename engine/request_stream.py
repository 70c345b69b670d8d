"""One request's outputs on their way from the engine loop thread to an asyncio consumer.

`OutputSink` is the loop thread's end (a thread-safe put into the consumer's asyncio.Queue);
`RequestStream` is the consumer's end, an async iterator that is closed explicitly: unlike an async
generator, closing one that was never iterated still aborts its request, so a caller that submits
several requests at once can give every one of them back in a single `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import RequestOutputKind


@dataclass
class OutputSink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException] = field(default_factory=asyncio.Queue)

    def put(self, item: RequestOutput | BaseException) -> None:
        # a closed caller loop raises RuntimeError: nobody is listening any more
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class RequestStream:
    """Outputs of one request as `output_kind` asks (CUMULATIVE: a slow consumer gets the latest
    only; DELTA: every delta; FINAL_ONLY: the last output). `aclose()` aborts it unless it finished."""

    def __init__(
        self, request_id: str, sink: OutputSink, output_kind: RequestOutputKind, abort: Callable[[str], None]
    ) -> None:
        self.request_id = request_id
        self._sink = sink
        self._cumulative = output_kind is RequestOutputKind.CUMULATIVE
        self._abort = abort
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        queue = self._sink.queue
        item = await queue.get()
        # the engine may run ahead of a slow consumer: cumulative outputs keep only the latest
        # (DELTA outputs must all be handed over)
        while (
            self._cumulative
            and not isinstance(item, BaseException)
            and not item.finished
            and not queue.empty()
        ):
            item = queue.get_nowait()
        if isinstance(item, BaseException):
            self.finished = True  # the engine has dropped this request already
            raise item
        if item.finished:
            self.finished = True
        return item

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Abort the request in the engine (frees its KV blocks) unless it already finished."""
        if not self.finished:
            self.finished = True
            self._abort(self.request_id)
