"""Decode windows: multi-step decoding and launching the next window ahead of the last one's outputs.

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

Window length auto: window_sizing.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.runner_interface import Runner
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.core.window_sizing import ARRIVAL_HOLD_S, ARRIVAL_WINDOW_STEPS, WindowSizer
from llmdeploy_engine.outputs import RequestOutput

if TYPE_CHECKING:
    from llmdeploy_engine.core.request_state import RequestState

logger = logging.getLogger("llmdeploy_engine")


@dataclass(frozen=True)
class _Window:
    """A decode window launched without waiting for its ids (asynchronous scheduling)."""

    out: SchedulerOutput
    num_steps: int
    handle: Any  # the runner's DecodeWindow


class DecodeWindows:
    """LLMEngine's decode-window half (a mixin: it shares the engine's runner, scheduler, sampler and
    requests)."""

    runner: Runner
    scheduler: Scheduler
    sampler: Any
    requests: dict[str, RequestState]
    max_model_len: int
    speculator: Any

    if TYPE_CHECKING:

        def _process_window(self, out: SchedulerOutput, sampled: list[list[int]]) -> list[RequestOutput]: ...

    def _init_windows(self, config: EngineConfig, runner: Runner) -> None:
        self.num_scheduler_steps = 1  # fixed window length, or the most steps auto may choose
        if config.num_scheduler_steps is not None and config.num_scheduler_steps > 1:
            if self.speculator is not None:
                logger.warning("num_scheduler_steps is ignored with speculative decoding: one step per call")
            elif not runner.runs_windows:
                logger.warning("num_scheduler_steps is ignored: this runner has no multi-step decoding")
            else:
                self.num_scheduler_steps = config.num_scheduler_steps
        self._window_sampling = runner.multi_step_sampling
        asked = config.async_scheduling
        # auto: on with multi-step windows, and on a CUDA device (one-step windows: the host's work for
        # step k overlaps step k + 1 on the device); off on the CPU, where a launch runs at once, so
        # launching ahead would only hold each step's outputs back by a step
        on_gpu = str(runner.device).startswith("cuda")
        self._async_windows = (
            ((self.num_scheduler_steps > 1 or on_gpu) if asked is None else asked)
            and self.speculator is None
            and runner.launches_windows
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
        # from how long the host waited for the one before (window_sizing.WindowSizer); else fixed
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

    def _run_window(self, out: SchedulerOutput) -> tuple[SchedulerOutput, list[RequestOutput] | None]:
        """Run the scheduled step as a decode window when it may be one: (the step, its outputs); None
        outputs: run the step (its slots maybe reserved for a window) as one ordinary step."""
        max_steps, sampled_rows = self._window_limit(out)
        if max_steps > 1 or (max_steps == 1 and self._async_windows):
            out, num_steps = self.scheduler.reserve_decode_window(out, max_steps)
            if num_steps >= 1 and self._async_windows:  # windows of any length, one step included
                self._inflight = self._launch_window(out, num_steps, sampled_rows)
                return out, self._finish_window()
            if num_steps > 1:
                if sampled_rows:
                    params = [e.seq.params for e in out.scheduled]
                    seed = self.sampler.window_seed()
                    ids = self.runner.execute_multi_step(out.batch, num_steps, params, seed)
                else:
                    ids = self.runner.execute_multi_step(out.batch, num_steps)
                return out, self._process_window(out, ids)
        return out, None

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
        handle = self.runner.launch_multi_step(
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
