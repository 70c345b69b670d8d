"""WindowPolicy: whether a scheduled step runs as a decode window, how many steps, which sequences a
follow-on window continues, and how many steps fit the free KV blocks.

The rules (decode_windows.py's docstring tells the whole mechanism): a step is a window only when
windows are on (`num_scheduler_steps` > 1, or asynchronous windows), every scheduled sequence's next
tokens can be chosen on the device (`RequestState.window_kind`: greedy, or unseeded sampling when the
runner samples on the device) and its min_tokens is met; the window is num_scheduler_steps long (or
the sizer's choice with auto, window_sizing.py), cut to the longest remaining output. A follow-on
window continues the sequences the window in flight does not certainly end (max_tokens, the longest
context). The window's slots must fit the free blocks (`steps_that_fit`).

Plain Python (no torch): the engine asks it, the scheduler reserves the slots (window_slots.py), the
runner's window executor runs the steps.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from llmdeploy_engine.core.scheduler_output import SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.core.window_sizing import ARRIVAL_HOLD_S, ARRIVAL_WINDOW_STEPS, WindowSizer

if TYPE_CHECKING:
    from llmdeploy_engine.core.request_state import RequestState

logger = logging.getLogger("llmdeploy_engine")


class WindowPolicy:
    """num_scheduler_steps: the fixed window length, or with a `sizer` the most steps auto may
    choose; async_windows: windows are launched ahead of the last one's outputs; sampling: the
    runner samples on the device (unseeded sampling may run in windows, not only greedy)."""

    def __init__(
        self,
        num_scheduler_steps: int = 1,
        async_windows: bool = False,
        sampling: bool = False,
        sizer: WindowSizer | None = None,
        *,
        max_num_seqs: int,
        max_model_len: int,
    ) -> None:
        self.num_scheduler_steps = sizer.max_steps if sizer is not None else num_scheduler_steps
        self.async_windows = async_windows
        self.sampling = sampling
        self.sizer = sizer
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        # windows run at all: a synchronous one-step window is an ordinary step
        self.enabled = self.num_scheduler_steps > 1 or async_windows
        self.arrived_while_decoding = -float("inf")  # time.monotonic() of the last such request

    @classmethod
    def choose(
        cls,
        num_scheduler_steps: int | None,
        async_scheduling: bool | None,
        *,
        runs_windows: bool,
        launches_windows: bool,
        sampling: bool,
        on_gpu: bool,
        speculating: bool,
        max_num_seqs: int,
        max_model_len: int,
    ) -> WindowPolicy:
        """The policy for the engine's settings (`num_scheduler_steps` None: auto) and what its runner
        can do; logs what it chose and every setting it ignores."""
        steps = 1
        if num_scheduler_steps is not None and num_scheduler_steps > 1:
            if speculating:
                logger.warning("num_scheduler_steps is ignored with speculative decoding: one step per call")
            elif not runs_windows:
                logger.warning("num_scheduler_steps is ignored: this runner has no multi-step decoding")
            else:
                steps = num_scheduler_steps
        # auto: on with multi-step windows, and on a CUDA device (one-step windows: the host's work for
        # step k overlaps step k + 1 on the device); off on the CPU, where a launch runs at once, so
        # launching ahead would only hold each step's outputs back by a step
        async_windows = (
            ((steps > 1 or on_gpu) if async_scheduling is None else async_scheduling)
            and not speculating
            and launches_windows
        )
        if async_scheduling and not async_windows:
            logger.warning(
                "async_scheduling is ignored: %s",
                "one step per call with speculative decoding"
                if speculating
                else "this runner cannot launch decode windows",
            )
        # num_scheduler_steps auto with asynchronous windows on a CUDA device: each window's length
        # from how long the host waited for the one before (window_sizing.WindowSizer); else fixed
        sizer = WindowSizer() if num_scheduler_steps is None and async_windows and on_gpu else None
        policy = cls(
            steps, async_windows, sampling, sizer, max_num_seqs=max_num_seqs, max_model_len=max_model_len
        )
        policy.log_choice()
        return policy

    def log_choice(self) -> None:
        if self.sizer is not None:
            logger.info(
                "Asynchronous scheduling: on; decode windows of 1-%d steps, longer while the host's "
                "work a window exceeds the device's (num_scheduler_steps auto)",
                self.sizer.max_steps,
            )
        elif self.num_scheduler_steps > 1:
            logger.info(
                "Multi-step decoding: up to %d decode steps a window, asynchronous scheduling %s",
                self.num_scheduler_steps,
                "on" if self.async_windows else "off",
            )
        elif self.async_windows:
            logger.info("Asynchronous scheduling: on (decode steps launched one ahead of their outputs)")

    def note_arrival(self) -> None:
        """A request was added while sequences decode (it waits for the windows in flight)."""
        self.arrived_while_decoding = time.monotonic()

    def window_steps(self, num_running: int) -> int:
        """The next window's length: num_scheduler_steps, or with auto the sizer's choice, at most
        ARRIVAL_WINDOW_STEPS within ARRIVAL_HOLD_S of a request added while sequences decode while a
        max_num_seqs slot is free (a request that arrives waits for the windows in flight)."""
        sizer = self.sizer
        if sizer is None:
            return self.num_scheduler_steps
        steps = sizer.steps
        if (
            steps > ARRIVAL_WINDOW_STEPS
            and time.monotonic() - self.arrived_while_decoding < ARRIVAL_HOLD_S
            and num_running < self.max_num_seqs
        ):
            return ARRIVAL_WINDOW_STEPS
        return steps

    def plan(
        self, out: SchedulerOutput, requests: dict[str, RequestState], num_running: int
    ) -> tuple[int, bool]:
        """(the most decode steps this scheduled step may run back to back, whether a row samples):
        0 when it runs as one ordinary step (windows off, or not every sequence's next tokens can be
        chosen on the device; a synchronous one-step window is an ordinary step), else
        num_scheduler_steps cut to the longest remaining output (steps past every max_tokens would be
        thrown away)."""
        if not self.enabled:
            return 0, False
        longest = 1
        sampled_rows = False
        top_kind = 2 if self.sampling else 1
        for entry in out.scheduled:
            seq = entry.seq
            req = requests[seq.request_id]
            kind = req.window_kind
            if not 0 < kind <= top_kind or seq.num_output_tokens < req.params.min_tokens:
                return 0, False
            sampled_rows = sampled_rows or kind == 2
            longest = max(longest, req.checkers[seq.index].max_tokens - seq.num_output_tokens)
        steps = min(self.window_steps(num_running), longest)
        if steps == 1 and not self.async_windows:
            return 0, False
        return steps, sampled_rows

    def follow_rows(
        self, window: SchedulerOutput, num_steps: int, requests: dict[str, RequestState]
    ) -> tuple[list[int], int, int, bool]:
        """The rows of `window` (which runs `num_steps` steps) that a follow-on window continues: (those
        rows, how many running sequences the window ends, the longest output left after it, whether a
        kept row samples)."""
        rows: list[int] = []
        ending = 0  # still running, but the window ends them
        longest = 0
        sampled_rows = False
        max_len = self.max_model_len
        for i, entry in enumerate(window.scheduled):
            seq = entry.seq
            if seq.is_finished:  # stopped in the window before this one, or aborted since
                continue
            req = requests[seq.request_id]
            # the tokens left after the window (the counts' properties inline: per sequence and step)
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
        return rows, ending, longest, sampled_rows

    def observe(self, waited_s: float, between_s: float) -> None:
        """One asynchronous window of a chain: seconds the host waited for its ids, seconds since the
        one before it was done (window length auto only)."""
        if self.sizer is not None:
            self.sizer.observe(waited_s, between_s)


def window_slots(num_computed: int, done_steps: int, steps: int, max_model_len: int) -> int:
    """Slots after a sequence's computed tokens for `done_steps` steps already reserved plus `steps`
    more. A sequence stops at max_model_len: its steps past that repeat its last position
    (multi_step.py), so it never needs slots beyond the longest context."""
    return min(done_steps + steps, max_model_len - num_computed)


def steps_that_fit(
    seqs: list[Sequence],
    done_steps: int,
    max_steps: int,
    block_size: int,
    max_model_len: int,
    num_free_blocks: int,
) -> int:
    """The most steps, up to max_steps, whose slots for every sequence fit in the free blocks (0 when
    not even one does)."""
    bs = block_size
    steps = max_steps
    while steps >= 1:
        need = 0
        for s in seqs:  # blocks needed for computed + window_slots, minus the blocks held, inline
            computed = s.num_computed_tokens
            extra = -(-(computed + min(done_steps + steps, max_model_len - computed)) // bs) - len(
                s.block_table
            )
            if extra > 0:
                need += extra
        if need <= num_free_blocks:
            return steps
        steps -= 1
    return 0
