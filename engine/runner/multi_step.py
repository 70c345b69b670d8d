"""Multi-step decoding (`num_scheduler_steps` > 1): the inputs of each step of a decode window.

A window is one pure-decode ForwardBatch (every sequence feeds its last sampled token and samples the
next one) whose block tables already hold slots for `num_steps` tokens per sequence (the scheduler
reserved them). Step k feeds, for every sequence, the token step k - 1 sampled, at position
`positions[i] + k`, into the slot of that position in the sequence's block table, attending to
`context_len[i] + k` tokens. Only the token ids are produced on the device; everything else here is
known on the host before the window starts, so a runner can upload all steps' inputs at once.

`max_position` (the runner's max_model_len - 1): a sequence that reaches the longest context stops
there (its stop check ends it), but the window goes on for the others; its later steps repeat that
last position (same slot, same context), so no step reads or writes past the context the block
tables hold, and the tokens they produce are dropped with the stopped sequence's.

Asynchronous windows (`launch_multi_step`, LLMEngine's async scheduling): a runner launches a window
and returns a `DecodeWindow` at once; the next window may be launched before this one's ids are read,
its step 0 fed this window's last sampled ids on the device (`follow_rows`: which of this window's
rows each of its rows continues). The device runs launches in order, so the next window starts when
this one ends, while the host processes this one's tokens.

Window length chosen by the engine (`num_scheduler_steps` auto, with asynchronous windows on a CUDA
device): window_sizing.WindowSizer.

Plain Python and numpy; `DecodeWindow` only holds the tensors and the event a runner gives it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from llmdeploy_engine.core.forward_batch import ForwardBatch

NO_CAP = 1 << 62


class DecodeWindow:
    """A launched decode window: `sampled` [num_steps, num_seqs] (the device's ids, step by step; a
    following window reads its last row there) and `result()`, the ids as lists. On a CUDA device the
    runner also gives `host`, a pinned copy of `sampled` queued right after the window's last step,
    and `ready`, an event recorded after that copy: `result()` waits for that event only, so it
    returns once this window is done even while windows launched after it still run."""

    def __init__(self, sampled: Any, host: Any = None, ready: Any = None) -> None:
        self.sampled = sampled
        self.num_steps: int = int(sampled.shape[0])
        self._host = sampled if host is None else host
        self._ready = ready
        self._ids: list[list[int]] | None = None

    @property
    def last_ids(self) -> Any:
        """The last step's ids on the device [num_seqs]: the next window's step-0 inputs."""
        return self.sampled[self.num_steps - 1]

    def result(self) -> list[list[int]]:
        """The ids [num_steps][num_seqs]; waits for this window's copy (once)."""
        if self._ids is None:
            if self._ready is not None:
                self._ready.synchronize()
            self._ids = self._host.tolist()
        return self._ids


def check_follow_rows(follow: DecodeWindow | None, follow_rows: list[int] | None, num_seqs: int) -> None:
    """Assert that a window launched after `follow` names, for each of its rows, a row of `follow`."""
    if follow is None:
        assert follow_rows is None, "follow_rows without the window they index"
        return
    assert follow_rows is not None and len(follow_rows) == num_seqs, "one followed row per sequence"
    width = int(follow.sampled.shape[1])
    assert all(0 <= r < width for r in follow_rows), "follow_rows index the followed window's rows"


def check_decode_window(
    batch: ForwardBatch, num_steps: int, block_size: int, max_position: int = NO_CAP
) -> None:
    """Assert that `batch` can run `num_steps` decode steps: one token per sequence, every sequence
    samples, and each block table covers the window's last position (capped at max_position)."""
    assert num_steps >= 1, f"a window has at least one step, got {num_steps}"
    n = batch.num_seqs
    assert all(q == 1 for q in batch.query_len), "multi-step windows are pure decode (one token per sequence)"
    assert batch.sample_indices == list(range(n)) and batch.num_logits is None, "every sequence samples once"
    for pos, table in zip(batch.positions, batch.block_tables, strict=True):
        assert pos <= max_position, "a window starts inside the longest context"
        last = min(pos + num_steps - 1, max_position)
        assert last // block_size < len(table), "the window's slots were not reserved"


def step_batch(batch: ForwardBatch, k: int, block_size: int, max_position: int = NO_CAP) -> ForwardBatch:
    """The host-side inputs of step k of the window (its input ids are those of step 0: the runner
    replaces them with the tokens sampled at step k - 1); positions capped at max_position."""
    if k == 0:
        return batch
    positions = [min(p + k, max_position) for p in batch.positions]
    slots = [
        table[p // block_size] * block_size + p % block_size
        for p, table in zip(positions, batch.block_tables, strict=True)
    ]
    return dataclasses.replace(
        batch,
        positions=positions,
        slot_mapping=slots,
        context_len=[
            c + p - p0 for c, p, p0 in zip(batch.context_len, positions, batch.positions, strict=True)
        ],
    )


def last_step_batch(batch: ForwardBatch, num_steps: int, max_position: int = NO_CAP) -> ForwardBatch:
    """Step num_steps - 1's shape facts (context lengths), enough to pick a CUDA graph bucket."""
    return dataclasses.replace(
        batch,
        context_len=[
            c + min(p + num_steps - 1, max_position) - p
            for c, p in zip(batch.context_len, batch.positions, strict=True)
        ],
    )


def pack_window_steps(
    out: np.ndarray,
    tables: np.ndarray,
    positions0: np.ndarray,
    num_steps: int,
    block_size: int,
    max_position: int = NO_CAP,
) -> None:
    """Positions, slots and context lengths of steps 1..num_steps-1 for a graph of b rows.

    `tables` [b, nb] and `positions0` [b] are step 0's rows as the graph reads them (padding rows
    start at position 0 of the padding block, or repeat row 0 without one); `out` is
    [num_steps - 1, 3, b]: per step, positions (capped at max_position), slots, context lengths
    (position + 1). Slots come from the same tables, so padding rows keep to the padding block (or
    keep writing row 0's slot)."""
    b = tables.shape[0]
    pos = positions0[None, :] + np.arange(1, num_steps, dtype=np.int64)[:, None]  # [num_steps - 1, b]
    np.minimum(pos, max_position, out=pos)
    out[:, 0] = pos
    out[:, 1] = tables[np.arange(b)[None, :], pos // block_size] * block_size + pos % block_size
    out[:, 2] = pos + 1
