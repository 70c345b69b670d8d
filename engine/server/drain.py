"""Shutdown on SIGTERM/SIGINT: drain in-flight requests until a deadline, then end the rest cleanly.

uvicorn alone stops accepting, waits `timeout_graceful_shutdown`, then cancels the request tasks
(clients get a bare 500 or a stream cut without `[DONE]`) and re-raises the signal, so even a clean
drain exits by the signal. `DrainingServer` stops the engine at the drain deadline instead: every
request still queued or running then fails inside the engine, which the routes answer as a 503 in
OpenAI's error shape (a stream that already started gets a final `data: {"error": ...}` event and
`data: [DONE]`). uvicorn's own timeout stays as a backstop a few seconds later. The process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

logger = logging.getLogger("llmdeploy_engine.server")
BACKSTOP_S = 5  # uvicorn's cancel-everything timeout runs this long after our deadline


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_s: float, stop_engine: Callable[[], Any]) -> None:
        super().__init__(config)
        self.drain_s = drain_s
        self.stop_engine = stop_engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn's own version re-raises the caught signal after the shutdown; a drained server exits 0
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self._loop is not None:
            logger.info(
                "received %s: draining in-flight requests for up to %.0f s",
                signal.Signals(sig).name,
                self.drain_s,
            )
            self._loop.call_soon_threadsafe(self._start_deadline)

    def _start_deadline(self) -> None:
        self._deadline = asyncio.ensure_future(self._at_deadline())

    async def _at_deadline(self) -> None:
        await asyncio.sleep(self.drain_s)
        busy = len(self.server_state.tasks)
        logger.warning(
            "drain deadline of %.0f s passed with %d request(s) in flight: stopping the engine; "
            "they are answered 503 (streams end with an error event)",
            self.drain_s,
            busy,
        )
        await asyncio.to_thread(self.stop_engine)


def uvicorn_config(app: Any, drain_s: float, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(app, timeout_graceful_shutdown=int(drain_s + BACKSTOP_S), **kwargs)
