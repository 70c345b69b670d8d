"""Decode-window slots: the scheduler's reservations for multi-step decoding and asynchronous windows
(scheduler.py's docstring gives the rules; window_policy.steps_that_fit decides how many steps fit).
Functions of the block manager and the scheduled step; the Scheduler calls them with its own admission
state. Plain Python, no torch."""

from __future__ import annotations

import dataclasses

from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.scheduler_output import SchedulerOutput
from llmdeploy_engine.core.window_policy import steps_that_fit, window_slots


def reserve_window_slots(
    bm: BlockManager, max_model_len: int, output: SchedulerOutput, max_steps: int
) -> tuple[SchedulerOutput, int]:
    """Multi-step decoding: (the step with slots for `num_steps` tokens per sequence, num_steps).

    num_steps is 0 (not a window: output returned unchanged, to run as an ordinary step) unless
    the step is pure decode (every scheduled sequence feeds one already sampled token and samples,
    no proposals); otherwise it is max_steps (>= 1; the caller cut it to the admission rule) cut to
    what the free blocks allow (1: step 0's slots, which the step already has). A sequence that
    reaches max_model_len inside the window stops there and gets no slots past it (its later steps
    repeat its last position: multi_step.py), so it does not shorten the others' window. The
    returned batch is step 0's, with the longer block tables."""
    scheduled = output.scheduled
    for e in scheduled:
        seq = e.seq
        if e.num_new_tokens != 1 or not e.samples or e.spec_token_ids or seq.num_output_tokens == 0:
            return output, 0
    seqs = [e.seq for e in scheduled]
    # step 0's slots are allocated
    steps = max(1, steps_that_fit(seqs, 0, max_steps, bm.block_size, max_model_len, bm.num_free_blocks))
    if steps == 1:
        return output, 1
    # step 0's batch copied every table after this step's slot was allocated: only the tables
    # that grow for the window are copied again
    tables = list(output.batch.block_tables)
    for i, seq in enumerate(seqs):
        had = len(seq.block_table)
        reserved = bm.allocate_slots(seq, window_slots(seq.num_computed_tokens, 0, steps, max_model_len))
        assert reserved, "the window's blocks were counted as free"
        if len(seq.block_table) != had:
            tables[i] = list(seq.block_table)
    batch = dataclasses.replace(output.batch, block_tables=tables)
    return SchedulerOutput(scheduled, batch, output.preempted), steps


def follow_window_slots(
    bm: BlockManager,
    max_model_len: int,
    window: SchedulerOutput,
    done_steps: int,
    rows: list[int],
    max_steps: int,
) -> tuple[SchedulerOutput, int] | None:
    """Asynchronous windows: (the decode window that continues `rows` of `window`, its steps), or
    None when not one step fits the free blocks. `window` ran `done_steps` steps whose tokens are not
    appended yet; each kept sequence is taken to keep them all, so it feeds its window's last token
    (an unknown id, -1 here: the runner gathers it on the device) at position num_computed_tokens +
    done_steps. No slots past max_model_len; never preempts."""
    # a window's entries are all (seq, 1 token, samples, no proposals): the kept ones are reused
    entries = [window.scheduled[i] for i in rows]
    seqs = [e.seq for e in entries]
    bs = bm.block_size
    steps = steps_that_fit(seqs, done_steps, max_steps, bs, max_model_len, bm.num_free_blocks)
    if steps < 1:
        return None
    positions: list[int] = []
    slot_mapping: list[int] = []
    tables: list[list[int]] = []
    for seq in seqs:
        computed = seq.num_computed_tokens
        # the sequence's own list, not a copy: the runner packs (or sends) the batch when it
        # launches the window, before anything changes the table again
        table = seq.block_table
        slots = min(done_steps + steps, max_model_len - computed)  # window_slots, inline (per sequence)
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
