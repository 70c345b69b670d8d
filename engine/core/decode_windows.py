"""Decode windows: multi-step decoding and launching the next window ahead of the last one's outputs.

Multi-step decoding (`num_scheduler_steps` = N > 1): when a scheduled step is pure decode, nothing
waits, speculative decoding is off, the runner runs windows (`Runner.runs_windows`) and every sequence's next
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

Which steps are windows and how long: window_policy.py (window length auto: window_sizing.py).
The runner's window executor runs them (runner/window_executor.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmdeploy_engine.core.output_processor import OutputProcessor
from llmdeploy_engine.core.runner_interface import Runner
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerOutput
from llmdeploy_engine.core.window_policy import WindowPolicy
from llmdeploy_engine.outputs import RequestOutput

if TYPE_CHECKING:
    from llmdeploy_engine.core.request_state import RequestState


@dataclass(frozen=True)
class LaunchedWindow:
    """A decode window launched without waiting for its ids (asynchronous scheduling)."""

    out: SchedulerOutput
    num_steps: int
    handle: Any  # the runner's DecodeWindow


class DecodeWindows:
    """Runs the windows the policy grants on the runner and hands their tokens to the output
    processor; holds the asynchronous window in flight (`inflight`) and counts windows by length."""

    def __init__(
        self,
        policy: WindowPolicy,
        runner: Runner,
        scheduler: Scheduler,
        sampler: Any,
        outputs: OutputProcessor,
        requests: dict[str, RequestState],
    ) -> None:
        self.policy = policy
        self.runner = runner
        self.scheduler = scheduler
        self.sampler = sampler
        self.outputs = outputs
        self.requests = requests
        self.inflight: LaunchedWindow | None = None  # launched, its tokens not processed yet
        # when the last window's ids were read (perf_counter), in a chain of follow-ons; the engine
        # clears it when a scheduled step breaks the chain
        self.chained_done_s: float | None = None
        self.num_windows_by_steps: dict[int, int] = {}  # windows launched, by number of steps

    def run(
        self, out: SchedulerOutput, max_steps: int, sampled_rows: bool
    ) -> tuple[SchedulerOutput, list[RequestOutput] | None]:
        """Run the scheduled step as a decode window of up to `max_steps` steps (WindowPolicy.plan)
        when the scheduler reserves its slots: (the step, its outputs); None outputs: run the step
        (its slots maybe reserved for a window) as one ordinary step."""
        out, num_steps = self.scheduler.reserve_decode_window(out, max_steps)
        if num_steps >= 1 and self.policy.async_windows:  # windows of any length, one step included
            self.inflight = self._launch(out, num_steps, sampled_rows)
            return out, self.finish()
        if num_steps > 1:
            if sampled_rows:
                params = [e.seq.params for e in out.scheduled]
                seed = self.sampler.window_seed()
                ids = self.runner.execute_multi_step(out.batch, num_steps, params, seed)
            else:
                ids = self.runner.execute_multi_step(out.batch, num_steps)
            return out, self.outputs.process_window(out, ids)
        return out, None

    def _launch(
        self,
        out: SchedulerOutput,
        num_steps: int,
        sampled_rows: bool,
        follow: LaunchedWindow | None = None,
        follow_rows: list[int] | None = None,
    ) -> LaunchedWindow:
        params = [e.seq.params for e in out.scheduled] if sampled_rows else None
        seed = self.sampler.window_seed() if sampled_rows else None
        handle = self.runner.launch_multi_step(
            out.batch, num_steps, params, seed, None if follow is None else follow.handle, follow_rows
        )
        counts = self.num_windows_by_steps
        counts[num_steps] = counts.get(num_steps, 0) + 1
        return LaunchedWindow(out, num_steps, handle)

    def finish(self) -> list[RequestOutput]:
        """Launch the window after the one in flight (when it may run), then wait for the one in flight
        and process its tokens (asynchronous scheduling, see the module docstring)."""
        window = self.inflight
        assert window is not None
        self.inflight = self._follow_on(window)
        if self.policy.sizer is None:
            return self.outputs.process_window(window.out, window.handle.result())
        start = time.perf_counter()
        ids = window.handle.result()
        done = time.perf_counter()
        if self.chained_done_s is not None:
            self.policy.observe(done - start, done - self.chained_done_s)
        self.chained_done_s = done if self.inflight is not None else None
        return self.outputs.process_window(window.out, ids)

    def _follow_on(self, window: LaunchedWindow) -> LaunchedWindow | None:
        """The next window for the sequences `window` does not certainly end, launched now; or None."""
        rows, ending, longest, sampled_rows = self.policy.follow_rows(
            window.out, window.num_steps, self.requests
        )
        followed = self.scheduler.follow_decode_window(
            window.out,
            window.num_steps,
            rows,
            min(self.policy.window_steps(len(self.scheduler.running)), longest),
            ending,
        )
        if followed is None:
            return None
        out, num_steps = followed
        return self._launch(out, num_steps, sampled_rows, window, rows)
