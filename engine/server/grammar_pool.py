"""Grammar compilation for requests, in worker processes: off the event loop, bounded, cancellable.

Every structured-output constraint (response_format, structured_outputs, guided_*, TGI grammars) and
every forced tool call's grammar is compiled here before its request reaches the engine:

- size: a constraint whose text passes MAX_CONSTRAINT_BYTES is refused (400) before anything compiles;
- time: xgrammar's compile is one C++ call that cannot be interrupted, so a new constraint compiles
  first in a worker process (grammar_worker.py) that is killed when the time bound passes (400
  naming the bound) or when the client hangs up (the route cancels the wait); its replacement starts
  at once, in the background. Only a constraint that compiled there in time is compiled again here, on the
  pool's own threads (xgrammar releases the GIL while it compiles), where the compiled grammar can be
  used: a constraint's first request costs two compiles, and the one here is bounded by the proof;
- the event loop only starts, feeds and kills workers: each starts with the server (cli.serve) and
  is reused job after job, at nice +10 from its first instruction (its start-up imports xgrammar
  and torch: seconds of CPU), so on a small, busy host the server's loop wins the CPU;
- pool: `num_workers` processes and as many threads, and at most `max_waiting` jobs wait for one
  (more: 503 with Retry-After), so hostile schemas can hold the pool for about twice the time bound
  each, and requests without a constraint never touch it (nor the default thread pool that request
  parsing and tokenization use);
- cache: the compiled grammar goes into the engine's GrammarCompiler cache (LRU, keyed by the
  constraint), so the engine's own compile when the request is added is a hit and a repeated schema
  compiles once; identical jobs in flight share one compile. xgrammar's own compiler cache would live
  in a worker process that may be killed, so the engine-side cache is the one kept.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
from collections import OrderedDict
from typing import Any

from llmdeploy_engine.grammar_worker import HEADER, frame, spec_job
from llmdeploy_engine.sampling_params import StructuredOutputsParams

logger = logging.getLogger("llmdeploy_engine.server")

# far above a real tools list or schema (OpenAI's own limits on a strict schema fit in ~20 KB)
MAX_CONSTRAINT_BYTES = 64 * 1024
COMPILE_TIMEOUT_S = 10.0
NUM_WORKERS = 2
MAX_WAITING = 64
WORKER_START_TIMEOUT_S = 120.0
WORKER_NICE = 10  # compiles (worker processes, the pool's threads) yield the CPU to the server
TOOL_GRAMMAR_CACHE_SIZE = 256


class ConstraintRefused(ValueError):
    """The constraint is too large, takes too long or cannot be compiled (the server answers 400)."""


class PoolBusy(Exception):
    """Too many constraints wait to compile (the server answers 503)."""


def constraint_bytes(spec: StructuredOutputsParams) -> int:
    parts = [spec.json, spec.regex, spec.grammar, spec.structural_tag, *(spec.choice or ())]
    return sum(len(p.encode()) for p in parts if p is not None)


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, info_path: str) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmdeploy_engine.grammar_worker",
            info_path,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C goes to the server, which stops its workers
        )
        # lowered from here at once, so even its start-up (Python, xgrammar's import) yields the CPU
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, WORKER_NICE)
        worker = cls(proc)
        try:
            await asyncio.wait_for(worker.answer(), WORKER_START_TIMEOUT_S)
        except BaseException:
            worker.kill()
            with contextlib.suppress(BaseException):  # reaped before its transport is collected
                await asyncio.wait_for(proc.wait(), 5)
            raise
        return worker

    async def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        (size,) = HEADER.unpack(await self.proc.stdout.readexactly(HEADER.size))
        answer = json.loads(await self.proc.stdout.readexactly(size))
        assert isinstance(answer, dict)
        return answer

    async def ask(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(frame(job))
        await self.proc.stdin.drain()
        return await self.answer()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()  # the loop's child watcher reaps it


def _lower_priority() -> None:
    """This thread (a compile) yields the CPU to the event loop and the engine loop on a busy host."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)


class GrammarPool:
    """Compiles constraints for one engine's GrammarCompiler in killable worker processes."""

    def __init__(
        self,
        compiler: Any,
        *,
        num_workers: int = NUM_WORKERS,
        timeout_s: float = COMPILE_TIMEOUT_S,
        max_waiting: int = MAX_WAITING,
        max_bytes: int = MAX_CONSTRAINT_BYTES,
    ) -> None:
        self.compiler = compiler
        self.timeout_s = timeout_s
        self.max_waiting = max_waiting
        self.max_bytes = max_bytes
        self._slots = asyncio.Semaphore(num_workers)
        self._num_waiting = 0
        self.num_workers = num_workers
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting: set[asyncio.Future[_Worker]] = set()
        self._closed = False
        self._info_path: str | None = None
        self._info_task: asyncio.Future[str] | None = None
        self._jobs: dict[str, asyncio.Task[Any]] = {}
        self._job_waiters: dict[str, int] = {}
        self._tool_grammars: OrderedDict[str, str] = OrderedDict()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            num_workers, thread_name_prefix="llmdeploy-grammar", initializer=_lower_priority
        )
        self.num_killed = 0

    def warm_up(self) -> None:
        """Start every worker now (at server start), so no constraint waits for a process to start."""
        for _ in range(self.num_workers - len(self._idle) - len(self._starting)):
            self._start_spare()

    def _start_spare(self) -> None:
        """Start a worker in the background; it joins the idle ones when ready (a failure is logged,
        and the next job that finds no worker starts one itself and reports it)."""
        if self._closed:
            return

        async def start() -> _Worker:
            return await _Worker.start(await self._info_file())

        future = asyncio.ensure_future(start())
        self._starting.add(future)

        def started(f: asyncio.Future[_Worker]) -> None:
            self._starting.discard(f)
            if f.cancelled():
                return
            if f.exception() is not None:
                logger.warning("could not start a grammar worker: %s", f.exception())
            elif self._closed:
                f.result().kill()
            else:
                self._idle.append(f.result())

        future.add_done_callback(started)

    async def _worker(self) -> _Worker:
        """An idle worker, or the next one to finish starting (every slot has one)."""
        while not self._idle:
            if self._closed:
                raise PoolBusy("the server is shutting down")
            if not self._starting:
                self._start_spare()
            done, _ = await asyncio.wait(set(self._starting), return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                if not f.cancelled() and f.exception() is not None:
                    raise ConstraintRefused(f"the grammar compiler could not start: {f.exception()}")
        return self._idle.pop()

    async def compile(self, spec: StructuredOutputsParams) -> None:
        """Compile `spec` into the engine's cache (at once when it is there already)."""
        if self.compiler.cached(spec):
            return
        size = constraint_bytes(spec)
        if size > self.max_bytes:
            raise ConstraintRefused(
                f"the constraint is {size} bytes; this server compiles at most {self.max_bytes} bytes"
            )
        key = json.dumps(spec_job(spec), sort_keys=True)
        await self._shared(key, lambda: self._compile_spec(spec))

    async def tool_call_constraint(
        self, fmt: str, functions: list[dict[str, Any]]
    ) -> StructuredOutputsParams:
        """The compiled constraint of one call to one of `functions` in `fmt` (tool_calls.py)."""
        job = {"tools": {"fmt": fmt, "functions": functions}}
        key = json.dumps(job, sort_keys=True, ensure_ascii=False)
        size = len(key.encode())
        if size > self.max_bytes:
            raise ConstraintRefused(
                f"the tools' parameter schemas are {size} bytes together; this server compiles at "
                f"most {self.max_bytes} bytes"
            )
        grammar = self._tool_grammars.get(key)
        if grammar is None or not self.compiler.cached(StructuredOutputsParams(grammar=grammar)):
            grammar = await self._shared(key, lambda: self._compile_tools(job))
            self._tool_grammars[key] = grammar
            while len(self._tool_grammars) > TOOL_GRAMMAR_CACHE_SIZE:
                self._tool_grammars.popitem(last=False)
        self._tool_grammars.move_to_end(key)
        return StructuredOutputsParams(grammar=grammar)

    async def _shared(self, key: str, start: Any) -> Any:
        """One compile per key in flight; it is cancelled (its worker killed) when its last waiter goes."""
        task = self._jobs.get(key)
        if task is None:
            task = asyncio.ensure_future(start())
            self._jobs[key] = task
            self._job_waiters[key] = 0
            task.add_done_callback(lambda _: (self._jobs.pop(key, None), self._job_waiters.pop(key, None)))
        self._job_waiters[key] += 1
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self._job_waiters[key] -= 1
                if self._job_waiters[key] == 0:
                    task.cancel()
            raise
        finally:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a failure is raised to every waiter, logged by none

    async def _compile_spec(self, spec: StructuredOutputsParams) -> None:
        await self._run(spec_job(spec))
        await self._compile_here(spec)

    async def _compile_tools(self, job: dict[str, Any]) -> str:
        answer = await self._run(job)
        grammar = str(answer["grammar"])
        await self._compile_here(StructuredOutputsParams(grammar=grammar))
        return grammar

    async def _compile_here(self, spec: StructuredOutputsParams) -> None:
        """Compile into the engine's cache on the pool's threads (known to finish within the bound;
        a client leaving now no longer stops it, and the next request with it is a cache hit)."""
        await asyncio.get_running_loop().run_in_executor(self._threads, self.compiler.compile, spec)

    async def _run(self, job: dict[str, Any]) -> dict[str, Any]:
        if self._num_waiting >= self.max_waiting:
            raise PoolBusy(f"{self._num_waiting} constraints are waiting to compile")
        self._num_waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._num_waiting -= 1
        try:
            worker = await self._worker()
            self._busy.add(worker)
            try:
                answer = await asyncio.wait_for(worker.ask(job), self.timeout_s)
            except BaseException as e:  # past the time bound, the client left, or the worker died
                worker.kill()
                self.num_killed += 1
                self._start_spare()  # its replacement starts now, not when the next job comes
                if isinstance(e, TimeoutError | asyncio.TimeoutError):
                    raise ConstraintRefused(
                        f"the constraint did not compile within {self.timeout_s:g} s; simplify it "
                        "(fewer nested objects, alternatives or repetitions)"
                    ) from None
                if isinstance(e, asyncio.IncompleteReadError | ConnectionError | BrokenPipeError):
                    raise ConstraintRefused("the grammar compiler failed on this constraint") from None
                raise
            finally:
                self._busy.discard(worker)
            self._idle.append(worker)
        finally:
            self._slots.release()
        if not answer.get("ok"):
            raise ConstraintRefused(str(answer.get("error", "the constraint cannot be compiled")))
        return answer

    async def _info_file(self) -> str:
        """The tokenizer file the workers read (written once; workers starting together share it)."""
        if self._info_task is None:
            self._info_task = asyncio.ensure_future(self._write_info_file())
        return await asyncio.shield(self._info_task)

    async def _write_info_file(self) -> str:
        text = await asyncio.get_running_loop().run_in_executor(
            self._threads, self.compiler.tokenizer_info_json
        )
        fd, path = tempfile.mkstemp(prefix="llmdeploy-tokenizer-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        self._info_path = path
        return path

    async def close(self) -> None:
        """Stop every worker and wait (briefly) until each is reaped, so no process transport outlives
        the event loop (it would log a traceback as it is collected)."""
        self._closed = True
        starting = list(self._starting)
        for future in starting:
            future.cancel()
        if starting:
            await asyncio.wait(starting, timeout=6)
        workers = [*self._idle, *self._busy]
        for worker in workers:
            worker.kill()
        if workers:
            await asyncio.wait([asyncio.ensure_future(w.proc.wait()) for w in workers], timeout=5)
        self._idle.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self._info_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._info_path)
