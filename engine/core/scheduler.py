"""Continuous batching with chunked prefill and preemption by recompute.

Plain Python, no torch. Policy: vLLM V1's unified token budget. Each step has
`max_num_batched_tokens` tokens to give. Running sequences are served first, in admission order:
a decoding sequence takes 1 token, a sequence in the middle of a chunked prefill takes the rest of its
prompt (or what is left of the budget). If the block pool cannot hold a running sequence's new tokens,
the most recently admitted running sequence is preempted (its blocks freed, put back at the head of
the waiting queue, recomputed later) until it fits. Then, if nothing was preempted, waiting sequences
join in FCFS order while the budget, `max_num_seqs` and the block pool allow; a prompt longer than
the remaining budget is split into chunks across steps. Finished sequences leave every step.

Speculative decoding: a decoding sequence also feeds the tokens proposed for it
(`Sequence.spec_token_ids`, cut to the budget, dropped rather than preempting anyone) and gets slots
for them (lookahead). Only verified tokens are ever counted as computed or registered in the prefix
cache; `accept_speculative` adds the accepted ones and gives back the rejected lookahead.

Multi-step decoding (`num_scheduler_steps` > 1): after a pure-decode step is scheduled,
`reserve_decode_window` gives every sequence slots for up to N tokens so the runner can run N decode
steps without coming back. Rule: a window only runs while no waiting sequence is due to join
(`admission_due`: nothing waits, or every max_num_seqs slot is taken, or admission_interval has not
come round), so a request never waits for admission because of a window beyond that (a request that
arrives during one waits at most until its end, up to N - 1 steps); the window is cut to end by the
step at which waiting sequences are due, so no sequence passes max_model_len and so its slots fit in
the free blocks (never by preempting anyone), else one step runs as usual.

Admission interval (`admission_interval` N > 1): while sequences decode, waiting sequences join at
most every N scheduled steps (at once when nothing runs), so their prompts share one prefill step;
N = 1 is vLLM's every step.
`follow_decode_window` (asynchronous windows) schedules the next window before the last one's tokens
are known, under the same rules. The engine counts
only the tokens it keeps as computed, so slots past a sequence's stop hold KV that is never
registered in the prefix cache and is freed with the sequence.
"""

from __future__ import annotations

from collections import deque

from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.scheduler_output import ScheduledSeq, SchedulerConfig, SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence, SequenceStatus
from llmdeploy_engine.core.window_slots import follow_window_slots, reserve_window_slots


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        assert config.enable_chunked_prefill or config.max_num_batched_tokens >= config.max_model_len, (
            "without chunked prefill the token budget must hold a whole max_model_len prompt"
        )
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._steps_since_admission = 0  # decode steps scheduled (windows' included) since one joined

    # ---- queue --------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING
        assert seq.num_tokens <= self.config.max_model_len
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> list[Sequence]:
        """Remove every sequence of the request, running or waiting, and free its blocks."""
        aborted = [s for s in (*self.running, *self.waiting) if s.request_id == request_id]
        for seq in aborted:
            self._remove(seq)
            self.block_manager.free(seq)
            seq.status = SequenceStatus.FINISHED_ABORTED
        return aborted

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        assert status.is_finished
        self._remove(seq)
        self.block_manager.free(seq)
        seq.status = status

    def _remove(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)

    # ---- one step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[Sequence] = []

        # running sequences first, preempting the newest when the pool is full
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            spec = seq.spec_token_ids if seq.num_uncomputed_tokens == 1 else []
            seq.spec_token_ids = []
            num_new = min(seq.num_uncomputed_tokens + len(spec), budget)
            spec = spec[: max(0, num_new - seq.num_uncomputed_tokens)]
            if spec and not self.block_manager.can_allocate(seq, num_new):
                num_new, spec = num_new - len(spec), []  # lookahead never costs a preemption
            while not self.block_manager.allocate_slots(seq, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(self._entry(seq, num_new, tuple(spec)))
                budget -= num_new
                i += 1
                continue
            break

        admitted = False
        if not preempted and (self.config.admission_interval <= 1 or self.admission_due()):
            before = len(self.running)
            budget = self._admit_waiting(budget, scheduled)
            admitted = len(self.running) > before
        self._steps_since_admission = 0 if admitted else self._steps_since_admission + 1
        return SchedulerOutput(scheduled, self._build_batch(scheduled), preempted)

    def admission_due(self) -> bool:
        """Whether a waiting sequence may join at the next scheduled step: one waits, a running slot
        is free, and nothing runs or admission_interval - 1 steps have been scheduled since the last
        one joined. A decode window runs only while this is False, and ends by the step at which it
        becomes True; with every slot taken a window may run while requests wait (a slot that frees
        inside it stays empty until it ends)."""
        left = self._steps_left_before_admission()
        return left is not None and (not self.running or left <= 0)

    def _steps_left_before_admission(self) -> int | None:
        """Decode steps that may still be scheduled before waiting sequences are due to join (<= 0:
        due now); None when none could join (nothing waits, or every running slot is taken)."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        return self.config.admission_interval - 1 - self._steps_since_admission

    # ---- decode windows (window_slots.py reserves, under the admission rule here) -----------------
    def reserve_decode_window(self, output: SchedulerOutput, max_steps: int) -> tuple[SchedulerOutput, int]:
        """Multi-step decoding: (the step with slots for `num_steps` tokens per sequence, num_steps);
        0 (not a window) unless the step is pure decode, nothing waits and nothing was preempted; cut
        to the step at which waiting sequences are due and to the free blocks
        (window_slots.reserve_window_slots)."""
        # schedule() counted this step: due now means due at the next step
        if max_steps < 1 or self.admission_due() or output.preempted or not output.scheduled:
            return output, 0
        left = self._steps_left_before_admission()
        if left is not None:  # >= 1 (not due): this step and `left` more, then the waiting join
            max_steps = min(max_steps, 1 + left)
        output, steps = reserve_window_slots(self.block_manager, self.config.max_model_len, output, max_steps)
        if steps > 1:
            self._steps_since_admission += steps - 1
        return output, steps

    def follow_decode_window(
        self, window: SchedulerOutput, done_steps: int, rows: list[int], max_steps: int, ending: int = 0
    ) -> tuple[SchedulerOutput, int] | None:
        """Asynchronous windows: (the decode window that continues `rows` of `window`, its steps), or
        None (window_slots.follow_window_slots). `ending` of window's sequences are still running but
        end inside it (max_tokens or the longest context), so they are not in `rows`. Only while
        nothing waits and every other running sequence is in `rows` (a window never skips anyone),
        cut to the step at which waiting sequences are due. A kept sequence that stops inside
        `window` has its blocks freed then; the device runs the follow-on's writes to them before
        anything launched later. (Before `ending`, every sequence reaching its max_tokens broke the
        chain: the next window waited for the host, ~250 times in a 256-request run of the 8B, 0.6 s
        of an idle device.)"""
        if not rows or self.admission_due() or len(rows) + ending != len(self.running) or max_steps < 1:
            return None
        left = self._steps_left_before_admission()
        if left is not None:  # >= 1 (not due)
            max_steps = min(max_steps, left)
        followed = follow_window_slots(
            self.block_manager, self.config.max_model_len, window, done_steps, rows, max_steps
        )
        if followed is not None:
            self._steps_since_admission += followed[1]
        return followed

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledSeq]) -> int:
        bm = self.block_manager
        skipped: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.waits_for_parent:
                skipped.append(self.waiting.popleft())
                continue
            cached = bm.find_cached_blocks(seq)
            num_new = seq.num_tokens - seq.num_computed_tokens - len(cached) * bm.block_size
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            if not bm.allocate_slots(seq, num_new, cached):
                if self.running or scheduled or not self._release_waiting_blocks(seq):
                    break
                continue  # blocks held by waiting forks were released; try again
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(self._entry(seq, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _release_waiting_blocks(self, keep: Sequence) -> bool:
        """Nothing runs but waiting forks hold blocks the head needs: make them recompute instead."""
        holders = [s for s in self.waiting if s is not keep and s.block_table]
        for seq in holders:
            self.block_manager.free(seq)
        return bool(holders)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    @staticmethod
    def _entry(seq: Sequence, num_new: int, spec: tuple[int, ...] = ()) -> ScheduledSeq:
        samples = seq.num_computed_tokens + num_new - len(spec) == seq.num_tokens
        return ScheduledSeq(seq, num_new, samples, spec)

    def _build_batch(self, scheduled: list[ScheduledSeq]) -> ForwardBatch:
        bs = self.block_manager.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        query_start: list[int] = []
        query_len: list[int] = []
        context_len: list[int] = []
        block_tables: list[list[int]] = []
        sample_indices: list[int] = []
        for idx, entry in enumerate(scheduled):
            seq = entry.seq
            start = seq.num_computed_tokens
            end = start + entry.num_new_tokens
            table = seq.block_table
            query_start.append(len(input_ids))
            query_len.append(entry.num_new_tokens)
            context_len.append(end)
            input_ids.extend(seq.token_ids[start : end - len(entry.spec_token_ids)])
            input_ids.extend(entry.spec_token_ids)
            positions.extend(range(start, end))
            slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            block_tables.append(list(table))
            if entry.samples:
                sample_indices.append(idx)
        return ForwardBatch(
            input_ids,
            positions,
            slot_mapping,
            query_start,
            query_len,
            context_len,
            block_tables,
            sample_indices,
            num_logits=self._num_logits(scheduled),
        )

    @staticmethod
    def _num_logits(scheduled: list[ScheduledSeq]) -> list[int] | None:
        if not any(e.spec_token_ids for e in scheduled):
            return None
        return [1 + len(e.spec_token_ids) for e in scheduled if e.samples]

    def with_proposals(self, output: SchedulerOutput, proposals: dict[int, list[int]]) -> SchedulerOutput:
        """The same step with the given sequences' proposed tokens replaced (a draft model fills them
        in after scheduling, once their slots exist); a proposal may be shorter than scheduled."""
        scheduled = []
        for e in output.scheduled:
            new = proposals.get(e.seq.seq_id)
            if new is not None:
                assert len(new) <= len(e.spec_token_ids), "a proposal may not outgrow its slots"
                e = ScheduledSeq(
                    e.seq, e.num_new_tokens - len(e.spec_token_ids) + len(new), e.samples, tuple(new)
                )
            scheduled.append(e)
        return SchedulerOutput(scheduled, self._build_batch(scheduled), output.preempted)

    def update_computed(self, output: SchedulerOutput) -> None:
        """Mark the step's tokens as cached; register full blocks; fork n > 1 children."""
        bm = self.block_manager
        for entry in output.scheduled:
            seq = entry.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted between schedule and update
            num_verified = entry.num_new_tokens - len(entry.spec_token_ids)
            seq.num_computed_tokens += num_verified
            bm.cache_full_blocks(seq)
            crossed_prompt_end = (
                seq.num_computed_tokens - num_verified < seq.num_prompt_tokens <= seq.num_computed_tokens
            )
            if crossed_prompt_end and seq.index == 0:
                for child in self.waiting:
                    if child.parent is seq:
                        bm.fork(seq, child)
                        child.parent = None

    def accept_speculative(self, seq: Sequence, num_accepted: int) -> None:
        """After verification appended `num_accepted` proposed tokens (plus the target's own token) to a
        running sequence: their KV, written by the verification pass, now counts as computed; slots
        of rejected proposals are given back and get overwritten later."""
        assert seq.status is SequenceStatus.RUNNING
        seq.num_computed_tokens += num_accepted
        assert seq.num_computed_tokens == seq.num_tokens - 1
        self.block_manager.cache_full_blocks(seq)
        self.block_manager.trim(seq, seq.num_tokens)
