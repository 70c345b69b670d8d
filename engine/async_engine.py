"""AsyncLLMEngine: the engine loop on its own thread, streamed to asyncio callers.

All LLMEngine calls (tokenizing, adding, stepping, aborting) happen on the loop thread, so the event
loop never waits on a forward pass and the engine stays single-threaded. Callers talk to it through a
command queue; outputs come back to each request's asyncio.Queue via `call_soon_threadsafe`. A consumer
that stops iterating (cancelled task, closed generator, client gone) aborts its request, which frees
its KV blocks. `generate_batch` admits the requests of one HTTP request whole or not at all. An exception inside the loop is handed to every waiting request and kills the engine:
later calls raise EngineDeadError.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm_engine import EngineStats, LLMEngine
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.request_stream import OutputSink, RequestStream
from llmdeploy_engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
LOOP_THREAD_NAME = "llmdeploy-engine-loop"


class QueueFullError(RuntimeError):
    """More requests are waiting than `max_queue_len` allows (the server answers 503)."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped (an error inside it, or shutdown); no request can be served."""


class EngineShutdownError(EngineDeadError):
    """The engine loop stopped because `shutdown()` asked it to (the server answers 503)."""


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    arrival_time: float
    stream: OutputSink


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Stop:
    pass


_Command = _Add | _Abort | _Stop


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self._setup(engine)
        self._thread = threading.Thread(target=self._run_loop, name=LOOP_THREAD_NAME, daemon=True)
        self._thread.start()

    def _setup(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.config = engine.config
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._streams: dict[str, OutputSink] = {}  # loop thread only
        self._lock = threading.Lock()
        self._num_pending_adds = 0
        self._stats = engine.stats()
        self._dead: BaseException | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLMEngine:
        """Build the engine on the loop thread itself, then run the loop there (a build error is
        raised here). Every torch parallel region of the process then starts from that one thread:
        once a second thread has run one, libgomp (torch's OpenMP) counts both threads' teams
        against the cores and stops spinning between regions, and on 2 cores each parallel op of a
        decode step took 2.5x as long."""
        self = cls.__new__(cls)
        built: queue.Queue[BaseException | None] = queue.Queue(maxsize=1)

        def build_then_loop() -> None:
            try:
                self._setup(LLMEngine(config))
            except BaseException as exc:
                built.put(exc)
                return
            built.put(None)
            self._run_loop()

        self._thread = threading.Thread(target=build_then_loop, name=LOOP_THREAD_NAME, daemon=True)
        self._thread.start()
        error = built.get()
        if error is not None:
            self._thread.join()
            raise error
        return self

    # ---- caller side (any thread / event loop) -------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def grammar_compiler(self) -> Any:
        """The engine's structured-output compiler (thread-safe; the server compiles off the loop)."""
        return self.engine.grammar_compiler()

    @property
    def is_running(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    @property
    def dead_error(self) -> BaseException | None:
        return self._dead

    def check_health(self) -> None:
        if not self.is_running:
            kind = EngineShutdownError if isinstance(self._dead, EngineShutdownError) else EngineDeadError
            raise kind(f"the engine loop has stopped: {self._dead!r}")

    def stats(self) -> EngineStats:
        """Snapshot taken by the loop thread after its latest step."""
        return self._stats

    def num_waiting(self) -> int:
        with self._lock:
            return self._stats.num_requests_waiting + self._num_pending_adds

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
    ) -> AsyncIterator[RequestOutput]:
        """Yield outputs for one request until it finishes (see `RequestStream`); stopping early aborts it.

        Raises ValueError for a bad prompt or parameters, QueueFullError when `max_queue_len` requests
        already wait, EngineDeadError when the loop has stopped.
        """
        (stream,) = self.generate_batch([(prompt, params, request_id)])
        try:
            async for output in stream:
                yield output
        finally:
            stream.close()

    def generate_batch(
        self, requests: Sequence[tuple[str | list[int], SamplingParams, str]]
    ) -> list[RequestStream]:
        """Admit several requests together or none of them: QueueFullError when they do not all fit in
        the waiting queue, EngineDeadError when the loop has stopped. The caller closes every stream it
        gets (closing one that has not finished aborts its request). A bad prompt or parameters arrive
        as a ValueError from that request's stream.
        """
        loop = asyncio.get_running_loop()
        with self._lock:  # the loop thread takes this lock before it fails the queued commands
            self.check_health()
            waiting = self._stats.num_requests_waiting + self._num_pending_adds
            if waiting + len(requests) > self.config.max_queue_len:
                raise QueueFullError(
                    f"{waiting} requests are already waiting and this one adds {len(requests)} "
                    f"(max_queue_len={self.config.max_queue_len}); retry later"
                )
            self._num_pending_adds += len(requests)
            streams = []
            for prompt, params, request_id in requests:
                sink = OutputSink(loop)
                self._commands.put(_Add(request_id, prompt, params, time.time(), sink))
                streams.append(RequestStream(request_id, sink, params.output_kind, self.abort_nowait))
        return streams

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with finish_reason "abort"."""
        self._commands.put(_Abort(request_id))

    def abort_nowait(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the loop thread; unfinished requests get EngineDeadError."""
        if self._thread.is_alive():
            self._commands.put(_Stop())
            self._thread.join(timeout_s)

    # ---- loop thread --------------------------------------------------------------------------
    def _run_loop(self) -> None:
        engine = self.engine
        try:
            while True:
                idle = not engine.has_unfinished_requests()
                if not self._handle_commands(block=idle):
                    self._dead = EngineShutdownError("the engine was shut down")
                    break
                outputs = engine.step() if engine.has_unfinished_requests() else []
                # the snapshot first: a consumer woken by this step's output sees stats of this step
                self._stats = engine.stats()
                for out in outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        stream.put(out)
                        if out.finished:
                            del self._streams[out.request_id]
        except BaseException as exc:  # reported to every waiting request, never swallowed
            logger.exception("engine loop failed")
            self._dead = exc
        with self._lock:
            self._fail_all(self._dead)

    def _handle_commands(self, block: bool) -> bool:
        """Apply queued commands; False once a stop command arrives."""
        while True:
            try:
                cmd = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(cmd, _Stop):
                return False
            if isinstance(cmd, _Add):
                self._add(cmd)
            else:
                self._abort(cmd.request_id)

    def _add(self, cmd: _Add) -> None:
        try:
            if cmd.request_id in self._streams:
                raise ValueError(f"request id {cmd.request_id!r} is already in use")
            self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params, cmd.arrival_time)
            self._streams[cmd.request_id] = cmd.stream
        except ValueError as exc:
            cmd.stream.put(exc)
        finally:
            with self._lock:
                self._num_pending_adds -= 1
                self._stats = self.engine.stats()

    def _abort(self, request_id: str) -> None:
        out = self.engine.abort_request(request_id)
        stream = self._streams.pop(request_id, None)
        if stream is not None and out is not None:
            stream.put(out)
        self._stats = self.engine.stats()

    def _fail_all(self, exc: BaseException | None) -> None:
        err = exc if isinstance(exc, EngineDeadError) else EngineDeadError(f"the engine loop failed: {exc!r}")
        if exc is not None and err is not exc:
            err.__cause__ = exc
        for stream in self._streams.values():
            stream.put(err)
        self._streams.clear()
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                cmd.stream.put(err)
