"""LLMEngine: requests in, one scheduled forward pass per `step()`, RequestOutputs out.

Each request's `SamplingParams.output_kind` says what it gets back: CUMULATIVE (default; everything so
far, every step it advanced), DELTA (what is new since its previous output) or FINAL_ONLY (one output
at finish; no per-step outputs are built, and without stop strings no per-token detokenization).

Multi-step decoding (`num_scheduler_steps` = N > 1): when a scheduled step is pure decode, nothing
waits, speculative decoding is off, the runner has `execute_multi_step` and every sequence's next
tokens can be chosen on the device (greedy, or, when the runner has `multi_step_sampling`, unseeded
sampling with temperature / top-k / top-p / min-p; never logprobs, penalties or unmet min_tokens),
the runner runs up to N decode steps back to back, feeding each step's tokens to the next on the
device, with one host sync at the end (the scheduler reserved the slots:
`Scheduler.reserve_decode_window`). The tokens then go through the same per-token stop checks in
order; a sequence that stops at step k drops the later ones. Anything else (seeded requests,
logprobs, penalties, prefills, a waiting queue) runs one step. Sampled tokens in a window are
drawn from the same distribution as `Sampler.sample` draws them, with the window's own noise.
Trade-off: a request that arrives during a window waits up to N - 1 steps, and streamed outputs come
in chunks of up to N tokens.

Asynchronous scheduling (`async_scheduling`, on by default with multi-step decoding and on a CUDA
device, where with num_scheduler_steps 1 every eligible decode step is a one-step window; off by
default on the CPU, where a launch runs at once; when the runner has `launch_multi_step`): a window
is launched without waiting for its ids, and before its tokens are
processed the next window is launched for the same sequences (`Scheduler.follow_decode_window`), its
first inputs gathered from the last step's ids on the device. So the device runs window k + 1 while
the host reads, checks and streams window k's tokens and builds window k + 2's inputs: the host's
per-window work no longer leaves the device idle. A step() returns window k's outputs with window
k + 1 in flight. The follow-on leaves out the sequences window k certainly ends (max_tokens, the
longest context) and is not launched while a request waits (so a new request waits up to two windows)
or when not every running sequence is in the window; the tokens it computes for a sequence that
stopped in window k (EOS, a stop string) or was aborted are dropped, and their slots were freed with
the sequence (the device runs the follow-on's writes to them before anything launched later).

Window length auto (`num_scheduler_steps` None, the default; with asynchronous windows on a CUDA
device): every window starts at one step; `multi_step.WindowSizer` lengthens the windows (up to 8
steps) while the host waits ~nothing for each window's ids, i.e. while the device idles between
windows because the host's work a window is over half the device's, and shortens them when the
device has more than four times the host's work. So a model whose steps are long on the device runs
one-step windows, and a small model at a large batch runs windows long enough to hide the host (the
multi-step trade-off above then applies: new requests wait up to two windows, streams arrive in
chunks). While requests arrive (one was added while sequences decoded in the last ARRIVAL_HOLD_S,
1 s) and a max_num_seqs slot is free, auto windows are at most ARRIVAL_WINDOW_STEPS (2) steps: an
unsaturated engine's throughput follows the arrivals, not the windows, and its streams arrive in
smaller chunks.
Elsewhere auto is one step.

Owns the model runner, block manager, scheduler, sampler and tokenizer. Single-threaded: every call
must come from one thread (AsyncLLMEngine runs it on its own loop thread).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmdeploy_engine.block_manager import BlockManager
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.forward_batch import ForwardBatch
from llmdeploy_engine.multi_step import ARRIVAL_HOLD_S, ARRIVAL_WINDOW_STEPS, WindowSizer
from llmdeploy_engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams
from llmdeploy_engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from llmdeploy_engine.sequence import UNFINISHED, Sequence, SequenceStatus
from llmdeploy_engine.stop_checker import StopChecker

logger = logging.getLogger("llmdeploy_engine")

# Python's cyclic garbage collector runs a young-generation pass every 700 new container objects by
# default; the engine's step loop creates that many in well under a millisecond, and the passes (with
# the older-generation passes they trigger) took a third of the host time of a decode window
# (benchmarks/host_overhead.py: 2.0 -> 1.4 us a token at 256 x (560 + 560) with 8-step windows). The
# engine raises the threshold to GC_GEN0_THRESHOLD for the process (never lowers it);
# LLMDEPLOY_GC_GEN0 sets another value, 0 leaves Python's setting alone.
GC_GEN0_THRESHOLD = 50_000
GC_GEN0_ENV = "LLMDEPLOY_GC_GEN0"


def raise_gc_threshold() -> int:
    """Raise the collector's young-generation threshold (see GC_GEN0_THRESHOLD); returns it after."""
    raw = os.environ.get(GC_GEN0_ENV, str(GC_GEN0_THRESHOLD))
    try:
        wanted = int(raw)
    except ValueError as exc:
        raise ValueError(
            f"{GC_GEN0_ENV}={raw!r}: give a whole number of objects (0: Python's default)"
        ) from exc
    gen0, gen1, gen2 = gc.get_threshold()
    if wanted > gen0:
        gc.set_threshold(wanted, gen1, gen2)
    return gc.get_threshold()[0]


class Runner(Protocol):
    """What the engine needs from `ModelRunner` (tests pass a fake)."""

    num_kv_blocks: int
    block_size: int
    max_model_len: int

    def execute(self, batch: ForwardBatch) -> Any: ...  # float32 logits [len(sample_indices), vocab]


@dataclass(frozen=True)
class EngineStats:
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by live sequences, 0..1
    num_kv_blocks: int
    num_free_kv_blocks: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_finished: int
    startup_report: Any = None
    # speculative decoding (vLLM's spec_decode_* counters); zeros when it is off
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Window:
    """A decode window launched without waiting for its ids (asynchronous scheduling)."""

    out: SchedulerOutput
    num_steps: int
    handle: Any  # the runner's DecodeWindow


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    checkers: list[StopChecker]
    generators: list[Any]
    metrics: RequestMetrics
    logprobs: list[list[dict[int, Logprob]] | None] = field(default_factory=list)
    cumulative_logprobs: list[float] = field(default_factory=list)
    # DELTA outputs: per sequence, (characters of text, tokens, logprob entries) already handed out
    sent: list[tuple[int, int, int]] = field(default_factory=list)
    needs_history: bool = False  # the sampler reads the sequences' tokens (penalties, min_tokens)
    # its tokens can be chosen on the device once min_tokens is met: 1 greedy, 2 unseeded sampling
    window_kind: int = 0
    # structured outputs: per sequence, its position in the request's grammar (structured_output.py)
    matchers: list[Any] | None = None

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


class LLMEngine:
    @staticmethod
    def _build_runner(config: EngineConfig) -> Runner:
        from llmdeploy_engine.model_runner import ModelRunner

        # a first import that runs torch.fx.wrap (torch._dynamo's does, should anything import it)
        # leaves the frames on the stack, this one and so this engine included, in a cycle of
        # import frames that only the cyclic collector frees; a young-generation collection frees
        # it now (~1 ms)
        gc.collect(1)
        model_runner = ModelRunner(config)
        runner: Runner = model_runner
        if model_runner.device.type == "cuda" and not config.enforce_eager:
            if model_runner.graphs_with_tensor_parallel:
                # decode steps replayed from CUDA graphs captured now (docs/gpu-notes.md); with
                # tensor parallelism every rank captures the same graphs (all-reduces over
                # symmetric memory inside; the logits' all-gather inside with the push path, else
                # after the replay)
                from llmdeploy_engine.cuda_graph_runner import CudaGraphRunner

                model_runner.capture_graphs_on_workers()
                runner = CudaGraphRunner(runner, logits_max_batch=model_runner.graph_logits_rows())
            else:
                from llmdeploy_engine.distributed import ALLREDUCE_ENV

                logger.warning(
                    "CUDA graphs with tensor_parallel_size > 1 need the symmetric-memory all-reduce "
                    "(%s=nccl or its set-up failed); decode steps run eagerly",
                    ALLREDUCE_ENV,
                )
        if model_runner.workers is not None:  # tensor parallel: steps go to ranks 1..N-1 first
            from llmdeploy_engine.tp_worker import TensorParallelDriver

            runner = TensorParallelDriver(runner, model_runner.workers)
        return runner

    def __init__(
        self,
        config: EngineConfig,
        *,
        runner: Runner | None = None,
        tokenizer: Any = None,
        sampler: Any = None,
    ) -> None:
        from llmdeploy_engine.gguf_loader import shared_gguf_reader

        self.config = config
        with shared_gguf_reader():  # the runner and the tokenizer parse a GGUF file once
            if runner is None:
                runner = self._build_runner(config)
            self.runner = runner
            if tokenizer is None:
                from llmdeploy_engine.tokenizer import Tokenizer

                tokenizer = Tokenizer.from_model(config.tokenizer or config.model)
        self.tokenizer = tokenizer
        if sampler is None:
            from llmdeploy_engine.sampler import Sampler

            sampler = Sampler(set(tokenizer.eos_token_ids), getattr(runner, "device", "cpu"))
        self.sampler = sampler
        self.max_model_len = runner.max_model_len
        self.block_manager = BlockManager(
            runner.num_kv_blocks, runner.block_size, config.enable_prefix_caching
        )
        sched_config = SchedulerConfig.from_engine(config, self.max_model_len)
        runner_budget = getattr(runner, "max_num_batched_tokens", None)
        if isinstance(runner_budget, int) and config.enable_chunked_prefill:
            # never schedule more tokens per step than the runner profiled its activation memory for
            sched_config = dataclasses.replace(sched_config, max_num_batched_tokens=runner_budget)
        self.scheduler = Scheduler(sched_config, self.block_manager)
        self.speculator = None
        if config.speculative_config is not None:
            from llmdeploy_engine.spec_decode.speculator import build_speculator

            self.speculator = build_speculator(config, runner, self.sampler)
        self.num_scheduler_steps = 1  # fixed window length, or the most steps auto may choose
        if config.num_scheduler_steps is not None and config.num_scheduler_steps > 1:
            if self.speculator is not None:
                logger.warning("num_scheduler_steps is ignored with speculative decoding: one step per call")
            elif not callable(getattr(runner, "execute_multi_step", None)):
                logger.warning("num_scheduler_steps is ignored: this runner has no multi-step decoding")
            else:
                self.num_scheduler_steps = config.num_scheduler_steps
        self._window_sampling = bool(getattr(runner, "multi_step_sampling", False))
        asked = config.async_scheduling
        # auto: on with multi-step windows, and on a CUDA device (one-step windows: the host's work for
        # step k overlaps step k + 1 on the device); off on the CPU, where a launch runs at once, so
        # launching ahead would only hold each step's outputs back by a step
        on_gpu = str(getattr(runner, "device", "cpu")).startswith("cuda")
        self._async_windows = (
            ((self.num_scheduler_steps > 1 or on_gpu) if asked is None else asked)
            and self.speculator is None
            and callable(getattr(runner, "launch_multi_step", None))
        )
        if asked and not self._async_windows:
            logger.warning(
                "async_scheduling is ignored: %s",
                "one step per call with speculative decoding"
                if self.speculator is not None
                else "this runner cannot launch decode windows",
            )
        self._inflight: _Window | None = None  # the launched window whose tokens are not processed yet
        # num_scheduler_steps auto with asynchronous windows on a CUDA device: each window's length
        # from how long the host waited for the one before (multi_step.WindowSizer); else fixed
        self._sizer: WindowSizer | None = None
        self._arrived_while_decoding = -float("inf")  # time.monotonic() of the last such request
        if config.num_scheduler_steps is None and self._async_windows and on_gpu:
            self._sizer = WindowSizer()
            self.num_scheduler_steps = self._sizer.max_steps
        self._window_done: float | None = None  # when the last window's ids were read, in a chain
        self.num_windows_by_steps: dict[int, int] = {}  # windows launched, by number of steps
        if self._sizer is not None:
            logger.info(
                "Asynchronous scheduling: on; decode windows of 1-%d steps, longer while the host's "
                "work a window exceeds the device's (num_scheduler_steps auto)",
                self._sizer.max_steps,
            )
        elif self.num_scheduler_steps > 1:
            logger.info(
                "Multi-step decoding: up to %d decode steps a window, asynchronous scheduling %s",
                self.num_scheduler_steps,
                "on" if self._async_windows else "off",
            )
        elif self._async_windows:
            logger.info("Asynchronous scheduling: on (decode steps launched one ahead of their outputs)")
        self.requests: dict[str, _Request] = {}
        self._grammar_compiler: Any = None  # built on the first constrained request
        self._grammar_lock = threading.Lock()
        raise_gc_threshold()
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._num_requests_finished = 0

    def close(self) -> None:
        """Release the runner's processes (tensor-parallel workers); the engine is unusable after."""
        close = getattr(self.runner, "close", None)
        if callable(close):
            close()

    # ---- requests -----------------------------------------------------------------------------
    def process_prompt(
        self, prompt: str | list[int], params: SamplingParams
    ) -> tuple[str | None, list[int], int]:
        """Tokenize and validate; returns (prompt text, token ids, effective max_tokens).

        Raises ValueError with a user-facing message (the server answers 400).
        """
        if isinstance(prompt, str):
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt)
        else:
            text, ids = None, [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        n_prompt = len(ids)
        if n_prompt >= self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens, but the prompt has "
                f"{n_prompt} tokens; shorten the prompt to at most {self.max_model_len - 1} tokens."
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n_prompt
        if n_prompt + max_tokens > self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion). "
                "Please reduce the length of the prompt or max_tokens."
            )
        return text, ids, max_tokens

    def grammar_compiler(self) -> Any:
        """The structured-output compiler for this engine's tokenizer (built once, on first use; any
        thread may call it and its `compile`: the server compiles off the engine loop)."""
        with self._grammar_lock:
            if self._grammar_compiler is None:
                from llmdeploy_engine.structured_output import GrammarCompiler

                vocab = getattr(getattr(self.runner, "model_config", None), "vocab_size", None)
                self._grammar_compiler = GrammarCompiler(self.tokenizer, vocab or self.tokenizer.vocab_size)
            return self._grammar_compiler

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        text, ids, max_tokens = self.process_prompt(prompt, params)
        self.add_processed_request(request_id, text, ids, params, max_tokens, arrival_time)

    def add_processed_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_tokens: int,
        arrival_time: float | None = None,
    ) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        arrival = time.time() if arrival_time is None else arrival_time
        matchers = None
        if params.structured_outputs is not None:
            compiler = self.grammar_compiler()
            compiled = compiler.compile(params.structured_outputs)  # a cache hit when the server compiled it
            matchers = [compiler.matcher(compiled) for _ in range(params.n)]
        eos = set() if params.ignore_eos else set(self.tokenizer.eos_token_ids)
        seqs: list[Sequence] = []
        for i in range(params.n):
            parent = seqs[0] if seqs else None
            seqs.append(
                Sequence(request_id, prompt_token_ids, params, index=i, arrival_time=arrival, parent=parent)
            )
        req = _Request(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            seqs=seqs,
            checkers=[
                StopChecker(
                    params,
                    # seeded with the prompt's tail so the first token's leading space survives
                    self.tokenizer.incremental_decoder(
                        params.skip_special_tokens, prompt_token_ids=prompt_token_ids
                    ),
                    eos,
                    max_tokens,
                    self.max_model_len,
                )
                for _ in seqs
            ],
            generators=[
                None if params.seed is None else self.sampler.make_generator(params.seed + i)
                for i in range(params.n)
            ],
            metrics=RequestMetrics(arrival_time=arrival),
            logprobs=[[] if params.logprobs is not None else None for _ in seqs],
            cumulative_logprobs=[0.0 for _ in seqs],
            sent=[(0, 0, 0) for _ in seqs],
            needs_history=params.needs_token_history,
            window_kind=_window_kind(params),
            matchers=matchers,
        )
        self.requests[request_id] = req
        if self.scheduler.running:  # it will wait for the windows in flight (see _window_steps)
            self._arrived_while_decoding = time.monotonic()
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is; its blocks are freed. Returns its final output, if it existed."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.abort(request_id)
        req.metrics.finished_time = time.time()
        self._num_requests_finished += 1
        return self._make_output(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        if self._inflight is not None:
            return self._finish_window()
        self._window_done = None  # a scheduled step breaks the chain of windows
        if self.speculator is not None:
            self.speculator.set_proposals(self.scheduler.running, self._num_tokens_left)
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        now = time.time()
        for entry in out.scheduled:
            metrics = self.requests[entry.seq.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        if self.speculator is not None:
            out = self.speculator.fill(out, self.scheduler, self.requests)
        elif self.num_scheduler_steps > 1 or self._async_windows:
            max_steps, sampled_rows = self._window_limit(out)
            if max_steps > 1 or (max_steps == 1 and self._async_windows):
                out, num_steps = self.scheduler.reserve_decode_window(out, max_steps)
                if num_steps >= 1 and self._async_windows:  # windows of any length, one step included
                    self._inflight = self._launch_window(out, num_steps, sampled_rows)
                    return self._finish_window()
                if num_steps > 1:
                    if sampled_rows:
                        params = [e.seq.params for e in out.scheduled]
                        seed = self.sampler.window_seed()
                        ids = self.runner.execute_multi_step(out.batch, num_steps, params, seed)
                    else:
                        ids = self.runner.execute_multi_step(out.batch, num_steps)
                    return self._process_window(out, ids)
        logits = self.runner.execute(out.batch)
        self.scheduler.update_computed(out)
        if out.batch.num_logits is not None:
            return self._process_verified(out, logits)
        return self._process_samples(out, logits)

    def _launch_window(
        self,
        out: SchedulerOutput,
        num_steps: int,
        sampled_rows: bool,
        follow: _Window | None = None,
        follow_rows: list[int] | None = None,
    ) -> _Window:
        params = [e.seq.params for e in out.scheduled] if sampled_rows else None
        seed = self.sampler.window_seed() if sampled_rows else None
        handle = self.runner.launch_multi_step(  # type: ignore[attr-defined]
            out.batch, num_steps, params, seed, None if follow is None else follow.handle, follow_rows
        )
        counts = self.num_windows_by_steps
        counts[num_steps] = counts.get(num_steps, 0) + 1
        return _Window(out, num_steps, handle)

    def _finish_window(self) -> list[RequestOutput]:
        """Launch the window after the one in flight (when it may run), then wait for the one in flight
        and process its tokens (asynchronous scheduling, see the module docstring)."""
        window = self._inflight
        assert window is not None
        self._inflight = self._follow_on(window)
        if self._sizer is None:
            return self._process_window(window.out, window.handle.result())
        start = time.perf_counter()
        ids = window.handle.result()
        done = time.perf_counter()
        if self._window_done is not None:
            self._sizer.observe(done - start, done - self._window_done)
        self._window_done = done if self._inflight is not None else None
        return self._process_window(window.out, ids)

    def _follow_on(self, window: _Window) -> _Window | None:
        """The next window for the sequences `window` does not certainly end, launched now; or None."""
        rows: list[int] = []
        ending = 0  # still running, but window ends them
        longest = 0
        sampled_rows = False
        requests = self.requests
        max_len, num_steps = self.max_model_len, window.num_steps
        for i, entry in enumerate(window.out.scheduled):
            seq = entry.seq
            if seq.is_finished:  # stopped in the window before this one, or aborted since
                continue
            req = requests[seq.request_id]
            # _num_tokens_left, inline (per sequence and step; the counts' properties too)
            num_tokens = len(seq.token_ids)
            left = (
                min(
                    req.checkers[seq.index].max_tokens - (num_tokens - seq.num_prompt_tokens),
                    max_len - num_tokens,
                )
                - num_steps
            )
            if left <= 0:  # the window ends it (max_tokens or the longest context)
                ending += 1
                continue
            rows.append(i)
            if left > longest:
                longest = left
            if req.window_kind == 2:
                sampled_rows = True
        followed = self.scheduler.follow_decode_window(
            window.out, window.num_steps, rows, min(self._window_steps(), longest), ending
        )
        if followed is None:
            return None
        out, num_steps = followed
        return self._launch_window(out, num_steps, sampled_rows, window, rows)

    def _window_steps(self) -> int:
        """The next window's length: num_scheduler_steps, or with auto the sizer's choice, at most
        ARRIVAL_WINDOW_STEPS within ARRIVAL_HOLD_S of a request added while sequences decode while a
        max_num_seqs slot is free (a request that arrives waits for the windows in flight)."""
        if self._sizer is None:
            return self.num_scheduler_steps
        steps = self._sizer.steps
        if (
            steps > ARRIVAL_WINDOW_STEPS
            and time.monotonic() - self._arrived_while_decoding < ARRIVAL_HOLD_S
            and len(self.scheduler.running) < self.scheduler.config.max_num_seqs
        ):
            return ARRIVAL_WINDOW_STEPS
        return steps

    def _num_tokens_left(self, seq: Sequence) -> int:
        checker = self.requests[seq.request_id].checkers[seq.index]
        return min(checker.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)

    def _window_limit(self, out: SchedulerOutput) -> tuple[int, bool]:
        """(how many decode steps this scheduled step may run back to back, whether a row samples):
        0 unless every sequence's next tokens can be chosen on the device (no window: one ordinary
        step), else num_scheduler_steps cut to the longest remaining output (steps past every
        max_tokens would be thrown away)."""
        longest = 1
        sampled_rows = False
        requests = self.requests
        top_kind = 2 if self._window_sampling else 1
        for entry in out.scheduled:
            seq = entry.seq
            req = requests[seq.request_id]
            kind = req.window_kind
            if not 0 < kind <= top_kind or seq.num_output_tokens < req.params.min_tokens:
                return 0, False
            sampled_rows = sampled_rows or kind == 2
            longest = max(longest, req.checkers[seq.index].max_tokens - seq.num_output_tokens)
        return min(self._window_steps(), longest), sampled_rows

    def _process_window(self, out: SchedulerOutput, sampled: list[list[int]]) -> list[RequestOutput]:
        """After a decode window: per sequence, step k's token is appended (its fed token now counts as
        computed) through the per-token stop checks; a stop drops the later steps' tokens, and their
        KV, never counted as computed, is never registered in the prefix cache. (The per-token path
        of `_append_token`, inlined; a window never holds a sequence's first token.)"""
        now = time.time()
        bm = self.block_manager
        bs = bm.block_size
        requests = self.requests
        touched: dict[str, _Request] = {}
        finished_any = False
        num_appended = 0
        columns: list[tuple[int, ...]] | None = None
        for i, entry in enumerate(out.scheduled):
            seq = entry.seq
            if seq.is_finished:
                # asynchronous windows: it stopped in the window before this one, or was aborted
                continue
            req = requests[seq.request_id]
            checker = req.checkers[seq.index]
            if checker.deferred:
                # no stop strings and no per-token text: the window's tokens in one call, the same
                # outcome as the loop below (StopChecker.on_window_tokens)
                if columns is None:
                    columns = list(zip(*sampled, strict=True))
                tokens = columns[i]
                num_tokens = len(seq.token_ids)  # the counts' properties, inline
                kept, status = checker.on_window_tokens(
                    tokens, num_tokens - seq.num_prompt_tokens, num_tokens
                )
                seq.token_ids.extend(tokens[:kept])  # first: the blocks registered below hash them
                before = seq.num_computed_tokens
                seq.num_computed_tokens += kept
                if seq.num_computed_tokens // bs != before // bs:
                    bm.cache_full_blocks(seq)
                num_appended += kept
            else:
                num_prompt = seq.num_prompt_tokens
                status = None
                for step_tokens in sampled:
                    seq.num_computed_tokens += 1
                    if seq.num_computed_tokens % bs == 0:
                        bm.cache_full_blocks(seq)
                    token_id = step_tokens[i]
                    seq.append_token(token_id)
                    num_appended += 1
                    num_tokens = seq.num_tokens
                    status = checker.on_token(token_id, num_tokens - num_prompt, num_tokens)
                    if status is not None:
                        break
            if status is not None:
                seq.stop_reason = checker.stop_reason
                self.scheduler.finish(seq, status)
                finished_any = True
            req.metrics.last_token_time = now
            touched[req.request_id] = req
        self._generation_tokens_total += num_appended
        return self._collect_outputs(touched, now, finished_any)

    def _process_verified(self, out: SchedulerOutput, logits: Any) -> list[RequestOutput]:
        """Speculative step: append each sequence's verified tokens through the per-token stop checks;
        a stop inside the accepted run ends it there."""
        assert self.speculator is not None
        now = time.time()
        touched: dict[str, _Request] = {}
        self._mask_verified_rows(out, logits)
        for v in self.speculator.verify(out, logits, self.requests):
            req = self.requests[v.seq.request_id]
            for token_id, lp in zip(v.token_ids, v.logprobs, strict=True):
                self._append_token(v.seq, req, token_id, lp, now)
                if v.seq.is_finished:
                    break
            if v.num_proposed and not v.seq.is_finished:
                self.scheduler.accept_speculative(v.seq, len(v.token_ids) - 1)
            touched[req.request_id] = req
        return self._collect_outputs(touched, now)

    def _process_samples(self, out: SchedulerOutput, logits: Any) -> list[RequestOutput]:
        seqs = out.sampled_seqs
        if not seqs:
            return []
        requests = self.requests
        reqs = [requests[s.request_id] for s in seqs]
        no_history: list[int] = []
        # the forward pass was launched: the host fills the constrained rows' masks meanwhile
        grammar = self._grammar_mask(
            [r.matchers[s.index] if r.matchers is not None else None for s, r in zip(seqs, reqs, strict=True)]
        )
        sampled = self.sampler.sample(
            logits,
            [s.params for s in seqs],
            [r.prompt_token_ids if r.needs_history else no_history for r in reqs],
            [s.output_token_ids if r.needs_history else no_history for s, r in zip(seqs, reqs, strict=True)],
            [r.generators[s.index] for s, r in zip(seqs, reqs, strict=True)],
            **({} if grammar is None else {"grammar": grammar}),  # samplers without grammars stay valid
        )
        now = time.time()
        touched: dict[str, _Request] = {}
        finished_any = False
        # the per-token path of _append_token, inlined: this loop runs once per output token
        for seq, req, token_id, lp in zip(seqs, reqs, sampled.token_ids, sampled.logprobs, strict=True):
            seq.append_token(token_id)
            num_output = seq.num_output_tokens
            metrics = req.metrics
            if num_output == 1 and seq.index == 0:
                self._prompt_tokens_total += seq.num_prompt_tokens
                metrics.num_cached_prompt_tokens = seq.num_cached_tokens
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now
            if lp is not None:
                self._record_logprobs(req, seq.index, token_id, lp)
            checker = req.checkers[seq.index]
            status = checker.on_token(token_id, num_output, seq.num_tokens)
            if req.matchers is not None and _grammar_ends(req.matchers[seq.index], token_id, status):
                status = SequenceStatus.FINISHED_STOPPED
            if status is not None:
                seq.stop_reason = checker.stop_reason
                self.scheduler.finish(seq, status)
                finished_any = True
            touched[req.request_id] = req
        self._generation_tokens_total += len(seqs)
        return self._collect_outputs(touched, now, finished_any)

    def _append_token(
        self, seq: Sequence, req: _Request, token_id: int, lp: dict[int, Logprob] | None, now: float
    ) -> bool:
        """Append one token through the stop checks; True when it finished the sequence."""
        seq.append_token(token_id)
        self._generation_tokens_total += 1
        if seq.num_output_tokens == 1 and seq.index == 0:
            self._prompt_tokens_total += seq.num_prompt_tokens
            req.metrics.num_cached_prompt_tokens = seq.num_cached_tokens
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        req.metrics.last_token_time = now
        if lp is not None:
            self._record_logprobs(req, seq.index, token_id, lp)
        checker = req.checkers[seq.index]
        status = checker.on_token(token_id, seq.num_output_tokens, seq.num_tokens)
        if req.matchers is not None and _grammar_ends(req.matchers[seq.index], token_id, status):
            status = SequenceStatus.FINISHED_STOPPED
        if status is None:
            return False
        seq.stop_reason = checker.stop_reason
        self.scheduler.finish(seq, status)
        return True

    def _grammar_mask(self, matchers: list[Any]) -> Any:
        """The bitmask of the rows whose sequence has a grammar (None when none has): filled now, on the
        host, while the device runs the step's forward pass."""
        if all(m is None for m in matchers):
            return None
        from llmdeploy_engine.structured_output import fill_grammar_mask

        return fill_grammar_mask(self.grammar_compiler(), matchers)

    def _mask_verified_rows(self, out: SchedulerOutput, logits: Any) -> None:
        """Speculative step: constrained sequences get no proposals (Speculator.set_proposals), so each
        has one logits row; mask those rows as `Sampler.sample` would."""
        entries = [e for e in out.scheduled if e.samples]
        counts = out.batch.num_logits or [1] * len(entries)
        matchers: list[Any] = []
        for e, count in zip(entries, counts, strict=True):
            req = self.requests[e.seq.request_id]
            m = req.matchers[e.seq.index] if req.matchers is not None else None
            assert m is None or count == 1, "a constrained sequence was given draft tokens"
            matchers.extend([m] + [None] * (count - 1))
        grammar = self._grammar_mask(matchers)
        if grammar is not None:
            grammar.apply(logits)

    def _collect_outputs(
        self, touched: dict[str, _Request], now: float, finished_any: bool = True
    ) -> list[RequestOutput]:
        """Outputs of the touched requests (none for an unfinished FINAL_ONLY one); finished requests
        leave the engine. finished_any False skips the finished checks (no sequence stopped)."""
        results = []
        final_only = RequestOutputKind.FINAL_ONLY
        for req in touched.values():
            if finished_any and req.finished:
                req.metrics.finished_time = now
                del self.requests[req.request_id]
                self._num_requests_finished += 1
            elif req.params.output_kind is final_only:
                continue  # nobody reads an unfinished FINAL_ONLY output
            results.append(self._make_output(req))
        return results

    def _record_logprobs(
        self, req: _Request, index: int, token_id: int, lp: dict[int, Logprob] | None
    ) -> None:
        store = req.logprobs[index]
        if store is None or lp is None:
            return
        for tid, entry in lp.items():
            if entry.decoded_token is None:
                entry.decoded_token = self.tokenizer.token_text(tid)
        store.append(lp)
        if token_id in lp:
            req.cumulative_logprobs[index] += lp[token_id].logprob

    def _make_output(self, req: _Request) -> RequestOutput:
        completions = []
        delta = req.params.output_kind is RequestOutputKind.DELTA
        all_finished = True
        for seq, checker in zip(req.seqs, req.checkers, strict=True):
            status = seq.status
            finished = status not in UNFINISHED  # seq.is_finished, inline (per request and step)
            all_finished = all_finished and finished
            lps = req.logprobs[seq.index]
            text = checker.visible_text(finished)
            token_ids = seq.output_token_ids
            lp_list = list(lps) if lps is not None else None
            if delta:
                sent_chars, sent_tokens, sent_lps = req.sent[seq.index]
                req.sent[seq.index] = (len(text), len(token_ids), len(lp_list or ()))
                text, token_ids = text[sent_chars:], token_ids[sent_tokens:]
                lp_list = lp_list[sent_lps:] if lp_list is not None else None
            completions.append(
                CompletionOutput(
                    index=seq.index,
                    text=text,
                    token_ids=token_ids,
                    cumulative_logprob=req.cumulative_logprobs[seq.index] if lps is not None else None,
                    logprobs=lp_list,
                    finish_reason=status.value if finished else None,  # status.finish_reason
                    stop_reason=seq.stop_reason,
                )
            )
        m = req.metrics
        metrics = object.__new__(RequestMetrics)  # a copy: the engine keeps updating its own
        metrics.__dict__.update(m.__dict__)
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,  # never changed after add: shared, not copied
            outputs=completions,
            finished=all_finished,
            metrics=metrics,
            num_cached_tokens=m.num_cached_prompt_tokens,
        )

    # ---- observability ------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        running = {s.request_id for s in self.scheduler.running}
        pc = self.block_manager.prefix_cache_stats()
        return EngineStats(
            num_requests_running=len(running),
            num_requests_waiting=len(self.requests) - len(running),
            kv_cache_usage=self.block_manager.usage,
            num_kv_blocks=self.block_manager.num_blocks,
            num_free_kv_blocks=self.block_manager.num_free_blocks,
            prefix_cache_queries_tokens=pc.num_query_tokens,
            prefix_cache_hits_tokens=pc.num_hit_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            num_requests_finished=self._num_requests_finished,
            startup_report=getattr(self.runner, "startup_report", None),
            **self._spec_decode_stats(),
        )

    def _spec_decode_stats(self) -> dict[str, Any]:
        if self.speculator is None:
            return {}
        s = self.speculator.stats
        return {
            "spec_decode_num_drafts": s.num_drafts,
            "spec_decode_num_draft_tokens": s.num_draft_tokens,
            "spec_decode_num_accepted_tokens": s.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": tuple(s.num_accepted_tokens_per_pos),
        }


def _grammar_ends(matcher: Any, token_id: int, status: SequenceStatus | None) -> bool:
    """Advance a sequence's grammar by its new token; True when that must end the sequence although
    the stop checks did not (its grammar is complete, e.g. with ignore_eos; or the token was refused,
    which the mask rules out)."""
    if status is not None:
        return False
    if not matcher.accept(token_id):
        logger.error("token %d was refused by the sequence's grammar; the sequence stops here", token_id)
        return True
    return bool(matcher.is_terminated)


def _window_kind(params: SamplingParams) -> int:
    """How a multi-step window can choose the request's tokens on the device (once min_tokens is
    met; nothing else may be read from the logits): 1 greedy (argmax), 2 unseeded sampling (the
    runner's `WindowSampler`), 0 not at all (logprobs, penalties, a seed, a grammar: its mask needs
    the host between steps, so a batch with a constrained sequence runs one step at a time)."""
    plain = (
        params.structured_outputs is None
        and params.logprobs is None
        and params.repetition_penalty == 1.0
        and params.frequency_penalty == 0.0
        and params.presence_penalty == 0.0
    )
    if not plain:
        return 0
    if params.greedy:
        return 1
    return 2 if params.seed is None else 0
