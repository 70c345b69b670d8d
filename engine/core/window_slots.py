"""Decode-window slots: the scheduler's half for multi-step decoding and asynchronous windows
(scheduler.py's docstring gives the rules). Plain Python, no torch."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.scheduler_output import SchedulerConfig, SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence


class DecodeWindowSlots:
    """Scheduler's window methods (a mixin: they share its block manager, running list and config)."""

    config: SchedulerConfig
    block_manager: BlockManager
    running: list[Sequence]
    _steps_since_admission: int

    if TYPE_CHECKING:

        def admission_due(self) -> bool: ...

        def _steps_left_before_admission(self) -> int | None: ...

    def reserve_decode_window(self, output: SchedulerOutput, max_steps: int) -> tuple[SchedulerOutput, int]:
        """Multi-step decoding: (the step with slots for `num_steps` tokens per sequence, num_steps).

        num_steps is 0 (not a window: output returned unchanged, to run as an ordinary step) unless
        the step is pure decode (every scheduled sequence feeds one already sampled token and
        samples, no proposals), nothing waits and nothing was preempted; otherwise it is max_steps
        (>= 1) cut to what the free blocks allow (1: step 0's slots, which the step already has). A sequence
        that reaches max_model_len inside the window stops there and gets no slots past it (its later
        steps repeat its last position: multi_step.py), so it does not shorten the others' window.
        The returned batch is step 0's, with the longer block tables."""
        scheduled = output.scheduled
        # schedule() counted this step: due now means due at the next step
        if max_steps < 1 or self.admission_due() or output.preempted or not scheduled:
            return output, 0
        for e in scheduled:
            seq = e.seq
            if e.num_new_tokens != 1 or not e.samples or e.spec_token_ids or seq.num_output_tokens == 0:
                return output, 0
        bm = self.block_manager
        seqs = [e.seq for e in scheduled]
        left = self._steps_left_before_admission()
        if left is not None:  # >= 1 (not due): this step and `left` more, then the waiting join
            max_steps = min(max_steps, 1 + left)
        steps = max(1, self._steps_that_fit(seqs, 0, max_steps))  # step 0's slots are allocated
        self._steps_since_admission += steps - 1
        if steps == 1:
            return output, 1
        # step 0's batch copied every table after this step's slot was allocated: only the tables
        # that grow for the window are copied again
        tables = list(output.batch.block_tables)
        for i, seq in enumerate(seqs):
            had = len(seq.block_table)
            reserved = bm.allocate_slots(seq, self._window_slots(seq, 0, steps))
            assert reserved, "the window's blocks were counted as free"
            if len(seq.block_table) != had:
                tables[i] = list(seq.block_table)
        batch = dataclasses.replace(output.batch, block_tables=tables)
        return SchedulerOutput(scheduled, batch, output.preempted), steps

    def follow_decode_window(
        self, window: SchedulerOutput, done_steps: int, rows: list[int], max_steps: int, ending: int = 0
    ) -> tuple[SchedulerOutput, int] | None:
        """Asynchronous windows: (the decode window that continues `rows` of `window`, its steps), or
        None. `window` ran `done_steps` steps whose tokens are not appended yet; each kept sequence is
        taken to keep them all, so it feeds its window's last token (an unknown id, -1 here: the runner
        gathers it on the device) at position num_computed_tokens + done_steps. `ending` of window's
        sequences are still running but end inside it (max_tokens or the longest context reached:
        they finish when its tokens are processed), so they are not in `rows`. Same rules as
        `reserve_decode_window`: only while nothing waits and every other running sequence is in
        `rows` (a window never skips anyone), cut to the free blocks without preempting, no slots past
        max_model_len. A kept sequence that stops inside `window` has its blocks freed then; the
        device runs the follow-on's writes to them before anything launched later. (Before `ending`,
        every sequence reaching its max_tokens broke the chain: the next window waited for the host,
        ~250 times in a 256-request run of the 8B, 0.6 s of an idle device.)"""
        if not rows or self.admission_due() or len(rows) + ending != len(self.running) or max_steps < 1:
            return None
        bm = self.block_manager
        # a window's entries are all (seq, 1 token, samples, no proposals): the kept ones are reused
        entries = [window.scheduled[i] for i in rows]
        seqs = [e.seq for e in entries]
        left = self._steps_left_before_admission()
        if left is not None:  # >= 1 (not due)
            max_steps = min(max_steps, left)
        steps = self._steps_that_fit(seqs, done_steps, max_steps)
        if steps < 1:
            return None
        self._steps_since_admission += steps
        bs = bm.block_size
        positions: list[int] = []
        slot_mapping: list[int] = []
        tables: list[list[int]] = []
        max_len = self.config.max_model_len
        for seq in seqs:
            computed = seq.num_computed_tokens
            # the sequence's own list, not a copy: the runner packs (or sends) the batch when it
            # launches the window, before anything changes the table again
            table = seq.block_table
            slots = min(done_steps + steps, max_len - computed)  # _window_slots, inline (per sequence)
            if -(-(computed + slots) // bs) > len(table):  # most steps take no new block
                reserved = bm.allocate_slots(seq, slots)
                assert reserved, "the window's blocks were counted as free"
            pos = computed + done_steps
            positions.append(pos)
            slot_mapping.append(table[pos // bs] * bs + pos % bs)
            tables.append(table)
        m = len(seqs)
        batch = ForwardBatch(
            input_ids=[-1] * m,
            positions=positions,
            slot_mapping=slot_mapping,
            query_start=list(range(m)),
            query_len=[1] * m,
            context_len=[p + 1 for p in positions],
            block_tables=tables,
            sample_indices=list(range(m)),
        )
        return SchedulerOutput(entries, batch, []), steps

    def _window_slots(self, seq: Sequence, done_steps: int, steps: int) -> int:
        """Slots after the computed tokens for `done_steps` steps already reserved plus `steps` more.
        A sequence stops at max_model_len: its steps past that repeat its last position
        (multi_step.py), so it never needs slots beyond the longest context."""
        return min(done_steps + steps, self.config.max_model_len - seq.num_computed_tokens)

    def _steps_that_fit(self, seqs: list[Sequence], done_steps: int, max_steps: int) -> int:
        """The most steps, up to max_steps, whose slots for every sequence fit in the free blocks
        (0 when not even one does)."""
        bm = self.block_manager
        bs, max_len = bm.block_size, self.config.max_model_len
        steps = max_steps
        while steps >= 1:
            need = 0
            for s in seqs:  # blocks_needed(computed + _window_slots) - blocks held, inline
                computed = s.num_computed_tokens
                extra = -(-(computed + min(done_steps + steps, max_len - computed)) // bs) - len(
                    s.block_table
                )
                if extra > 0:
                    need += extra
            if need <= bm.num_free_blocks:
                return steps
            steps -= 1
        return 0

    # ---- after the forward pass ---------------------------------------------------------------
